"""VACE-Fun's control hints on a cached stage.

ComfyUI's VaceWanModel adds hint k (VACE block k's output, times the control's strength) to the hidden state right
after main block `vace_layers_mapping`'s key for k. The VACE blocks read only the call's own inputs (the patch-embedded
latent, the timestep, the text) and each other's stream, never the main blocks' output, so a hint can be computed
beside any block. cache-dit runs the main blocks as one unit, and ComfyUI's loop, seeing one block, would add every
hint once, after the whole stack. While a stage is cached, `VaceHints` takes the hints off that loop (an empty mapping
on the shared model for the stage, put back after it) and adds each after its own block, as the loop does, with the
same arithmetic: a step cache-dit computes gives ComfyUI's output. On a step cache-dit serves from its cache, the
main blocks it skips do not run, and the hints they carry are:

- "fresh" (the default): computed for this step, and their change since the step whose residual the cache
  reuses is added before the head, so the control of every step is this step's (the VACE blocks always run);
- "cached": those inside the cached residual, as of the last computed step (the VACE blocks of skipped main
  blocks do not run either: cheaper, and the hints are a step or more old).

Both keep the control on the trained VACE bed (bench/family.py); at the same settings the fresh hints halve the
error at 20 steps for a few points of block cost, so they are the pack's (docs/quality.md has the figures). A MODEL
may ask for the other with MODE_KEY in its transformer_options (what bench/family.py and a test measure).

`for_stage` gives a cached stage its VACE part (stage_parts.py), or none on a model without VACE blocks.
"""

from __future__ import annotations

from functools import partial

from .stage_parts import Call, Part

HINTS = ("fresh", "cached")
MODE_KEY = "wan22_vace_hints"  # transformer_options: the hints' mode on this MODEL's cached stages ("fresh" unless)


def for_stage(diffusion_model, plan, transformer_options: dict, refuse) -> "VaceHints | None":
    """The VACE part of a stage cached by `plan` on `diffusion_model`: None unless it is ComfyUI's VaceWanModel.
    `refuse(why)` is the stage's error for a model it cannot cache."""
    if not hasattr(diffusion_model, "vace_layers_mapping"):
        return None
    if getattr(diffusion_model, "vace_image_input", False):
        # a newer ComfyUI's VACE with image input (ID-V2V) runs its VACE blocks on the text tokens alone; the fresh
        # hints would give them the image tokens too
        raise refuse("a VACE model with image input, whose VACE hints Cache-DiT cannot keep fresh")
    layers = len(diffusion_model.blocks)
    return VaceHints(diffusion_model, (plan.first_compute_blocks, layers - plan.last_compute_blocks),
                     transformer_options.get(MODE_KEY, "fresh"))


class VaceCall:
    """One transformer call's control stream: what ComfyUI's forward computes for it, taken as it goes."""

    def __init__(self, stream, vace_context, vace_strength):
        self.stream = stream  # the prompts of the call: each has a residual stream of its own in the cache
        self.entries, self.dtype = vace_context.shape[0], vace_context.dtype
        self.strength = vace_strength
        self.c = None  # per control entry, the VACE stream after the VACE blocks run so far
        self.x_orig = self.block_kwargs = None  # the first block's input and keyword arguments
        self.next = 0  # the next VACE block to run
        self.ran: set[int] = set()  # the mapped main blocks that ran in this call
        self.middle_sum = None  # the hints of the skippable mapped blocks that ran, summed
        self.skipped_sum = None  # ... of those the cache skipped, computed for this step ("fresh")


class VaceHints(Part):
    """The hints of a VaceWanModel's stage, installed with its cache. `skippable` is the range of main blocks the
    cache may skip ([first, end)); `mode` one of HINTS."""

    def __init__(self, diffusion_model, skippable: tuple[int, int], mode: str = "fresh"):
        if mode not in HINTS:
            raise ValueError(f"VACE hints {mode!r}: use one of {HINTS}")
        self.model, self.mode = diffusion_model, mode
        self.saved = diffusion_model.vace_layers_mapping
        self.mapping = dict(self.saved)  # main block -> its VACE block
        self.main_of = {k: i for i, k in self.mapping.items()}
        self.middle = sorted(i for i in self.mapping if skippable[0] <= i < skippable[1])
        self.handles: list = []
        self.call: VaceCall | None = None
        self.last: dict = {}  # stream -> the middle hints' sum on its last computed call
        self.forwards = 0  # VACE block forwards run (beside the main blocks)

    def install(self) -> None:
        self.model.vace_layers_mapping = {}
        blocks = self.model.blocks
        self.handles = [self.model.vace_patch_embedding.register_forward_hook(self.embedded),
                        blocks[0].register_forward_pre_hook(self.first_block, with_kwargs=True)]
        self.handles += [blocks[i].register_forward_hook(partial(self.after_block, i), with_kwargs=True)
                         for i in self.mapping]
        if self.mode == "fresh" and self.middle:
            self.handles.append(self.model.head.register_forward_pre_hook(self.before_head))

    def held(self) -> dict:
        """What the fresh hints keep between steps: per prompt stream, the skippable hints' sum (one hidden
        state's size), as cache_dit_backend.held gives it."""
        tensors = [t for t in self.last.values() if t is not None]
        return {"bytes": sum(t.numel() * t.element_size() for t in tensors),
                "devices": sorted({str(t.device) for t in tensors})}

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles, self.call = [], None
        self.model.vace_layers_mapping = self.saved

    def statistics(self) -> dict:
        """How the hints were kept, and the VACE blocks run beside the main ones."""
        return {"vace_hints": self.mode, "vace_block_forwards": self.forwards}

    # --- one transformer call ---

    def before(self, call: Call) -> None:
        self.call = VaceCall(call.order, call.argument("vace_context"), call.argument("vace_strength"))

    def done(self, call: Call) -> None:
        self.call = None

    def embedded(self, _module, _args, output):
        """The control's patch embedding, as ComfyUI's forward makes it into the VACE stream (one chunk per control
        entry, each over the batch)."""
        call = self.call
        if call is not None:
            c = output.to(call.dtype).flatten(2).transpose(1, 2)
            call.c = list(c.split(call.entries, dim=0))

    def first_block(self, _module, args, kwargs):
        call = self.call
        if call is not None and call.x_orig is None:  # the patch-embedded input, as the loop hands it to block 0
            call.x_orig = args[0] if args else kwargs["x"]
            call.block_kwargs = {k: v for k, v in kwargs.items() if k != "x"}

    def run_up_to(self, k: int, keep: bool = True) -> list | None:
        """Runs the VACE blocks up to k (each once per call), as ComfyUI's loop runs them, and returns block k's
        outputs (one per control entry) where `keep`. The others belong to main blocks the cache skipped: with
        fresh hints the skippable ones are summed for the head, else dropped (only one block's outputs are held
        at a time, as in ComfyUI's loop)."""
        call = self.call
        options = call.block_kwargs.get("transformer_options")
        skips = None
        while call.next <= k:
            j, block, skips = call.next, self.model.vace_blocks[call.next], []
            if options is not None:
                options["block_index"] = self.main_of[j]
            for entry in range(len(call.c)):
                c_skip, call.c[entry] = block(call.c[entry], x=call.x_orig, **call.block_kwargs)
                skips.append(c_skip)
            call.next += 1
            self.forwards += 1
            if (j < k or not keep) and self.mode == "fresh" and self.main_of[j] in self.middle:
                call.skipped_sum = add(call.skipped_sum, self.hint(skips))
        return skips if keep else None

    def after_block(self, i, _module, _args, _kwargs, output):
        call = self.call
        if call is None:
            return None
        skips = self.run_up_to(self.mapping[i])
        for c_skip, strength in zip(skips, call.strength):
            output = output + c_skip * strength
        call.ran.add(i)
        if i in self.middle and self.mode == "fresh":
            call.middle_sum = add(call.middle_sum, self.hint(skips))
        return output

    def hint(self, skips: list):
        """A VACE block's hint: its outputs times their control's strength, summed over the control entries."""
        return sum(c_skip * strength for c_skip, strength in zip(skips, self.call.strength))

    def before_head(self, _module, args):
        """After the blocks: a call that ran the skippable mapped blocks keeps their hints for its stream; one that
        skipped them gets their change since then."""
        call = self.call
        if call is None:
            return None
        ran = [i for i in self.middle if i in call.ran]
        if ran:
            self.last[call.stream] = call.middle_sum
            return None
        last = self.last.get(call.stream)
        if last is None:  # cache-dit computes a stream's first call
            return None
        self.run_up_to(max(self.mapping[i] for i in self.middle), keep=False)  # the skipped blocks' hints, summed
        return (args[0] + (call.skipped_sum - last), *args[1:])


def add(total, value):
    return value if total is None else total + value
