"""Fixtures of the in-process ComfyUI tests."""

import os

import pytest


class ProgressHooks(list):
    """Callables `hook(value, total, node_id)` called at every progress update of a run, as ComfyUI's server
    hook is called (and where a cancel lands), unthrottled. `failing_at(node, call)` is one that raises an
    error at the `call`-th progress update of a node, as a node failing in the middle of its work would."""

    @staticmethod
    def failing_at(node_id: str, call: int, error=RuntimeError("a failure in the middle of the run")):
        seen = []

        def hook(value, total, node):
            if node == node_id:
                seen.append(value)
                if len(seen) == call:
                    raise error
        return hook


@pytest.fixture
def progress_hook(monkeypatch):
    import comfy.utils
    from comfy_execution.utils import get_executing_context

    hooks = ProgressHooks()

    def call_hooks(value, total, *args, **kwargs):
        context = get_executing_context()
        for hook in list(hooks):
            hook(value, total, context.node_id if context is not None else None)

    monkeypatch.setattr(comfy.utils, "PROGRESS_THROTTLE_MIN_INTERVAL", 0.0)
    comfy.utils.set_progress_bar_global_hook(call_hooks)
    yield hooks
    comfy.utils.set_progress_bar_global_hook(None)


def third_party_pack(comfyui, pack):
    from devtools import third_party

    reason = third_party.missing(pack)
    if reason:
        pytest.skip(reason)
    third_party.load(comfyui, pack)
    return comfyui


@pytest.fixture
def gguf_comfyui(comfyui):
    """The in-process ComfyUI with ComfyUI-GGUF loaded too (skipped where its copy is not there)."""
    return third_party_pack(comfyui, "gguf")


@pytest.fixture
def kj_comfyui(comfyui):
    """The in-process ComfyUI with KJNodes loaded too (skipped where its copy is not there)."""
    return third_party_pack(comfyui, "kjnodes")


@pytest.fixture
def probe_nodes(comfyui, monkeypatch):
    """The test-only patching nodes of probe_nodes.py registered in the in-process ComfyUI; their records."""
    import nodes

    from . import probe_nodes as probes

    for name, node in probes.NODES.items():
        monkeypatch.setitem(nodes.NODE_CLASS_MAPPINGS, name, node)
    for calls in probes.RECORDED.values():
        calls.clear()
    return probes.RECORDED


@pytest.fixture
def start_image(comfyui):
    """The start image of the image-to-video runs (prompts.with_start_image), in ComfyUI's input folder."""
    import numpy as np
    from PIL import Image

    path = os.path.join(comfyui.folder_paths.get_input_directory(), "wan22_start.png")
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(path)
    return path


@pytest.fixture
def image(comfyui):
    """A random 64 x 64 image in ComfyUI's input folder, for the variants' conditioning nodes: its name."""
    import numpy as np
    from PIL import Image

    path = os.path.join(comfyui.folder_paths.get_input_directory(), "wan22_variant.png")
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(path)
    return "wan22_variant.png"
