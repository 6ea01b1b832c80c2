"""The third-party packs that Wan2.2 users run beside ours (ComfyUI-GGUF, KJNodes), for interop tests, and the
peers the quality benchmark compares against (ComfyUI-Spectrum-WAN-Proper, bench/peers.py).

They are not dependencies of the pack and are never committed, here or anywhere: the tests take unmodified
copies from the folder `WAN22_THIRD_PARTY` names (outside the clone; docs/testing.md says how to fetch them),
link them into the test ComfyUI's custom_nodes and load them as ComfyUI loads any custom node. Where the
variable is not set or a copy is not there, the tests that need it are skipped and say why (so in CI)."""

from __future__ import annotations

import os


FOLDER = os.environ.get("WAN22_THIRD_PARTY", "")
PACKS = {"gguf": ("ComfyUI-GGUF", "UnetLoaderGGUF"), "kjnodes": ("ComfyUI-KJNodes", "PathchSageAttentionKJ"),
         "spectrum": ("ComfyUI-Spectrum-WAN-Proper", "SpectrumApplyWAN")}


def missing(pack: str) -> str | None:
    """Why `pack` cannot be loaded here (None when it can)."""
    folder, _ = PACKS[pack]
    if not FOLDER:
        return f"WAN22_THIRD_PARTY is not set: it names a folder holding an unmodified {folder} (docs/testing.md)"
    path = os.path.join(FOLDER, folder)
    if not os.path.isfile(os.path.join(path, "__init__.py")):
        return f"{folder} is not at {path} (set WAN22_THIRD_PARTY to a folder holding an unmodified copy)"
    if pack == "gguf":
        try:
            import gguf  # noqa: F401
        except ImportError:
            return "the gguf package is not installed (requirements-dev.txt)"
    return None


def link_into(base_dir: str, pack: str) -> str:
    """Links `pack` into the custom_nodes of a ComfyUI base directory (a server started on it loads it)."""
    folder, _ = PACKS[pack]
    link = os.path.join(base_dir, "custom_nodes", folder)
    if not os.path.islink(link):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.join(FOLDER, folder), link)
    return link


def load(harness, pack: str) -> None:
    """Links `pack` into the in-process ComfyUI's custom_nodes and loads it there (once per process)."""
    import nodes

    folder, node_id = PACKS[pack]
    if node_id in nodes.NODE_CLASS_MAPPINGS:
        return
    link = link_into(harness.base_dir, pack)
    if not harness.loop.run_until_complete(nodes.load_custom_node(link, module_parent="custom_nodes")):
        raise RuntimeError(f"ComfyUI could not load {folder} from {link}")
    if node_id not in nodes.NODE_CLASS_MAPPINGS:
        raise RuntimeError(f"{folder} loaded without its {node_id} node")
