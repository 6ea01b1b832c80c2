"""The pack's shape: importable outside ComfyUI, a core that never imports ComfyUI, honest packaging."""

import ast
import os
import subprocess
import sys
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMFY_MODULES = {"comfy", "comfy_api", "comfy_extras", "folder_paths", "nodes", "server", "execution"}


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=300)


def test_the_package_imports_outside_comfyui():
    code = f"""
import inspect, sys
sys.path.insert(0, {ROOT!r})
from devtools.paths import import_pack
pack = import_pack("pack")
assert inspect.iscoroutinefunction(pack.comfy_entrypoint)
print(pack.WEB_DIRECTORY)
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert os.path.isdir(os.path.join(ROOT, result.stdout.strip()))


def test_the_core_never_imports_comfyui():
    core = os.path.join(ROOT, "nodes", "core")
    modules = sorted(f[:-3] for f in os.listdir(core) if f.endswith(".py") and f != "__init__.py")
    code = f"""
import importlib, sys
sys.path.insert(0, {ROOT!r})
from devtools.paths import import_pack
import_pack("pack")
for m in {modules!r}:
    importlib.import_module("pack.nodes.core." + m)
print(sorted(set(sys.modules) & {COMFY_MODULES!r}))
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    for name in modules:  # and not by a lazy import hidden in a function either
        tree = ast.parse(open(os.path.join(core, name + ".py"), encoding="utf-8").read())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                     and n.level == 0}
        assert not imported & COMFY_MODULES, name


def test_pyproject_carries_what_the_registry_and_comfyui_read():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        config = tomllib.load(f)
    project, comfy = config["project"], config["tool"]["comfy"]
    assert project["name"] == "wan22-cachedit"
    major, minor, patch = project["version"].split(".")
    assert all(part.isdigit() for part in (major, minor, patch))
    assert os.path.isfile(os.path.join(ROOT, project["license"]["file"]))
    assert comfy["DisplayName"] == "Wan2.2 Cache-DiT" and comfy["PublisherId"] and comfy["requires-comfyui"]


def requirement_names(lines) -> dict:
    """name -> version specifier of requirement lines (comments and blanks dropped)."""
    import re

    out = {}
    for line in lines:
        line = line.split("#")[0].strip()
        if line:
            name, spec = re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", line).groups()
            out[name.lower()] = spec.replace(" ", "")
    return out


def test_requirements_state_lower_bounds_leave_torch_to_comfyui_and_match_pyproject():
    requirements = requirement_names(open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8"))
    assert {"cache-dit", "diffusers", "safetensors"} <= set(requirements)
    assert not set(requirements) & {"torch", "torchvision", "torchaudio"}
    assert not [spec for spec in requirements.values() if "==" in spec]  # exact pins live in constraints.txt
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        assert requirement_names(tomllib.load(f)["project"]["dependencies"]) == requirements
    pins = requirement_names(open(os.path.join(ROOT, "devtools", "constraints.txt"), encoding="utf-8"))
    assert all(pins[name].startswith("==") for name in ("cache-dit", "diffusers", "torch"))


def test_the_layout_is_the_one_the_design_fixes():
    for path in ("__init__.py", "nodes", "nodes/core", "web", "tests", "example_workflows", "requirements.txt",
                 "pyproject.toml", "README.md", "Makefile", ".ci/run", ".gitignore"):
        assert os.path.exists(os.path.join(ROOT, path)), path
    ignored = open(os.path.join(ROOT, ".gitignore"), encoding="utf-8").read().split()
    assert "/.venv/" in ignored and "/.comfyui/" in ignored


def test_every_node_has_a_help_page():
    import re
    sources = "".join(open(os.path.join(ROOT, "nodes", f), encoding="utf-8").read()
                      for f in os.listdir(os.path.join(ROOT, "nodes")) if f.endswith(".py"))
    node_ids = set(re.findall(r'node_id="(\w+)"', sources))
    assert len(node_ids) >= 6
    for node_id in node_ids:
        page = os.path.join(ROOT, "web", "docs", f"{node_id}.md")
        assert os.path.isfile(page) and open(page, encoding="utf-8").read().startswith("# "), node_id


PACK_SOURCES = [os.path.join(ROOT, "__init__.py")] + [
    os.path.join(d, f) for d, _, files in os.walk(os.path.join(ROOT, "nodes")) for f in files if f.endswith(".py")]
NETWORK_MODULES = {"socket", "urllib", "requests", "httpx", "http", "ftplib", "smtplib", "huggingface_hub"}
# None, the parallel plan included: its workers meet through a Ray actor, not a socket of the pack's own.
NETWORK_ALLOWED: dict = {}


def test_the_pack_never_touches_the_network_nor_runs_code_from_strings_or_pickles():
    for path in PACK_SOURCES:
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("eval", "exec", "compile", "__import__"), f"{path}:{node.lineno}"
            if isinstance(node, ast.Attribute):
                assert not (node.attr == "load" and getattr(node.value, "id", "") in ("torch", "pickle")), \
                    f"{path}:{node.lineno}"
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for name in names:
                    forbidden = (NETWORK_MODULES - NETWORK_ALLOWED.get(path, set())) | {"pickle"}
                    assert name.split(".")[0] not in forbidden, f"{path}:{node.lineno} {name}"


def test_the_suite_runs_with_only_loopback():
    if os.environ.get("WAN22_OFFLINE") != "1":
        pytest.skip("not inside devtools/offline.sh's network namespace (make test runs the suite there)")
    # this network namespace's interfaces (sysfs may show the host's)
    with open("/proc/net/dev", encoding="utf-8") as f:
        interfaces = [line.split(":")[0].strip() for line in f.readlines()[2:]]
    assert interfaces == ["lo"]


def test_the_registrys_archive_holds_what_a_user_needs_and_not_the_tests(tmp_path, monkeypatch):
    """`comfy node pack` (comfy-cli's own packer: git-tracked files minus .comfyignore) gives the nodes, the
    frontend, the workflows and the docs, and none of tests/, devtools/ or bench/."""
    import zipfile

    file_utils = pytest.importorskip("comfy_cli.file_utils", reason="comfy-cli (requirements-dev.txt)")
    if subprocess.run(["git", "-C", ROOT, "rev-parse"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout: the packer archives git-tracked files")
    monkeypatch.chdir(ROOT)
    archive = tmp_path / "node.zip"
    file_utils.zip_files(str(archive))
    names = zipfile.ZipFile(archive).namelist()
    tops = {name.split("/")[0] for name in names}
    assert not tops & {"tests", "devtools", "bench", ".ci"}, sorted(tops)
    for needed in ("__init__.py", "pyproject.toml", "requirements.txt", "README.md", "LICENSE",
                   "nodes/core/budget.py", "nodes/parallel/driver.py", "web/js/wan22.js"):
        assert needed in names, needed
    assert any(n.startswith("example_workflows/") and n.endswith(".json") for n in names)
    assert any(n.startswith("web/docs/") for n in names)


def test_every_file_opened_as_text_says_its_encoding():
    """open() in text mode without an encoding reads the platform's (cp1252 on Windows): every one in the
    repository names it (binary modes need none)."""
    missing = []
    sources = PACK_SOURCES + [os.path.join(d, f) for top in ("devtools", "bench", "tests")
                              for d, _, files in os.walk(os.path.join(ROOT, top)) for f in files if f.endswith(".py")]
    for path in sources:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open"):
                continue
            mode = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "mode"), None)
            binary = isinstance(mode, ast.Constant) and "b" in str(mode.value)
            if not binary and not any(k.arg == "encoding" for k in node.keywords):
                missing.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
    assert missing == [], missing


def imports_of(path: str) -> set[str]:
    """The modules a source imports, at its top or deferred in a function, relative ones as written (".x")."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            found |= {base} | {f"{base}.{a.name}" if node.module else f"{base}{a.name}" for a in node.names}
    return found


def module_graph() -> dict:
    """The pack's, bench/'s and devtools/' modules (dotted names from the repository's root) and those of them
    each imports, at its top or deferred in a function; the pack's own name ComfyUI gives it left out."""
    paths = {}
    for top in ("nodes", "bench", "devtools"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    name = os.path.relpath(os.path.join(d, f), ROOT)[:-3].replace(os.sep, ".")
                    paths[name.removesuffix(".__init__")] = os.path.join(d, f)
    graph = {}
    for name, path in paths.items():
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        found = set()
        for written in imports_of(path):
            dots = len(written) - len(written.lstrip("."))
            if dots:
                base = package.rsplit(".", dots - 1)[0] if dots > 1 else package
                written = f"{base}.{written[dots:]}".rstrip(".")
            for candidate in (written, written.rpartition(".")[0]):
                if candidate in paths and candidate != name:
                    found.add(candidate)
                    break
        graph[name] = found
    return graph


def test_no_module_imports_itself_back_and_devtools_never_imports_bench():
    """The import graph of nodes/, bench/ and devtools/, deferred imports included, has no cycle (a module
    reaches itself through none of its imports), and devtools/ (set-up, harnesses, the beds) never imports bench/
    (which uses them)."""
    graph = module_graph()
    assert {"nodes.engine", "devtools.testbed", "devtools.bed_runs", "bench.quality"} <= set(graph)
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            name = todo.pop()
            assert name != start, f"{start} imports itself back (through {sorted(seen)})"
            if name not in seen:
                seen.add(name)
                todo += graph[name]
    assert [n for n in graph if n.startswith("devtools.") and any(m.startswith("bench") for m in graph[n])] == []


# nodes/parallel/'s modules, each importing only those before it (its __init__ says each one's job).
PARALLEL_LAYERS = ["gate", "auth", "actor", "driver", "rebuild", "sequence", "worker", "launch", "pool", "registry",
                   "sampling"]


def test_the_parallel_packages_rooms_import_only_the_rooms_below_them_and_ray_auth_is_asked_in_one():
    """No import in nodes/parallel/ points back up its layers (a deferred one neither), every module is in the
    list, and only auth.py asks Ray about its authentication (ray._raylet)."""
    folder = os.path.join(ROOT, "nodes", "parallel")
    modules = sorted(f[:-3] for f in os.listdir(folder) if f.endswith(".py") and f != "__init__.py")
    assert modules == sorted(PARALLEL_LAYERS)
    for index, module in enumerate(PARALLEL_LAYERS):
        path = os.path.join(folder, f"{module}.py")
        used = {m[1:].split(".")[0] for m in imports_of(path) if m.startswith(".") and not m.startswith("..")}
        above = sorted((used & set(modules)) - set(PARALLEL_LAYERS[:index]))
        assert above == [], f"nodes/parallel/{module}.py imports {above}, above it"
        raylet = "ray._raylet" in open(path, encoding="utf-8").read()
        assert raylet == (module == "auth"), f"nodes/parallel/{module}.py and ray._raylet"


def test_the_parallel_package_is_one_room_that_the_engine_never_enters():
    """Only dispatch.py (the choice between one process and the workers), the extension (its exit
    handlers) and the plan's node import nodes/parallel/; the one-process engine, and everything else outside
    the package, never does, at the top or deferred. The package's worker imports the engine, so there is no
    cycle."""
    nodes_dir = os.path.join(ROOT, "nodes")
    allowed = {"dispatch.py", "extension.py", "parallel_nodes.py"}
    assert os.path.isfile(os.path.join(nodes_dir, "parallel", "__init__.py"))
    assert not [f for f in os.listdir(nodes_dir) if (f.startswith("parallel_") and f != "parallel_nodes.py")
                or f == "sequence_parallel.py"], "the parallel code lives in nodes/parallel/"
    for d, _, files in os.walk(nodes_dir):
        if os.path.basename(d) == "parallel":
            continue
        for f in files:
            if not f.endswith(".py") or (d == nodes_dir and f in allowed):
                continue
            depth = 0 if d == nodes_dir else len(os.path.relpath(d, nodes_dir).split(os.sep))
            dots = "." * (1 + depth)  # a relative import of nodes/parallel from this folder
            into = [m for m in imports_of(os.path.join(d, f)) if m.startswith(f"{dots}parallel")
                    and not m.startswith(f"{dots}parallel_nodes")]
            assert into == [], f"{os.path.relpath(os.path.join(d, f), ROOT)} imports {into}"
    assert "..engine" in imports_of(os.path.join(nodes_dir, "parallel", "worker.py"))  # a worker runs the engine


# The third-party packs' folder names and file names no file of ours has (devtools/third_party.py).
THIRD_PARTY_NAMES = {"ComfyUI-GGUF", "dequant.py", "dequant_triton.py", "UnetLoaderGGUF.md", "ComfyUI-KJNodes",
                     "model_optimization_nodes.py", "ComfyUI-Spectrum-WAN-Proper", "comfyui_spectrum_wan"}


def test_no_tracked_path_carries_a_third_party_packs_files():
    """ComfyUI-GGUF, KJNodes and Spectrum-WAN are fetched into a folder outside the clone (WAN22_THIRD_PARTY),
    never committed: no part of a tracked path is one of their folder or file names."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    paths = [p for p in tracked.stdout.split("\0") if p]
    assert len(paths) > 100
    assert [p for p in paths if THIRD_PARTY_NAMES & set(p.split("/"))] == []
