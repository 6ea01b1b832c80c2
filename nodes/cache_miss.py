"""The error criterion's measurement, for one cached stage: at each computed step, the cache's miss.

What the cache would have given for a step's blocks (its last computed residual, or its calibrator's forecast:
cache_dit_backend.watch_forecasts) against what they computed is a hidden-state tensor; through the model's own
output head (run once more, on the hidden state the cache would have handed it) it is the miss in the model's
output, and with the run's CFG scale over the prompts of the evaluation, the miss in the guided output the sampler
steps with. core.cache.ErrorAllowance needs it as a share of the latent the run makes, in the LATENT's own space
(the space every relative L2 the pack states is measured in): the miss through the latent format's per-channel
scale, over the evaluation's prediction of the final latent (its denoised latent, through the latent format).

`ErrorCriterion` is the criterion's part of a cached stage (stage_parts.py): cache-dit decides each call by what is
left of the stage's allowance (core.cache.ErrorAllowance), and the allowance hears each computed evaluation's miss.

Each transformer call carries a slot in its transformer_options (SLOT): the forecast's difference goes in as
"delta", the head's miss as "output". A split of the call over several workers (the parallel plan) gathers them
as it gathers the hidden state and the output, so every worker measures the whole call's miss. Nothing is
installed outside the stage: the head hook and the forecast watch come off in `remove`.
"""

from __future__ import annotations

import torch

from .stage_parts import Call, Part

SLOT = "wan22_cache_miss"  # transformer_options key: this call's {"delta": hidden, "output": head's miss}


class MissWatch:
    """Measures the cache's miss at each computed evaluation of one stage and hands it, with the residual change
    cache-dit compared at it, to `heard(miss, diff)`; `cfg` is the stage's CFG scale (the guider's), and
    `latent_format` the model's (its process_out maps the model's latent to the LATENT's space)."""

    def __init__(self, diffusion_model, backend, cfg: float, latent_format, heard):
        self.diffusion_model, self.backend, self.cfg, self.heard = diffusion_model, backend, float(cfg), heard
        self.latent_format = latent_format
        self.scale = None  # the latent format's per channel (process_out's linear part), read at the first measure
        self.undo, self.hook = None, None
        self.slot = None  # the current call's
        self.begin()

    def install(self) -> None:
        self.undo = self.backend.watch_forecasts(self.diffusion_model, self.forecast)
        self.hook = self.diffusion_model.head.register_forward_hook(self.head_output)

    def remove(self) -> None:
        if self.hook is not None:
            self.hook.remove()
        if self.undo is not None:
            self.undo()
        self.hook = self.undo = self.slot = None

    # --- one evaluation (the prompts' calls of one sampler step) ---

    def begin(self) -> None:
        self.misses, self.outputs, self.diffs, self.complete = {}, {}, [], True
        self.x, self.sigma = None, None

    def compared(self, diff: float) -> None:
        self.diffs.append(diff)

    def guided(self, per_prompt: dict) -> torch.Tensor | None:
        """What the sampler steps with: cfg x positive + (1 - cfg) x negative, or the one prompt."""
        if set(per_prompt) == {0, 1}:
            return self.cfg * per_prompt[0].float() + (1.0 - self.cfg) * per_prompt[1].float()
        return next(iter(per_prompt.values())).float() if len(per_prompt) == 1 else None

    def end(self) -> None:
        """The evaluation's miss, once every prompt of it was computed and compared."""
        if not (self.complete and self.misses and self.diffs and self.x is not None):
            return
        miss, output = self.guided(self.misses), self.guided(self.outputs)
        if miss is None or output is None or set(self.misses) != set(self.outputs):
            return
        # the denoised latent; the model's input may carry conditioning channels after the latent's (an image-to-video
        # model's concat), which its output has not
        final = self.latent_format.process_out(self.x[:, :output.shape[1]].float() - self.sigma * output)
        if self.scale is None:
            one = final[:1, :, :1, :1, :1]
            self.scale = (self.latent_format.process_out(torch.ones_like(one)) -
                          self.latent_format.process_out(torch.zeros_like(one))).reshape(-1)
        channels = self.scale.shape[0]
        if miss.shape[-1] % channels == 0:  # the head's output: the channel is its fastest axis (Wan's unpatchify)
            miss = miss.reshape(*miss.shape[:-1], -1, channels) * self.scale
        norm = float(final.norm())
        if norm > 0:
            self.heard(float(miss.norm()) / norm, sum(self.diffs) / len(self.diffs))

    # --- one transformer call ---

    def call(self, transformer_options: dict, x: torch.Tensor) -> dict:
        """The call about to run: its slot, put in its transformer_options."""
        self.slot = transformer_options[SLOT] = {"delta": None, "output": None}
        if self.x is None:
            chunks = max(1, len(transformer_options.get("cond_or_uncond") or ()))
            self.x = x.chunk(chunks)[0]
            self.sigma = float(transformer_options["sigmas"].reshape(-1)[0])
        return self.slot

    def called(self, slot: dict, prompts: tuple[int, ...], out: torch.Tensor) -> None:
        """The call returned `out`: its miss per prompt (none: it was cached, or not compared)."""
        miss = slot.get("output")
        slot["output"] = slot["delta"] = None
        chunks = max(1, len(prompts))
        for prompt, rows in zip(prompts or (0,), out.chunk(chunks)):
            self.outputs[prompt] = rows
        if miss is None:
            self.complete = False
            return
        for prompt, rows in zip(prompts or (0,), miss.chunk(chunks)):
            self.misses[prompt] = rows

    def forecast(self, delta: torch.Tensor) -> None:
        if self.slot is not None:
            self.slot["delta"] = delta

    @torch.no_grad()
    def head_output(self, head, args, output):
        slot = self.slot
        delta = None if slot is None else slot.get("delta")
        if delta is None or delta.shape != args[0].shape:
            return
        # the head once more, on the hidden state the cache would have handed it (its forward: no hooks again)
        slot["output"] = head.forward(args[0] + delta.to(args[0].dtype), *args[1:]) - output
        slot["delta"] = None


class ErrorCriterion(Part):
    """The error criterion on a cached stage: cache-dit (`backend`) caches a call while what is left of
    `allowance` (core.cache.ErrorAllowance) over the call's estimate allows, and the allowance hears the miss of
    every computed evaluation (MissWatch). `separate()`: whether the stage runs its prompts in separate calls
    (each then half an evaluation)."""

    def __init__(self, backend, diffusion_model, allowance, cfg: float, latent_format, separate):
        self.backend, self.model, self.allowance, self.separate = backend, diffusion_model, allowance, separate
        self.misses = MissWatch(diffusion_model, backend, cfg, latent_format, allowance.missed)
        self.undo = None
        self.slot = None  # the call in progress's
        self.sigmas_of, self.sigmas = None, ()  # the sampling's sigmas tensor, and it as floats (read once)

    def install(self) -> None:
        self.undo = self.backend.decide_by(self.model, self.allowance.threshold, self.seen)
        self.misses.install()

    def remove(self) -> None:
        if self.undo is not None:
            self.undo()
        self.undo = None
        self.misses.remove()

    def seen(self, diff: float, cached: bool) -> None:
        """A call's comparison: with separate CFG, each call is half an evaluation."""
        self.allowance.seen(diff, cached, 0.5 if self.separate() else 1.0)
        self.misses.compared(diff)

    def begin_evaluation(self) -> None:
        self.misses.begin()

    def end_evaluation(self) -> None:
        self.misses.end()

    def before(self, call: Call) -> None:
        # the call's sigma, and the sampling's, as ComfyUI's sampling marks them
        self.allowance.at(float(call.options["sigmas"].reshape(-1)[0]),
                          self.sampling_sigmas(call.options.get("sample_sigmas")))
        self.slot = self.misses.call(call.options, call.argument("x"))

    def after(self, call: Call, out) -> None:
        self.misses.called(self.slot, call.order, out)

    def sampling_sigmas(self, sigmas) -> tuple[float, ...]:
        """The sampling's sigmas as floats: read from the tensor once per sampling (one device read), not on every
        transformer call."""
        if sigmas is None:
            return ()
        if sigmas is not self.sigmas_of:
            self.sigmas_of, self.sigmas = sigmas, tuple(sigmas.reshape(-1).tolist())
        return self.sigmas
