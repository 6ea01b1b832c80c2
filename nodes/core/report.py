"""The run report: what the run did, as JSON for people and for workflows."""

from __future__ import annotations

from .denoise import RunRecord
from .experts import Wan22Experts
from .schedule import Wan22Schedule


def build_report(experts: Wan22Experts, schedule: Wan22Schedule, record: RunRecord, *, seed: int,
                 cfg_high: float, cfg_low: float, device_moves: list | None = None) -> dict:
    stage = record.stage_seconds()
    return {
        "sampler": schedule.sampler,
        "steps": schedule.steps,
        "flow_shift": schedule.flow_shift,
        "boundary_ratio": schedule.boundary.ratio,
        "boundary_source": schedule.boundary.source,
        "split": {"high": record.split[0], "low": record.split[1]},
        "experts": {"high": experts.sources[0], "low": experts.sources[1]},
        "loras": {role: [use.describe() for use in experts.loras if use.role == role] for role in ("high", "low")},
        "seed": int(seed),
        "cfg": {"high": float(cfg_high), "low": float(cfg_low)},
        "wall_seconds": {"high": stage["high"], "low": stage["low"], "total": round(stage["high"] + stage["low"], 4)},
        "forward_passes": record.forwards(),
        "expert_per_step": [s.expert for s in record.steps],
        "device_moves": device_moves or [],
        "cache": {"plan": experts.cache_plan.summary() if experts.cache_plan else None, **record.cache},
    }


def summary_line(report: dict) -> str:
    split, passes, wall = report["split"], report["forward_passes"], report["wall_seconds"]
    lines = [f"{split['high']} high / {split['low']} low steps; forwards {passes['high']} / {passes['low']}; "
             f"{wall['total']:.1f} s"]
    for role in ("high", "low"):
        loras = report.get("loras", {}).get(role, [])
        if loras:
            lines.append(f"LoRA {role}: " + ", ".join(f"{u['file']} x{u['strength']:g}" for u in loras))
    for role in ("high", "low"):
        stats = report["cache"].get(role)
        if stats and "cached_steps" in stats:
            done, full = stats["block_forwards"], stats["block_forwards_without_cache"]
            line = (f"cache {role}: {len(stats['cached_steps'])} cached steps, blocks {done}/{full} "
                    f"({100 * (1 - done / full) if full else 0:.0f}% saved)")
            if stats["skippable_steps"] == 0:
                line += f"; {stats['note']}"
            lines.append(line)
    return "\n".join(lines)
