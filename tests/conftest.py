"""Shared fixtures: the pack importable as `wan22_cachedit`, tiny checkpoints, a real ComfyUI."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # for `devtools`

from devtools.paths import import_pack  # noqa: E402

import_pack()  # as `wan22_cachedit`: its `nodes` package must not shadow ComfyUI's `nodes`

from devtools import tiny_wan  # noqa: E402

ALL_FORMATS = tiny_wan.SINGLE_FILE_FORMATS
TINY_VAE = "wan_2.1_vae.safetensors"  # named as ComfyUI's repackaged Wan 2.1 VAE


def _write_broken_files(models_dir: str, tiny: dict) -> dict:
    """Files that must be refused: not a Wan transformer, truncated, corrupt, mismatched experts."""
    import torch
    from safetensors.torch import save_file

    dm = os.path.join(models_dir, "diffusion_models")
    names = {}
    save_file({"model.diffusion_model.conv_in.weight": torch.zeros(4, 4, 3, 3),
               "model.diffusion_model.conv_out.weight": torch.zeros(4, 4, 3, 3)},
              os.path.join(dm, "sdxl_unet_like.safetensors"))
    names["not_wan"] = "sdxl_unet_like.safetensors"
    good = os.path.join(dm, tiny["names"][("t2v", "low", "fp16")])
    data = open(good, "rb").read()
    with open(os.path.join(dm, "wan2.2_t2v_low_noise_truncated.safetensors"), "wb") as f:
        f.write(data[: len(data) * 2 // 3])
    names["truncated"] = "wan2.2_t2v_low_noise_truncated.safetensors"
    with open(os.path.join(dm, "wan2.2_t2v_low_noise_corrupt.safetensors"), "wb") as f:
        f.write(data[:8] + b"\x00garbage" + data[16:])
    names["corrupt"] = "wan2.2_t2v_low_noise_corrupt.safetensors"
    tiny_wan.write_single_file(tiny_wan.make_expert("t2v", 7, dim=256), os.path.join(
        dm, "wan2.2_t2v_low_noise_wide.safetensors"), "fp16")
    names["wide"] = "wan2.2_t2v_low_noise_wide.safetensors"
    tiny_wan.write_single_file(tiny_wan.make_expert("t2v", 8, num_layers=2), os.path.join(
        dm, "wan2.2_t2v_low_noise_shallow.safetensors"), "fp16")
    names["shallow"] = "wan2.2_t2v_low_noise_shallow.safetensors"
    tiny_wan.write_single_file(tiny_wan.make_expert("ti2v", 9), os.path.join(dm, "wan2.2_ti2v_5B_fp16.safetensors"),
                               "fp16")
    names["wan_5b"] = "wan2.2_ti2v_5B_fp16.safetensors"
    # A diffusers folder with only the high-noise expert.
    tiny_wan.write_diffusers_folder(os.path.join(models_dir, "diffusers", "Wan2.2-T2V-A14B-high-only"),
                                    tiny["models"][("t2v", "high")], None)
    names["diffusers_high_only"] = "Wan2.2-T2V-A14B-high-only"
    return names


def _write_loras(models_dir: str) -> dict:
    """models/loras: the template's LightX2V names (ComfyUI format), one file per other format people have,
    a LoRA for a wider model, a truncated file and a model file put there by mistake."""
    folder = os.path.join(models_dir, "loras")
    model = tiny_wan.make_expert("t2v", 0)
    names = dict(tiny_wan.LORA_NAMES)
    for role, seed in (("high", 61), ("low", 62)):
        tiny_wan.write_tiny_lora(model, os.path.join(folder, names[role]), "comfy", seed=seed)
    for fmt, seed in (("lightx2v", 63), ("musubi", 64), ("diffusers", 65)):
        names[fmt] = f"wan22_{fmt}_format_lora.safetensors"
        tiny_wan.write_tiny_lora(model, os.path.join(folder, names[fmt]), fmt, seed=seed)
    names["wide"] = "wan2.2_5B_style_lora.safetensors"
    tiny_wan.write_tiny_lora(tiny_wan.make_expert("t2v", 0, dim=256), os.path.join(folder, names["wide"]))
    data = open(os.path.join(folder, names["high"]), "rb").read()
    names["truncated"] = "wan22_truncated_lora.safetensors"
    with open(os.path.join(folder, names["truncated"]), "wb") as f:
        f.write(data[: len(data) // 2])
    names["model_file"] = "wan2.2_t2v_low_noise_14B_fp16_in_loras.safetensors"
    tiny_wan.write_single_file(model, os.path.join(folder, names["model_file"]), "fp16")
    return names


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """A ComfyUI models folder with tiny experts in every format, T2V and I2V, plus broken files."""
    models_dir = str(tmp_path_factory.mktemp("models"))
    tiny = tiny_wan.write_tiny_models(models_dir, formats=ALL_FORMATS, tasks=("t2v", "i2v"))
    tiny["broken"] = _write_broken_files(models_dir, tiny)
    tiny["loras"] = _write_loras(models_dir)
    tiny["dir"] = models_dir
    return tiny


@pytest.fixture(scope="session")
def gguf_experts(tiny_models):
    """The tiny experts also as GGUF files in the models folder, named as the QuantStack GGUF files people use:
    text-to-video in every type of tiny_wan.GGUF_TYPES, image-to-video in Q8_0; {(task, role, type): name}."""
    pytest.importorskip("gguf", reason="the gguf package (requirements-dev.txt) writes the GGUF experts")
    names = {}
    for task, types in (("t2v", tiny_wan.GGUF_TYPES), ("i2v", ("Q8_0",))):
        for role in ("high", "low"):
            for qtype in types:
                name = f"Wan2.2-{task.upper()}-A14B-{role.capitalize()}Noise-{qtype}.gguf"
                tiny_wan.write_gguf(tiny_models["models"][(task, role)],
                                    os.path.join(tiny_models["dir"], "diffusion_models", name), qtype)
                names[(task, role, qtype)] = name
    return names


VARIANT_NAMES = {"fun_inpaint": "wan2.2_fun_inpaint_{role}_noise_14B_fp16.safetensors",
                 "fun_control": "wan2.2_fun_control_{role}_noise_14B_fp16.safetensors",
                 "fun_camera": "wan2.2_fun_camera_{role}_noise_14B_fp16.safetensors",
                 "vace": "wan2.2_fun_vace_{role}_noise_14B_fp16.safetensors"}


@pytest.fixture(scope="session")
def variant_experts(tiny_models):
    """Tiny Wan2.2 A14B variants in the models folder, named as ComfyUI's repackaged files: Fun-InP (the
    image-to-video layout), Fun-Control (52 channels in, a reference embedding), Fun-Camera (the image-to-video
    layout and a camera adapter) and VACE; {(variant, role): name}."""
    names = {}
    for seed, (variant, pattern) in enumerate(VARIANT_NAMES.items(), start=71):
        for role, offset in (("high", 0), ("low", 10)):
            name = pattern.format(role=role)
            path = os.path.join(tiny_models["dir"], "diffusion_models", name)
            task = {"fun_inpaint": "i2v", "fun_control": "fun_control", "fun_camera": "i2v", "vace": "t2v"}[variant]
            model = tiny_wan.make_expert(task, seed + offset)
            if variant == "fun_inpaint":
                tiny_wan.write_single_file(model, path, "fp16")
            else:
                tiny_wan.write_variant(model, path, variant)
            names[(variant, role)] = name
    return names


@pytest.fixture(scope="session")
def comfyui(tmp_path_factory, tiny_models):
    """The pack loaded into a real ComfyUI in this process, with the tiny models in its models folder."""
    from devtools.comfy_inprocess import InProcessComfy

    base = str(tmp_path_factory.mktemp("comfy_base"))
    harness = InProcessComfy(base)
    tiny_wan.write_tiny_wan_vae(os.path.join(tiny_models["dir"], "vae", TINY_VAE))
    tiny_models["broken"]["flux"] = "flux_like_dev.safetensors"  # a MODEL that is not Wan
    tiny_wan.write_tiny_flux(os.path.join(tiny_models["dir"], "diffusion_models", tiny_models["broken"]["flux"]))
    for kind in ("diffusion_models", "diffusers", "loras"):
        harness.folder_paths.add_model_folder_path(kind, os.path.join(tiny_models["dir"], kind), is_default=True)
    harness.folder_paths.add_model_folder_path("vae", os.path.join(tiny_models["dir"], "vae"), is_default=True)
    return harness


def tiny_models_server_base(tmp_path_factory, tiny_models, name: str) -> str:
    base = tmp_path_factory.mktemp(name)
    os.symlink(tiny_models["dir"], base / "models")
    return str(base)


@pytest.fixture(scope="session")
def tiny_models_server(tmp_path_factory, tiny_models):
    """A real ComfyUI server on the tiny models (broken files included): the HTTP tests share it."""
    from devtools.comfy_server import ComfyServer

    with ComfyServer(tiny_models_server_base(tmp_path_factory, tiny_models, "tiny_models_server")) as running:
        yield running


@pytest.fixture(scope="module")
def tiny_models_server_factory(tmp_path_factory, tiny_models):
    """Real ComfyUI servers of a test module's own on the tiny models (for tests that end their process or
    count what it holds), each stopped at the module's end if it still runs."""
    from devtools.comfy_server import ComfyServer

    started = []

    def start(name: str):
        server = ComfyServer(tiny_models_server_base(tmp_path_factory, tiny_models, name)).start()
        started.append(server)
        return server
    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def gguf_server(tmp_path_factory, tiny_models):
    """A real ComfyUI server on the tiny models with ComfyUI-GGUF installed beside the pack (skipped where its
    copy is not there): the live route answers for the node types its server has."""
    from devtools import third_party
    from devtools.comfy_server import ComfyServer

    reason = third_party.missing("gguf")
    if reason:
        pytest.skip(reason)
    base = tiny_models_server_base(tmp_path_factory, tiny_models, "gguf_server")
    third_party.link_into(base, "gguf")
    with ComfyServer(base) as running:
        yield running


@pytest.fixture(scope="session")
def fresh_tiny_models_server(tmp_path_factory, tiny_models):
    """Another one, where no prompt is ever interrupted: what a fresh server gives, for comparison."""
    from devtools.comfy_server import ComfyServer

    with ComfyServer(tiny_models_server_base(tmp_path_factory, tiny_models, "fresh_server")) as running:
        yield running


@pytest.fixture(scope="session")
def standin_base(tmp_path_factory):
    """A ComfyUI base directory with tiny stand-ins for every file the shipped workflows name."""
    from devtools.standins import write_standins

    base = tmp_path_factory.mktemp("standin_base")
    write_standins(str(base / "models"), str(base / "input"))
    return base


@pytest.fixture(scope="session")
def standin_server(standin_base):
    """A real ComfyUI server on the stand-ins, serving the frontend ComfyUI 0.30.0 pins."""
    from devtools.comfy_server import ComfyServer

    with ComfyServer(str(standin_base)) as running:
        yield running


@pytest.fixture(scope="session")
def newest_frontend_server(standin_base, tmp_path_factory):
    """The same, serving the newest frontend on the package registry (devtools/frontends.txt)."""
    from devtools.comfy_server import ComfyServer
    from devtools.paths import newest_frontend

    version, root = newest_frontend()
    if not os.path.isfile(os.path.join(root, "index.html")):
        raise RuntimeError(f"frontend {version} is missing from {root}: run `make setup`")
    base = tmp_path_factory.mktemp("newest_frontend_base")
    for shared in ("models", "input"):
        os.symlink(standin_base / shared, base / shared)
    with ComfyServer(str(base), extra_args=("--front-end-root", root)) as running:
        yield running


@pytest.fixture(scope="session")
def native_text_server(tmp_path_factory):
    """A real ComfyUI server whose umt5 and Wan2.2 VAE stand-ins really run: full size (6.7 GB and 1.4 GB, deleted
    afterwards; see devtools/umt5_standin.py and vae22_standin.py), so every native node of the shipped workflows
    and of ComfyUI's own template runs. One for the whole session: the files are written once, and ComfyUI's cache
    keeps text encodings that several prompts share. Its attention is torch's (--use-pytorch-cross-attention,
    what ComfyUI picks on NVIDIA GPUs): on the CPU ComfyUI picks its sub-quadratic attention, three times slower
    on the as-shipped 640x640 video's 33,600 tokens (make test-slow); every comparison here is within this server."""
    from devtools.comfy_server import ComfyServer
    from devtools.standins import UMT5, VAE22, write_standins

    base = tmp_path_factory.mktemp("native_text_base")
    write_standins(str(base / "models"), str(base / "input"), working_umt5=True, working_vae22=True)
    try:
        with ComfyServer(str(base), extra_args=("--use-pytorch-cross-attention",)) as running:
            yield running
    finally:
        os.remove(base / "models" / "text_encoders" / UMT5)
        os.remove(base / "models" / "vae" / VAE22)


PARALLEL_NAMES = "wan2.2_{task}_{role}_noise_14B_2heads_fp16.safetensors"


@pytest.fixture(scope="session")
def parallel_experts(tiny_models):
    """Tiny experts with two attention heads (dim 256), T2V, I2V and Fun-Camera, and a LoRA for each expert, in the
    models folder: a Ulysses degree of 2 needs heads to split. {(task, role): name, ("lora", role): name}."""
    names = {}
    for seed, (task, role) in enumerate((("t2v", "high"), ("t2v", "low"), ("i2v", "high"), ("i2v", "low")),
                                        start=81):
        name = PARALLEL_NAMES.format(task=task, role=role)
        tiny_wan.write_single_file(tiny_wan.make_expert(task, seed, dim=256, ffn_dim=512),
                                   os.path.join(tiny_models["dir"], "diffusion_models", name), "fp16")
        names[(task, role)] = name
    for seed, role in ((93, "high"), (94, "low")):
        name = PARALLEL_NAMES.format(task="fun_camera", role=role)
        tiny_wan.write_variant(tiny_wan.make_expert("i2v", seed, dim=256, ffn_dim=512),
                               os.path.join(tiny_models["dir"], "diffusion_models", name), "fun_camera")
        names[("fun_camera", role)] = name
    for seed, role in ((91, "high"), (92, "low")):
        name = f"wan22_2heads_{role}_lora.safetensors"
        tiny_wan.write_tiny_lora(tiny_wan.make_expert("t2v", 0, dim=256, ffn_dim=512),
                                 os.path.join(tiny_models["dir"], "loras", name), seed=seed)
        names[("lora", role)] = name
    return names


# --- the fuzz suites (hypothesis) ---
# A test marked `fuzz_examples(bounded, long)` runs twice: with `bounded` generated examples in `make test`,
# and with `long` under the marker `fuzz` (`make test-fuzz`, which CI also runs). Both draw their examples
# from a seed fixed per test (derandomize): a run finds the same cases on every machine, so CI never fails
# on a case an earlier run did not try.
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("wan22", deadline=None, derandomize=True, database=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                 HealthCheck.filter_too_much])
settings.load_profile("wan22")

FUZZ_TALLY: dict[str, dict[str, int]] = {}  # suite -> outcome -> cases, for the summary below


def pytest_generate_tests(metafunc):
    marker = metafunc.definition.get_closest_marker("fuzz_examples")
    if marker is not None:
        bounded, long = marker.args
        metafunc.parametrize("examples", [pytest.param(bounded, id=f"{bounded}-examples"),
                                          pytest.param(long, id=f"{long}-examples", marks=pytest.mark.fuzz)])


@pytest.fixture
def fuzz_tally(request):
    """Counts a fuzz test's cases by outcome (`tally("400")`), printed at the end of the session."""
    counts = FUZZ_TALLY.setdefault(request.node.name, {})

    def tally(outcome: str):
        counts[outcome] = counts.get(outcome, 0) + 1
    return tally


def pytest_terminal_summary(terminalreporter):
    if FUZZ_TALLY:
        terminalreporter.section("fuzz cases")
        for name, counts in FUZZ_TALLY.items():
            outcomes = ", ".join(f"{outcome} {n}" for outcome, n in sorted(counts.items()))
            terminalreporter.write_line(f"{name}: {sum(counts.values())} cases ({outcomes})")
