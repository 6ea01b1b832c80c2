"""Each block of a diffusion model run through a forward of the pack's for a while, then exactly as before: the
block objects stay those ComfyUI holds (and so does any wrapper around them, e.g. a compiled block)."""

from __future__ import annotations

from .stage_parts import Part


class SwappedForwards(Part):
    """`make(i, total, inner)` gives block i's forward while installed; `inner` is the forward it had (its own
    instance `forward` if it had one, else its class's). `remove` puts back exactly what each block had."""

    def __init__(self, blocks, make):
        self.blocks, self.make = list(blocks), make
        self.saved: list | None = None

    def install(self) -> None:
        self.saved = [vars(block).get("forward") for block in self.blocks]
        total = len(self.blocks)
        for i, (block, own) in enumerate(zip(self.blocks, self.saved)):
            block.forward = self.make(i, total, own if own is not None else type(block).forward.__get__(block))

    def remove(self) -> None:
        for block, own in zip(self.blocks, self.saved or ()):
            if own is None:
                vars(block).pop("forward", None)
            else:
                block.forward = own
        self.saved = None
