"""The one place that runs a stage list, below every node that runs one (the sampler, the error budget's
calibration): it chooses this process (engine.sample) or the parallel plan's workers, and applies the release
policy, so that every caller gets the same: a run without a plan releases the warm workers of an earlier one."""

from __future__ import annotations

from . import engine
from .parallel import registry, sampling
from .types import ScheduleHandle


def run(experts, handle: ScheduleHandle, positive, negative, latent: dict, seed: int, cfg: dict):
    """The run in this process, or, with a parallel plan on the experts, on the plan's workers
    (parallel/sampling.py, each worker running engine.sample on its share): (LATENT, run record). The
    stages are planned here first, so that what the run refuses is refused before any worker starts."""
    schedule, lead_model = handle.schedule, handle.lead_model
    if experts.parallel_plan is None:
        registry.release()  # the warm workers of an earlier run with a plan are not kept
        return engine.sample(experts, schedule, positive, negative, latent, seed, cfg, lead_model=lead_model)
    engine.plan_stages(experts, schedule, cfg, lead_model)
    return sampling.sample_on_workers(experts, schedule, lead_model, positive, negative, latent, seed, cfg)
