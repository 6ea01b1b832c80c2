"""One run on the parallel plan's workers (dispatch.py calls it for a run with a plan): refused before any
worker starts where a worker could not rebuild what the run carries, then sent to the warm pool (registry.py).

What crosses to the workers is small: each expert's loader factory (ComfyUI's `cached_patcher_init`: the file
and its options, rebuild.model_spec), the run's weight patches (LoRAs), the schedule, the conditioning and the
latent. The experts' weights never do: each worker loads them itself.
"""

from __future__ import annotations

from ..core import parallel as core
from ..core.errors import Wan22InputError
from .rebuild import model_spec
from .registry import pool_for

# Conditioning entries that carry models or Python objects of their own, which a worker cannot rebuild.
WORKERLESS_CONDITIONING = ("control", "hooks", "gligen")


def sample_on_workers(experts, schedule, lead_model, positive, negative, latent: dict, seed: int, cfg: dict):
    """The run on the plan's workers: rank 0's LATENT, and its record with each rank's figures. The MODELs
    (the experts', the lead's) go as what each worker loads again (model_spec)."""
    plan = experts.parallel_plan
    core.check_sequence(core.latent_tokens(latent["samples"].shape), plan.ulysses_degree)
    for name, conditioning in (("positive", positive), ("negative", negative)):
        carried = sorted({key for _, entry in conditioning for key in WORKERLESS_CONDITIONING if entry.get(key)})
        if carried:
            raise Wan22InputError(name, f"carries {', '.join(carried)} (a ControlNet, hooks or GLIGEN node), which "
                                        "the workers cannot run: remove that node, or run without the parallel plan")
    stage_cfg = {**cfg, **({"lead": schedule.lead.cfg} if schedule.lead is not None else {})}
    if experts.cache_plan is not None:
        core.refuse_calibrator(plan, experts.cache_plan.calibrator, stage_cfg)
    specs = {role: model_spec(model, role) for role, model in experts.models().items()}
    job = {"experts": experts.replace(high=None, low=None, parallel_plan=None), "specs": specs,
           "lead": model_spec(lead_model, "lead") if lead_model is not None else None, "schedule": schedule,
           "splits": {stage: plan.stage_split(value) for stage, value in stage_cfg.items()},
           "positive": positive, "negative": negative, "latent": latent, "seed": int(seed), "cfg": dict(cfg)}
    ranks = pool_for(plan).run(job)
    record = ranks[0]["record"]
    record.parallel = core.parallel_report(plan, ranks)
    return ranks[0]["latent"], record
