"""The V3 extension: the list of the pack's nodes."""

from comfy_api.latest import ComfyExtension, io

from .bridge_nodes import Wan22ExpertsFromModel
from .budget_nodes import Wan22CacheBudget
from .cache_nodes import Wan22CacheDiT, Wan22CacheDiTModel
from .loader_nodes import Wan22DiffusersExpertLoader, Wan22ExpertLoader
from .lora_nodes import Wan22LoraLoader
from .parallel_nodes import Wan22ParallelPlan
from .sampler_nodes import Wan22TwoStageSampler
from .schedule_nodes import Wan22LeadStage, Wan22Schedule
from .text_nodes import Wan22TextEncode


class Wan22CacheDiTExtension(ComfyExtension):
    async def on_load(self) -> None:
        from . import routes  # noqa: F401  (routes registers the live-split route on ComfyUI's server)
        from .parallel import registry

        registry.release_on_termination()  # SIGTERM of ComfyUI stops the parallel plan's workers too

    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return [Wan22ExpertLoader, Wan22DiffusersExpertLoader, Wan22ExpertsFromModel, Wan22LoraLoader, Wan22Schedule,
                Wan22LeadStage, Wan22CacheDiT, Wan22CacheDiTModel, Wan22CacheBudget, Wan22TextEncode,
                Wan22TwoStageSampler, Wan22ParallelPlan]
