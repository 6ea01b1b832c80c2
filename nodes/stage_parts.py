"""What a cached stage installs on its expert, as parts: each installed for the stage only and removed in `finally`.

A stage (stage_cache.StageCache) asks the part makers of its model which parts the stage needs (`makers` below:
cache-dit itself, the indexed forwards, VACE-Fun's hints, the error criterion, the calibrator's attention route,
the block count), installs them in that order, runs, and removes them in the reverse order, also after an error or
an interrupt. A model without VACE blocks gets no VACE part, a plan without a calibrator no route part: the stage
itself has no branch for either. Each part says what it holds between steps and adds its entries to the stage's
report; around the sampler's evaluations and the transformer's calls it does what it needs (`Part`).

Nothing here knows ComfyUI: a part is given the diffusion model and what the stage knows of the call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

NOTHING_HELD = {"bytes": 0, "devices": []}


@dataclass
class Call:
    """One transformer call, as a stage's parts see it."""

    order: tuple  # the prompts it carries, in batch order (wrapper_calls.prompt_indices)
    first: bool  # the first call of its evaluation
    options: dict  # its transformer_options
    argument: Callable[[str], Any]  # one of its arguments by name ("x", "vace_context", ...)


class Part:
    """One thing a cached stage installs on its expert's diffusion model for the stage. Every hook does nothing
    unless a part needs it."""

    def install(self) -> None:
        pass

    def remove(self) -> None:
        pass

    def held(self) -> dict:
        """The tensors it keeps between steps: {"bytes", "devices"}."""
        return NOTHING_HELD

    def statistics(self) -> dict:
        """Its entries in the stage's report."""
        return {}

    def outcome(self, outcome: dict) -> dict:
        """What the cache did in the stage, given what its context last did (a part that replaced contexts
        merges theirs)."""
        return outcome

    def begin_evaluation(self) -> None:
        pass

    def end_evaluation(self) -> None:
        """After an evaluation that ran to its end."""

    def before(self, call: Call) -> None:
        pass

    def after(self, call: Call, out) -> None:
        """After a call that returned `out`."""

    def done(self, call: Call) -> None:
        """After a call, also one that raised."""


def held_together(parts) -> dict:
    """What the parts keep between steps, together."""
    helds = [part.held() for part in parts]
    return {"bytes": sum(h["bytes"] for h in helds), "devices": sorted({d for h in helds for d in h["devices"]})}


class CacheDiT(Part):
    """cache-dit's context on the expert (through the backend: cache_dit_backend.py)."""

    def __init__(self, backend, diffusion_model, plan, role: str):
        self.backend, self.model, self.plan, self.role = backend, diffusion_model, plan, role

    def install(self) -> None:
        self.backend.install(self.model, self.plan, self.role, separate_cfg=False)

    def remove(self) -> None:
        self.backend.remove(self.model)

    def held(self) -> dict:
        return self.backend.held(self.model)


class BlockCount(Part):
    """Counts the blocks that really ran (installed with the cache or without it: the report's block cost)."""

    def __init__(self, blocks):
        self.blocks, self.count, self.handles = list(blocks), 0, []

    def install(self) -> None:
        self.handles = [block.register_forward_hook(self.counted) for block in self.blocks]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def counted(self, _module, _args, _output) -> None:
        self.count += 1


def install_all(parts: list, installed: list) -> None:
    """Installs `parts` in order, each put on `installed` first: a part whose install raised halfway comes off
    with the others (a part's `remove` takes back whatever of it is there)."""
    for part in parts:
        installed.append(part)
        part.install()


def remove_all(parts: list, on_error: Callable[[Exception], None]) -> None:
    """Removes `parts` in the reverse order, every one of them: a removal that raises is handed to `on_error`
    after the others were removed."""
    errors = []
    for part in reversed(parts):
        try:
            part.remove()
        except Exception as e:  # noqa: BLE001 - the next parts must still come off
            errors.append(e)
    for e in errors:
        on_error(e)
