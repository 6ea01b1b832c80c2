"""A real ComfyUI loaded in this process, running API-format prompts without a server socket.

Import order matters: ComfyUI's CLI args must be set before anything imports `comfy.model_management`,
and `utils.extra_config`, `execution` and `server` must come before `nodes` (which puts `comfy/` on
sys.path, after which `import utils` would find `comfy/utils.py`).
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from dataclasses import dataclass, field

from .paths import COMFYUI_DIR, PACK_NAME, make_base_directory


@dataclass
class PromptResult:
    valid: bool
    error: dict | None = None
    node_errors: dict = field(default_factory=dict)  # also on a valid prompt: the outputs that were left out
    success: bool = False
    outputs: dict = field(default_factory=dict)  # node id -> ui dict, as /history shows it
    messages: list = field(default_factory=list)

    def node_error_details(self, node_id: str) -> list[str]:
        return [f'{e.get("message", "")}: {e.get("details", "")}'
                for e in self.node_errors.get(node_id, {}).get("errors", [])]

    def execution_error(self) -> dict | None:
        for event, data in self.messages:
            if event == "execution_error":
                return data
        return None


class InProcessComfy:
    def __init__(self, base_dir: str, cpu: bool = True, highvram: bool = False):
        self.base_dir = make_base_directory(base_dir)
        # ComfyUI first on the path: the checkout's own `nodes/` package must not shadow ComfyUI's nodes.py.
        if COMFYUI_DIR in sys.path:
            sys.path.remove(COMFYUI_DIR)
        sys.path.insert(0, COMFYUI_DIR)
        from comfy.cli_args import args
        args.cpu = cpu
        args.highvram = highvram  # keep models on the GPU (the GPU benchmark, where both experts fit)
        args.base_directory = self.base_dir
        import utils.extra_config  # noqa: F401  (before `nodes`, see above)
        import execution
        import server
        import folder_paths
        import nodes

        folder_paths.set_output_directory(os.path.join(self.base_dir, "output"))
        folder_paths.set_temp_directory(os.path.join(self.base_dir, "temp"))
        folder_paths.set_input_directory(os.path.join(self.base_dir, "input"))
        for kind in ("diffusion_models", "diffusers", "vae", "text_encoders", "loras"):
            folder = os.path.join(self.base_dir, "models", kind)
            os.makedirs(folder, exist_ok=True)
            folder_paths.add_model_folder_path(kind, folder, is_default=True)
        self.execution, self.nodes, self.folder_paths = execution, nodes, folder_paths
        self.loop = asyncio.new_event_loop()
        self.server = server.PromptServer(self.loop)
        self.loop.run_until_complete(nodes.init_extra_nodes(init_custom_nodes=False, init_api_nodes=False))
        pack_dir = os.path.join(self.base_dir, "custom_nodes", PACK_NAME)
        if not self.loop.run_until_complete(nodes.load_custom_node(pack_dir, module_parent="custom_nodes")):
            raise RuntimeError("ComfyUI could not load the pack")
        self.pack_module = sys.modules[pack_dir.replace(".", "_x_")]
        self.executor = self.new_executor()

    def new_executor(self):
        return self.execution.PromptExecutor(self.server, cache_type=self.execution.CacheType.CLASSIC,
                                             cache_args={"lru": 0, "ram": 0, "ram_inactive": 0})

    def pack(self, module: str):
        """A module of the pack as ComfyUI loaded it (e.g. 'nodes.core.experts')."""
        return sys.modules[f"{self.pack_module.__name__}.{module}"]

    def worker_pids(self) -> list[int]:
        """The process ids of the parallel plan's warm workers (none when released), read as the pack's pool
        keeps them, under its lock: for the tests and the benchmarks (the pack itself never asks)."""
        registry = self.pack("nodes.parallel.registry")
        with registry._LOCK:
            return list(registry._POOL.pids) if registry._POOL is not None else []

    def run(self, prompt: dict, executor=None) -> PromptResult:
        """Validates and executes an API-format prompt, as POST /prompt would."""
        executor = executor or self.executor
        self.folder_paths.filename_list_cache.clear()  # files written by a test since the last prompt
        prompt_id = uuid.uuid4().hex
        valid = self.loop.run_until_complete(self.execution.validate_prompt(prompt_id, prompt, None))
        if not valid[0]:
            return PromptResult(valid=False, error=valid[1], node_errors=valid[3])
        executor.execute(prompt, prompt_id, extra_data={}, execute_outputs=valid[2])
        outputs = executor.history_result.get("outputs", {}) if executor.success else {}
        return PromptResult(valid=True, success=executor.success, outputs=outputs, node_errors=valid[3],
                            messages=list(executor.status_messages))

    def cached_output(self, node_id: str, executor=None):
        """The objects a node returned in the last run (ComfyUI hands these to every consumer)."""
        executor = executor or self.executor
        entry = executor.caches.outputs.get_local(node_id)
        return None if entry is None else entry.outputs
