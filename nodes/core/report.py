"""What a run did (the record the sampler fills in) and the report made of it, as JSON for people and
for workflows."""

from __future__ import annotations

from dataclasses import dataclass, field

from .experts import ROLES, Wan22Experts
from .schedule import STAGES, RunSchedule


@dataclass
class StepRecord:
    index: int  # the step's place in the run
    sigma: float  # the sigma the step starts from
    expert: str  # "high" | "low"
    evaluations: int = 1  # transformer evaluations the sampler makes in this step
    stage: str = ""  # "lead" | "high" | "low" ("" : the expert's own stage)

    def __post_init__(self):
        self.stage = self.stage or self.expert


def per_stage(stages, value):
    return {stage: value for stage in stages}


@dataclass
class RunRecord:
    """The raw material of the report and the timeline, per stage ("high", "low", and "lead" when the run has
    a lead stage) where it says so."""

    stages: tuple[str, ...] = ROLES  # the stages of the run, in order
    steps: list[StepRecord] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)  # transformer calls
    forward_passes: dict[str, int] = field(default_factory=dict)  # prompts in those calls
    seconds: dict[str, float] = field(default_factory=dict)
    cache: dict = field(default_factory=dict)  # per cached stage: cache-dit's statistics
    cache_plan: str | None = None  # the cache's settings per expert, in its own words
    compile: dict | None = None  # with torch.compile on the experts: its backend per stage, graphs compiled
    parallel: dict | None = None  # with a parallel plan: the workers, their devices, each rank's figures

    def __post_init__(self):
        # The report always names both experts' stages (0 when one has no steps), and the lead only if run.
        keys = tuple(s for s in STAGES if s in self.stages or s in ROLES)
        self.calls = {**per_stage(keys, 0), **self.calls}
        self.forward_passes = {**per_stage(keys, 0), **self.forward_passes}
        self.seconds = {**per_stage(keys, 0.0), **self.seconds}

    def cached_flags(self) -> list[bool]:
        """Per run step: whether the cache served (one of) its evaluations. cache-dit counts evaluations per
        context, i.e. per stage, so stage-local evaluation indices are mapped back to run steps."""
        flags, local = [], {}
        for step in self.steps:
            stats = self.cache.get(step.stage, {})
            cached = set(stats.get("cached_steps", [])) | set(stats.get("cfg_cached_steps", []))
            first = local.get(step.stage, 0)
            flags.append(any(e in cached for e in range(first, first + step.evaluations)))
            local[step.stage] = first + step.evaluations
        return flags


def build_report(experts: Wan22Experts, schedule: RunSchedule, record: RunRecord, *, seed: int,
                 cfg: dict[str, float]) -> dict:
    report = {
        "sampler": schedule.sampler,
        "scheduler": schedule.scheduler,
        "steps": schedule.steps,
        "flow_shift": schedule.flow_shift,
        "boundary_ratio": schedule.boundary.ratio,
        "boundary_source": schedule.boundary.source,
        "split": {"high": schedule.split[0], "low": schedule.split[1]},
        "sigmas": [round(s, 6) for s in schedule.sigmas],
        "experts": dict(zip(ROLES, experts.sources)),
        "loras": {role: [n.describe() for n in experts.loras if n.role == role] for role in ROLES},
        "seed": int(seed),
        "cfg": {role: float(cfg[role]) for role in ROLES},
        "wall_seconds": {**record.seconds, "total": round(sum(record.seconds.values()), 4)},
        "transformer_calls": dict(record.calls),
        "forward_passes": dict(record.forward_passes),
        "expert_per_step": [s.expert for s in record.steps],
        "cache": {"plan": record.cache_plan, **record.cache},
        "compile": record.compile,
        "parallel": record.parallel,
    }
    lead = schedule.lead
    if lead is not None:
        report["split"] = schedule.stage_split()
        report["stage_per_step"] = [s.stage for s in record.steps]
        report["cfg"]["lead"] = float(lead.cfg)
        report["experts"]["lead"] = lead.source
        report["lead"] = {"steps": lead.steps, "start_step": lead.start_step, "end_step": lead.end_step,
                          "sigmas": [round(s, 6) for s in lead.stage_sigmas()], "hand_off_exact": lead.exact,
                          "hand_off": lead.hand_off()}
    return report


def blocks_saved(stats: dict) -> str:
    """The blocks one cached stage ran against a run without cache, in words."""
    done, full = stats["block_forwards"], stats["block_forwards_without_cache"]
    return f"blocks {done}/{full} ({100 * (1 - done / full) if full else 0:.0f}% saved)"


def summary_line(report: dict) -> str:
    split, calls, wall = report["split"], report["transformer_calls"], report["wall_seconds"]
    stages = [stage for stage in STAGES if stage in split]
    lines = [" / ".join(f"{split[s]} {s}" for s in stages) + f" steps ({report['sampler']}/{report['scheduler']}); "
             f"transformer calls {' / '.join(str(calls.get(s, 0)) for s in stages)}; {wall['total']:.1f} s"]
    if "lead" in report:
        lines.append(f"lead hand-off: {report['lead']['hand_off']}")
    for role in ROLES:
        loras = report.get("loras", {}).get(role, [])
        if loras:
            lines.append(f"LoRA {role}: " + ", ".join(f"{u['file']} x{u['strength']:g}" for u in loras))
    for stage in STAGES:
        stats = report["cache"].get(stage)
        if stats and "cached_steps" in stats:
            line = (f"cache {stage}: {len(stats['cached_steps'])} of {stats['evaluations']} steps cached, "
                    f"{blocks_saved(stats)}")
            if stats["skippable_steps"] == 0 or stats.get("below_smallest_step"):
                line += f"; {stats['note']}"
            lines.append(line)
    return "\n".join(lines)


BATCHING_WORDS = {"single": "one prompt", "batched": "positive + negative in one call",
                  "separate": "one call per prompt"}


def cache_used_line(report: dict) -> str:
    """What the Cache-DiT node's plan became in this run, per cached expert: cache-dit's config with the CFG
    mode really used, and how the prompts reached the transformer."""
    parts = []
    for stage in STAGES:
        stats = report["cache"].get(stage)
        if stats and "config" in stats:
            batching = BATCHING_WORDS.get(stats["cfg_batching"], stats["cfg_batching"])
            parts.append(f"{stage} {stats['config']} ({batching})")
    return "last run: " + "; ".join(parts)
