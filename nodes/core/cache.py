"""Cache-DiT per expert: the cache plan (a value the Cache-DiT node puts on a handle), how each expert's
context is sized for one run, and what cache-dit reports back.

Each expert's stage of a run gets a context of its own, sized with the transformer evaluations that
expert makes in that stage. A context sized with the wrong count resets in the middle of the run and
warms up again (or carries stale residuals into the next run), so the count comes from the run's own
sigmas and sampler, not from a guess.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import Wan22InputError
from .experts import ROLE_WORDS, ROLES

CALIBRATORS = ("none", "taylorseer")


@dataclass(frozen=True)
class ExpertCacheSettings:
    warmup_steps: int  # evaluations computed in full before caching may start
    max_cached_steps: int  # -1: no limit; 0: never cache on this expert
    residual_diff_threshold: float | None = None  # this expert's own (an error budget's calibration); None: the plan's


@dataclass(frozen=True)
class CachePlan:
    """What Cache-DiT should do on each expert: printable and comparable, applied in one place. The
    defaults: F1 B0 MC3; high W4 with no cap, low W2 M20 (Wan2.2's serving settings), and threshold 0.05, the
    largest that kept the trained test bed's median error at or below 0.03 at 20 and at 40 steps
    (bench/quality.py; the serving threshold 0.24 cost it 0.08 to 0.11)."""

    residual_diff_threshold: float = 0.05
    first_compute_blocks: int = 1
    last_compute_blocks: int = 0
    max_continuous_cached_steps: int = 3
    high: ExpertCacheSettings = ExpertCacheSettings(warmup_steps=4, max_cached_steps=-1)
    low: ExpertCacheSettings = ExpertCacheSettings(warmup_steps=2, max_cached_steps=20)
    calibrator: str = "none"
    error_budget: float | None = None  # the budget the per-expert thresholds were calibrated for, if any

    def settings(self, role: str) -> ExpertCacheSettings:
        return self.high if role == "high" else self.low

    def threshold(self, role: str) -> float:
        own = self.settings(role).residual_diff_threshold
        return self.residual_diff_threshold if own is None else own

    def node_inputs(self) -> dict:
        """The plan as the Cache-DiT node's inputs (`enabled` aside): where workflows and tests read the
        defaults from."""
        values = {"residual_diff_threshold": self.residual_diff_threshold,
                  "first_compute_blocks": self.first_compute_blocks, "last_compute_blocks": self.last_compute_blocks,
                  "max_continuous_cached_steps": self.max_continuous_cached_steps}
        for role in ROLES:
            values[f"{role}_warmup_steps"] = self.settings(role).warmup_steps
            values[f"{role}_max_cached_steps"] = self.settings(role).max_cached_steps
        values["calibrator"] = self.calibrator
        return values

    def check(self, num_layers: int) -> None:
        """Refuses a plan these experts cannot take, naming the Cache-DiT node's input."""
        if not self.residual_diff_threshold > 0:
            raise Wan22InputError("residual_diff_threshold", f"{self.residual_diff_threshold} must be greater "
                                                             "than 0 (0.05 is the default)")
        if self.first_compute_blocks < 1:
            raise Wan22InputError("first_compute_blocks", "must be at least 1: the first block's residual is "
                                                          "what decides whether a step is cached")
        if self.last_compute_blocks < 0:
            raise Wan22InputError("last_compute_blocks", f"{self.last_compute_blocks} must be 0 or more")
        if self.first_compute_blocks + self.last_compute_blocks >= num_layers:
            raise Wan22InputError("first_compute_blocks", f"first + last compute blocks "
                                  f"({self.first_compute_blocks} + {self.last_compute_blocks}) must leave blocks to "
                                  f"cache; these experts have {num_layers} layers")
        for role in ROLES:
            s = self.settings(role)
            if s.warmup_steps < 0:
                raise Wan22InputError(f"{role}_warmup_steps", f"{s.warmup_steps} must be 0 or more")
            if s.residual_diff_threshold is not None and not s.residual_diff_threshold > 0:
                raise Wan22InputError("error_budget", f"the {ROLE_WORDS[role]} expert's calibrated threshold "
                                                      f"{s.residual_diff_threshold} must be greater than 0")
            if s.max_cached_steps < -1:
                raise Wan22InputError(f"{role}_max_cached_steps", f"{s.max_cached_steps}: use -1 for no limit, "
                                                                  "or 0 or more")
        if self.max_continuous_cached_steps < -1 or self.max_continuous_cached_steps == 0:
            raise Wan22InputError("max_continuous_cached_steps", f"{self.max_continuous_cached_steps}: use -1 for "
                                                                 "no limit, or 1 or more")
        if self.calibrator not in CALIBRATORS:
            raise Wan22InputError("calibrator", f"unknown calibrator {self.calibrator!r}: use one of "
                                                f"{', '.join(CALIBRATORS)}")

    def db_cache_config(self, role: str, evaluations: int | None, separate_cfg: bool | None):
        """cache-dit's config for one expert's context. With separate CFG, each evaluation is a pair of
        transformer calls, each prompt with a residual stream of its own; without, one call per evaluation
        (CFG 1, or both prompts batched in it). None leaves it open (the plan before a run decides it)."""
        from cache_dit import DBCacheConfig

        s = self.settings(role)
        # A full config every time: a `.reset()` config cannot be a base config.
        return DBCacheConfig(Fn_compute_blocks=self.first_compute_blocks, Bn_compute_blocks=self.last_compute_blocks,
                             residual_diff_threshold=self.threshold(role), max_warmup_steps=s.warmup_steps,
                             warmup_interval=1, max_cached_steps=s.max_cached_steps,
                             max_continuous_cached_steps=self.max_continuous_cached_steps,
                             enable_separate_cfg=separate_cfg, cfg_compute_first=False,
                             num_inference_steps=evaluations)

    def calibrator_config(self):
        if self.calibrator == "none":
            return None
        from cache_dit import TaylorSeerCalibratorConfig

        return TaylorSeerCalibratorConfig(taylorseer_order=1)

    def strify(self, role: str) -> str:
        """cache-dit's name for one expert's settings, without the CFG part that each stage decides when it
        runs (how ComfyUI batches the prompts; the sampler's report shows it)."""
        text = self.db_cache_config(role, None, None).strify()
        return text + ("_T1" if self.calibrator == "taylorseer" else "")

    def summary(self) -> str:
        budget = "" if self.error_budget is None else f" (error budget {self.error_budget:g})"
        return f"high {self.strify('high')}, low {self.strify('low')}{budget}"


# --- how many transformer evaluations an expert makes in its stage (what its context is sized with) ---

# Evaluations per step of ComfyUI's multi-evaluation samplers, read from its k-diffusion code (a test
# counts them on ComfyUI itself for every sampler it lists). Each makes one evaluation on a last step
# that ends at sigma 0. Every other sampler makes one evaluation per step.
EVALUATIONS_PER_STEP = {"heun": 2, "exp_heun_2_x0": 2, "exp_heun_2_x0_sde": 2, "dpm_2": 2, "dpm_2_ancestral": 2,
                        "dpmpp_2s_ancestral": 2, "dpmpp_2s_ancestral_cfg_pp": 2, "dpmpp_sde": 2, "dpmpp_sde_gpu": 2,
                        "seeds_2": 2, "seeds_3": 3}
ONE_PER_STEP = {"euler", "euler_cfg_pp", "euler_ancestral", "euler_ancestral_cfg_pp", "lms", "dpm_fast", "dpmpp_2m",
                "dpmpp_2m_cfg_pp", "dpmpp_2m_sde", "dpmpp_2m_sde_gpu", "dpmpp_2m_sde_heun", "dpmpp_2m_sde_heun_gpu",
                "dpmpp_3m_sde", "dpmpp_3m_sde_gpu", "ddpm", "lcm", "ipndm", "ipndm_v", "deis", "res_multistep",
                "res_multistep_cfg_pp", "res_multistep_ancestral", "res_multistep_ancestral_cfg_pp",
                "gradient_estimation", "gradient_estimation_cfg_pp", "er_sde", "sa_solver", "ddim", "uni_pc",
                "uni_pc_bh2"}
ADAPTIVE = {"dpm_adaptive"}  # its step sizes follow the model's outputs: no count is known beforehand


def evaluations_per_step(sampler: str, stage_sigmas) -> list[int]:
    """The transformer evaluations of each step of one stage (`stage_sigmas`: its N + 1 sigmas)."""
    steps = len(stage_sigmas) - 1
    if sampler in ADAPTIVE:
        raise Wan22InputError("sampler", f"{sampler} chooses its step sizes from the model's outputs, so nobody can "
                                         "know beforehand how often it calls each expert, and a Cache-DiT context "
                                         "must be sized with that: pick a fixed-step sampler (uni_pc, euler, "
                                         "dpmpp_2m, ...) or turn Cache-DiT off")
    ends_at_zero = [float(stage_sigmas[i + 1]) == 0.0 for i in range(steps)]
    if sampler in ONE_PER_STEP:
        return [1] * steps
    if sampler in EVALUATIONS_PER_STEP:
        return [1 if last else EVALUATIONS_PER_STEP[sampler] for last in ends_at_zero]
    if sampler == "heunpp2":  # three, two on the stage's second-to-last step, one on its last
        return [min(3, steps - i) for i in range(steps)]
    if sampler == "sa_solver_pece":  # predict-evaluate-correct-evaluate: one on the first step, two after
        return [1 if i == 0 else 2 for i in range(steps)]
    raise Wan22InputError("sampler", f"the pack does not know how many transformer calls {sampler} makes per "
                                     "step, so it cannot size the Cache-DiT contexts: pick one of ComfyUI's own "
                                     "samplers or turn Cache-DiT off")


def skippable_steps(plan: CachePlan, role: str, evaluations: int) -> int:
    """The most evaluations the cache can serve on one expert in a stage of `evaluations`: its warm-up is
    always computed, and `max_cached_steps` caps the rest. At 4-step LoRA runs this is usually 0."""
    s = plan.settings(role)
    could = max(0, evaluations - s.warmup_steps)
    return could if s.max_cached_steps < 0 else min(could, s.max_cached_steps)


def skip_note(plan: CachePlan, role: str, evaluations: int) -> str:
    """A plain sentence on what the cache can do for one expert in this run."""
    could, settings = skippable_steps(plan, role, evaluations), plan.settings(role)
    if could == 0 and settings.max_cached_steps == 0:
        return (f"run without the cache: {role}_max_cached_steps is 0, so none of the {ROLE_WORDS[role]} expert's "
                f"{evaluations} steps may be cached")
    if could == 0:
        return (f"run without the cache: it could skip none of the {ROLE_WORDS[role]} expert's {evaluations} steps, "
                f"as its first {settings.warmup_steps} are warm-up, computed in full (lower {role}_warmup_steps, or "
                "leave Cache-DiT off at so few steps)")
    return f"the cache can skip at most {could} of the {ROLE_WORDS[role]} expert's {evaluations} steps"


def statistics(plan: CachePlan, role: str, summary, config: str, evaluations: int, cfg_batching: str,
               pass_order: tuple[str, ...], calls: int, block_forwards: int, layers: int) -> dict:
    """One cached expert's entry in the report: cache-dit's own summary of its context (cached
    evaluations per pass, residual differences against the threshold), the blocks really run against
    a run without cache, and how much the plan could skip at most."""
    return {
        "config": config,
        "calibrator": plan.calibrator,
        "evaluations": evaluations,
        "cfg_batching": cfg_batching,  # single (CFG 1) | batched (both prompts in one call) | separate (one each)
        "pass_order": list(pass_order),  # the prompts in the order ComfyUI ran them (separate: cache-dit's streams)
        "block_forwards": block_forwards,
        "block_forwards_without_cache": calls * layers,
        # cache-dit's evaluations served from the cache; with separate calls, cached_steps are those of the
        # first pass of each evaluation and cfg_cached_steps those of the second (pass_order names them)
        "cached_steps": sorted(int(s) for s in (summary.cached_steps if summary else [])),
        "cfg_cached_steps": sorted(int(s) for s in (summary.cfg_cached_steps if summary else [])),
        "residual_diffs": {str(k): round(float(v), 5) for k, v in (summary.residual_diffs if summary else {}).items()},
        "threshold": plan.threshold(role),
        "error_budget": plan.error_budget,
        "blocks_skipped_per_cached_forward": layers - plan.first_compute_blocks - plan.last_compute_blocks,
        "skippable_steps": skippable_steps(plan, role, evaluations),
        "note": skip_note(plan, role, evaluations),
    }
