"""What a run did (the record the sampler fills in) and the report made of it, as JSON for people and
for workflows."""

from __future__ import annotations

from dataclasses import dataclass, field

from .experts import ROLES, Wan22Experts
from .schedule import RunSchedule


@dataclass
class StepRecord:
    index: int
    sigma: float  # the sigma the step starts from
    expert: str  # "high" | "low"
    evaluations: int = 1  # transformer evaluations the sampler makes in this step


@dataclass
class RunRecord:
    """The raw material of the report and the timeline, per expert where it says so."""

    split: tuple[int, int]
    steps: list[StepRecord] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=lambda: {r: 0 for r in ROLES})  # transformer calls
    forward_passes: dict[str, int] = field(default_factory=lambda: {r: 0 for r in ROLES})  # prompts in those calls
    seconds: dict[str, float] = field(default_factory=lambda: {r: 0.0 for r in ROLES})
    cache: dict = field(default_factory=dict)  # per cached expert: cache-dit's statistics

    def cached_flags(self) -> list[bool]:
        """Per run step: whether the cache served (one of) its evaluations. cache-dit counts evaluations per
        context, i.e. per expert, so expert-local evaluation indices are mapped back to run steps."""
        flags, local = [], {role: 0 for role in ROLES}
        for step in self.steps:
            stats = self.cache.get(step.expert, {})
            cached = set(stats.get("cached_steps", [])) | set(stats.get("cfg_cached_steps", []))
            first = local[step.expert]
            flags.append(any(e in cached for e in range(first, first + step.evaluations)))
            local[step.expert] += step.evaluations
        return flags


def build_report(experts: Wan22Experts, schedule: RunSchedule, record: RunRecord, *, seed: int,
                 cfg: dict[str, float]) -> dict:
    return {
        "sampler": schedule.sampler,
        "scheduler": schedule.scheduler,
        "steps": schedule.steps,
        "flow_shift": schedule.flow_shift,
        "boundary_ratio": schedule.boundary.ratio,
        "boundary_source": schedule.boundary.source,
        "split": {"high": record.split[0], "low": record.split[1]},
        "sigmas": [round(s, 6) for s in schedule.sigmas],
        "experts": dict(zip(ROLES, experts.sources)),
        "loras": {role: [n.describe() for n in experts.loras if n.role == role] for role in ROLES},
        "seed": int(seed),
        "cfg": {role: float(cfg[role]) for role in ROLES},
        "wall_seconds": {**record.seconds, "total": round(sum(record.seconds.values()), 4)},
        "transformer_calls": dict(record.calls),
        "forward_passes": dict(record.forward_passes),
        "expert_per_step": [s.expert for s in record.steps],
        "cache": {"plan": experts.cache_plan.summary() if experts.cache_plan else None, **record.cache},
    }


def summary_line(report: dict) -> str:
    split, calls, wall = report["split"], report["transformer_calls"], report["wall_seconds"]
    lines = [f"{split['high']} high / {split['low']} low steps ({report['sampler']}/{report['scheduler']}); "
             f"transformer calls {calls['high']} / {calls['low']}; {wall['total']:.1f} s"]
    for role in ROLES:
        loras = report.get("loras", {}).get(role, [])
        if loras:
            lines.append(f"LoRA {role}: " + ", ".join(f"{u['file']} x{u['strength']:g}" for u in loras))
    for role in ROLES:
        stats = report["cache"].get(role)
        if stats and "cached_steps" in stats:
            done, full = stats["block_forwards"], stats["block_forwards_without_cache"]
            line = (f"cache {role}: {len(stats['cached_steps'])} of {stats['evaluations']} steps cached "
                    f"(context sized {stats['evaluations']}), blocks {done}/{full} "
                    f"({100 * (1 - done / full) if full else 0:.0f}% saved)")
            if stats["skippable_steps"] == 0:
                line += f"; {stats['note']}"
            lines.append(line)
    return "\n".join(lines)


BATCHING_WORDS = {"single": "one prompt", "batched": "positive + negative in one call",
                  "separate": "one call per prompt"}


def cache_used_line(report: dict) -> str:
    """What the Cache-DiT node's plan became in this run, per cached expert: cache-dit's config with the CFG
    mode really used, and how the prompts reached the transformer."""
    parts = []
    for role in ROLES:
        stats = report["cache"].get(role)
        if stats and "config" in stats:
            batching = BATCHING_WORDS.get(stats["cfg_batching"], stats["cfg_batching"])
            parts.append(f"{role} {stats['config']} ({batching})")
    return "last run: " + "; ".join(parts)
