"""What one stage's sampling really does, counted once, through wrappers on the stage's own clone: the sigmas
it steps through (checked against the schedule's before any step runs: the split was counted from those), the
sampler's evaluations of the prompts and where each step ends, and the transformer calls with the prompts
batched into them. The engine reads it for the run's record, and a stage's cache (stage_cache.py) for its
statistics."""

from __future__ import annotations

import comfy.patcher_extension

from .core.errors import Wan22InputError
from .core.schedule import STAGE_WORDS
from .wrapper_calls import call_argument, prompts_in, with_argument

WrappersMP = comfy.patcher_extension.WrappersMP


class StageCalls:
    KEY = "wan22_stage_calls"

    def __init__(self, stage: str, sigmas: tuple[float, ...] | None = None):
        self.stage = stage
        self.sigmas = None if sigmas is None else tuple(sigmas)  # None: any (a KSampler's, on the MODEL node)
        self._reset()

    def _reset(self) -> None:
        self.calls = 0  # transformer calls
        self.prompts = 0  # prompts in those calls (forward passes)
        self.evaluations = 0  # the sampler's evaluations of the prompts
        self.per_step: list[int] = []  # evaluations of each step, as the sampler's step callbacks mark them

    def attach(self, model) -> None:
        """Adds the wrappers to `model`, the stage's own clone (never a MODEL the pack received)."""
        model.add_wrapper_with_key(WrappersMP.SAMPLER_SAMPLE, self.KEY, self.sampler_sample)
        model.add_wrapper_with_key(WrappersMP.CALC_COND_BATCH, self.KEY, self.calc_cond_batch)
        model.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, self.KEY, self.diffusion_model_call)

    def sampler_sample(self, executor, *args, **kwargs):
        self._reset()  # each sample call counts afresh (the MODEL node's clone runs several)
        if self.sigmas is not None:
            seen = tuple(float(s) for s in call_argument(executor, args, kwargs, "sigmas"))
            if seen != self.sigmas:
                raise Wan22InputError("schedule", f"ComfyUI's sampling would step the {STAGE_WORDS[self.stage]} "
                                                  f"stage through the sigmas {[round(s, 6) for s in seen]}, not the "
                                                  f"{[round(s, 6) for s in self.sigmas]} the split was counted "
                                                  "from; nothing was run. Please report it with your ComfyUI version")
        args, kwargs = with_argument(executor, args, kwargs, "callback",
                                     self.step_callback(call_argument(executor, args, kwargs, "callback")))
        out = executor(*args, **kwargs)
        if self.evaluations > sum(self.per_step):  # after the sampler's last step callback, if any
            self.per_step.append(self.evaluations - sum(self.per_step))
        return out

    def step_callback(self, callback):
        """The sampler's step callback, marking where each step's evaluations end."""
        def step_done(i, *args, **kwargs):
            self.per_step.append(self.evaluations - sum(self.per_step))
            return None if callback is None else callback(i, *args, **kwargs)
        return step_done

    def calc_cond_batch(self, executor, *args, **kwargs):
        self.evaluations += 1
        return executor(*args, **kwargs)

    def diffusion_model_call(self, executor, *args, **kwargs):
        self.calls += 1
        self.prompts += prompts_in(call_argument(executor, args, kwargs, "transformer_options"))
        return executor(*args, **kwargs)
