"""docs/comfyui-upstream.md covers every ComfyUI module the pack imports, and every name it imports from one:
the pack's `comfy.*`, `comfy_api.*` and `comfy_extras.*` imports, read from its source (deferred imports
included), each named on the page (a module as its dotted name or its file, a name in backticks)."""

import ast
import os

from devtools.paths import ROOT

COMFY = ("comfy", "comfy_api", "comfy_extras")


def comfy_imports() -> dict[str, set[str]]:
    """module -> the names imported from it (empty for `import module`), over every file of nodes/."""
    found: dict[str, set[str]] = {}
    for folder, _dirs, files in os.walk(os.path.join(ROOT, "nodes")):
        for name in files:
            if not name.endswith(".py"):
                continue
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.split(".")[0] in COMFY:
                            found.setdefault(alias.name, set())
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                        and node.module.split(".")[0] in COMFY:
                    found.setdefault(node.module, set()).update(alias.name for alias in node.names)
    return found


def named(page: str, module: str) -> bool:
    path = module.replace(".", "/")
    return any(form in page for form in (f"`{module}`", f"{module}.", f"{path}.py", f"{path}/__init__.py"))


def test_the_upstream_page_names_every_comfyui_module_and_name_the_pack_imports():
    with open(os.path.join(ROOT, "docs", "comfyui-upstream.md"), encoding="utf-8") as f:
        page = f.read()
    imports = comfy_imports()
    assert "comfy.samplers" in imports and "comfy_api.latest" in imports  # the scan finds what the pack uses
    missing = sorted(m for m in imports if not named(page, m))
    missing += sorted(f"{m}.{n}" for m, names in imports.items() for n in names if f"`{n}" not in page)
    assert not missing, f"docs/comfyui-upstream.md does not name: {missing}"
