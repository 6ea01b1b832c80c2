"""Ulysses sequence parallelism on ComfyUI's own WanModel, inside one worker of a torch.distributed group.

Everything goes through a DIFFUSION_MODEL wrapper on the stage's own clone, for one transformer call at a
time, and is removed when the call returns:
- ComfyUI's block loop calls each entry of `diffusion_model.blocks` (the real blocks, or cache-dit's one
  cached entry that runs them); the first entry's input, the token sequence after the patch embedding, is
  cut to this rank's shard, the RoPE frequencies (and a per-token modulation, where a model has one) are cut
  to match on every entry, and the last entry's output is gathered back, so the head sees the whole sequence;
- self-attention runs through ComfyUI's `optimized_attention_override`: yunchang's all-to-all gives each rank
  every token for its share of the heads, ComfyUI's own attention runs on that (or the override the MODEL
  already carries, sage or flash attention say, as the inner attention), and the all-to-all back returns the
  rank's tokens with every head. Cross-attention (the text is never split) and the feed-forward run locally,
  through the MODEL's override where it has one;
- before each call every rank agrees (one all-reduce) on a cancel, so all stop at the same call and none waits
  in a collective for one that stopped, and on the call's batch: ComfyUI batches the prompts by each process's
  free memory, and ranks that batched them differently would exchange shards of different sizes.

At a stage whose split is "cfg" (core/parallel.py: a stage at CFG above 1, an even number of workers), a call
that carries the evaluation's two prompts batched gives each half of the workers one of them: every per-prompt
input is cut to the half's prompt, the half runs it (two workers: one rank, the whole sequence; four or more:
the half splits the prompt's sequence as above, a mesh of 2 x workers/2), and the outputs are gathered back in
ComfyUI's prompt order. A call with one prompt (ComfyUI runs them one by one when memory is short) is split by
its sequence over every worker.

Any number of workers splits any sequence and any head count: a sequence the workers do not divide gives the
first ranks one token more (the exchanges pad each shard to the longest and drop the padding on arrival, so
attention sees exactly the real tokens), and heads they do not divide are padded with empty heads (an empty
query, key and value attend to nothing and are dropped).

The error criterion's measurement of the cache's miss (cache_miss.py) rides in each call's transformer_options
and is gathered as the hidden state and the output are, so every rank measures the whole call's miss.

cache-dit, when the stage is cached, sees only this rank's shard (of the sequence, or of the prompts); it
averages its residual statistic over the ranks itself (the mean difference and the mean magnitude, each
averaged whenever torch.distributed has more than one rank). With equal shards the average of each rank's mean
is the whole call's mean; with unequal ones each rank's mean is weighed by its share first
(cache_dit_backend.weigh_statistic), so every rank makes the decision one process would make.
"""

from __future__ import annotations

import time

from dataclasses import dataclass

import comfy.model_management
import comfy.patcher_extension
import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import cache_dit_backend
from ..cache_memory import SHARE as MEMORY_SHARE
from ..cache_miss import SLOT as MISS_SLOT
from ..block_forwards import SwappedForwards
from ..core import parallel as core
from ..core.errors import Wan22InputError
from ..wrapper_calls import call_argument, with_argument

KEY = "wan22_sequence_parallel"
WrappersMP = comfy.patcher_extension.WrappersMP


def all_to_all(x: torch.Tensor, scatter: int, gather: int, group=None) -> torch.Tensor:
    from yunchang.comm.all_to_all import all_to_all_4D

    return all_to_all_4D(x.contiguous(), scatter_idx=scatter, gather_idx=gather, group=group)


@dataclass(frozen=True)
class Mesh:
    """This rank's place in one way of sharing a call: `prompts` groups of `sequence` ranks; the rank runs
    prompt `prompt`, and is `place` in the group that splits its sequence (`sequence_group`); `prompt_group`
    holds the ranks whose outputs make the call's batch. A group of None is the whole world."""

    prompts: int
    sequence: int
    prompt: int
    place: int
    sequence_group: object = None
    prompt_group: object = None


def meshes(rank: int, world: int) -> dict[int, Mesh]:
    """The meshes a pool of `world` workers runs, by their prompt degree: 1 (every worker splits the sequence)
    and, for an even world, 2 (the CFG split). Called once per pool, on every rank in the same order (making a
    group is a collective of the whole world)."""
    made = {1: Mesh(1, world, 0, rank)}
    if world % core.PROMPTS == 0:
        sequence_ranks, prompt_ranks = core.mesh_groups(world, core.PROMPTS)
        prompt, place = core.mesh_place(rank, world, core.PROMPTS)
        sequence_group = prompt_group = None
        if len(sequence_ranks[0]) > 1:  # four or more workers: each half its groups
            for ranks in sequence_ranks:
                group = dist.new_group(ranks)
                sequence_group = group if rank in ranks else sequence_group
            for ranks in prompt_ranks:
                group = dist.new_group(ranks)
                prompt_group = group if rank in ranks else prompt_group
        made[core.PROMPTS] = Mesh(core.PROMPTS, world // core.PROMPTS, prompt, place, sequence_group, prompt_group)
    return made


class SequenceParallel:
    """One worker's part of the split, for the stages of one run; `comm_seconds` is the time it spent in
    collectives, `contexts` each stage's cache-dit contexts (their settings) as this rank read them from
    cache-dit while the stage ran."""

    def __init__(self, rank: int, world: int, cancelled, splits: dict[str, str] | None = None,
                 meshes: dict[int, Mesh] | None = None):
        self.rank, self.world = rank, world
        self.cancelled = cancelled  # () -> bool: this run was cancelled
        self.splits = dict(splits or {})  # stage -> "cfg" | "ulysses" (core.ParallelPlan.stage_split)
        self.meshes = meshes or {1: Mesh(1, world, 0, rank)}  # meshes(): made once per pool
        self.ran: dict[str, set] = {}  # stage -> the splits its calls really ran with
        self.comm_seconds = 0.0
        self.contexts: dict[str, list] = {}
        self.in_self_attention = False
        self.mesh = None  # the current call's mesh
        # the current call's sequence, each rank's share of it, and this rank's tokens
        self.tokens, self.sizes, self.part = None, None, None
        self.unweigh = None  # undoes the current call's weighing of the cache's statistic, if any
        self.inner = None  # the MODEL's own attention override, if any, for the current call

    def attach(self, model, stage: str) -> None:
        # every stage is split across the whole world: its prompts over the CFG mesh's two halves, each half
        # cutting its prompt's sequence, or every worker cutting the sequence. This worker's cache holds its
        # share, which it asks ComfyUI's memory management for (cache_memory.py)
        prompts = core.PROMPTS if self.splits.get(stage) == "cfg" and core.PROMPTS in self.meshes else 1
        model.model_options["transformer_options"] = {**model.model_options.get("transformer_options", {}),
                                                      MEMORY_SHARE: {"prompts": prompts,
                                                                     "sequence": self.world // prompts}}
        model.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, KEY,
                                   lambda executor, *a, **k: self.diffusion_model_call(stage, executor, *a, **k))

    # --- the collectives, timed ---

    def timed(self, function, *args):
        gpu = dist.get_backend() == "nccl"
        started = time.perf_counter()
        try:
            out = function(*args)
            if gpu:  # NCCL returns once the collective is queued: count the time it takes
                torch.cuda.synchronize()
            return out
        finally:
            self.comm_seconds += time.perf_counter() - started

    def agree(self, batch: int) -> None:
        """One all-reduce before each call: a cancel on any rank stops all of them here, and a call whose batch
        differs between the ranks is refused on all of them (nothing is exchanged)."""
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        flags = torch.tensor([1 if self.cancelled() else 0, batch, -batch], dtype=torch.int64, device=device)
        self.timed(dist.all_reduce, flags, dist.ReduceOp.MAX)
        cancel, most, least = (int(v) for v in flags.tolist())
        if cancel:
            raise comfy.model_management.InterruptProcessingException()
        if most != -least:
            raise Wan22InputError("workers", f"the workers batched the prompts differently (calls of {-least} and "
                                             f"{most}: ComfyUI batches them by each process's free memory): give "
                                             "every worker a device with the same free memory, or run at CFG 1")

    def gather(self, x: torch.Tensor, dim: int, group=None, sizes: list[int] | None = None) -> torch.Tensor:
        """Every rank's `x` of the group, joined along `dim` in rank order; `sizes`: each rank's length along
        `dim` where they differ (each is padded to the longest for the exchange, and cut back)."""
        most = max(sizes) if sizes else x.shape[dim]
        if x.shape[dim] < most:
            x = torch.cat([x, x.new_zeros(*x.shape[:dim], most - x.shape[dim], *x.shape[dim + 1:])], dim=dim)
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        self.timed(dist.all_gather, parts, x.contiguous(), group)
        if sizes:
            parts = [part.narrow(dim, 0, size) for part, size in zip(parts, sizes)]
        return torch.cat(parts, dim=dim)

    # --- one transformer call ---

    def diffusion_model_call(self, stage, executor, *args, **kwargs):
        batch = int(call_argument(executor, args, kwargs, "x").shape[0])
        self.agree(batch)
        options = call_argument(executor, args, kwargs, "transformer_options")
        if stage not in self.contexts:
            self.contexts[stage] = cache_dit_backend.contexts(executor.class_obj)
        prompts = options.get("cond_or_uncond") or ()
        mesh = self.meshes.get(core.PROMPTS)
        if self.splits.get(stage) == "cfg" and mesh is not None and len(prompts) == core.PROMPTS \
                and batch % core.PROMPTS == 0:
            self.ran.setdefault(stage, set()).add("cfg" if mesh.sequence == 1 else "cfg+ulysses")
            return self.prompt_call(mesh, executor, args, kwargs, batch)
        self.ran.setdefault(stage, set()).add("ulysses")
        return self.sequence_call(self.meshes[1], executor, args, kwargs)

    def stage_splits(self) -> dict[str, str]:
        """What each stage's calls ran with: "cfg" (two workers), "cfg+ulysses" (the mesh), "ulysses", or
        several of them, separated by commas, where some calls carried one prompt."""
        return {stage: ", ".join(sorted(kinds)) for stage, kinds in self.ran.items()}

    def prompt_call(self, mesh: Mesh, executor, args, kwargs, batch: int):
        """A call with the evaluation's prompts batched: this rank's prompt (split over its sequence group when
        it has more than one rank), gathered over its prompt group in ComfyUI's order."""
        part = slice(mesh.prompt * batch // mesh.prompts, (mesh.prompt + 1) * batch // mesh.prompts)

        def own(value):
            return value[part] if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == batch \
                else value
        options = dict(call_argument(executor, args, kwargs, "transformer_options"))
        for name in ("cond_or_uncond", "uuids"):  # per prompt, in the batch's order
            if isinstance(options.get(name), list) and len(options[name]) == mesh.prompts:
                options[name] = options[name][mesh.prompt:mesh.prompt + 1]
        if isinstance(options.get("sigmas"), torch.Tensor):
            options["sigmas"] = own(options["sigmas"])
        args = tuple(own(a) for a in args)
        kwargs = {k: own(v) for k, v in kwargs.items()}
        args, kwargs = with_argument(executor, args, kwargs, "transformer_options", options)
        out = executor(*args, **kwargs) if mesh.sequence == 1 else self.sequence_call(mesh, executor, args, kwargs)
        miss = options.get(MISS_SLOT)
        if miss is not None and miss.get("output") is not None:  # the error criterion's, gathered as the output
            miss["output"] = self.gather(miss["output"], dim=0, group=mesh.prompt_group)
        return self.gather(out, dim=0, group=mesh.prompt_group)

    def sequence_call(self, mesh: Mesh, executor, args, kwargs):
        options = call_argument(executor, args, kwargs, "transformer_options")
        inner = options.get("optimized_attention_override")
        self.inner = None if getattr(inner, "__self__", None) is self else inner
        options["optimized_attention_override"] = self.attention
        diffusion_model = executor.class_obj
        entries = SwappedForwards(diffusion_model.blocks, lambda i, total, inner: self.entry_forward(
            diffusion_model, i, total, inner))
        hooks = []
        self.mesh, self.unweigh = mesh, None
        try:
            entries.install()
            for name, module in diffusion_model.named_modules():
                if name.rsplit(".", 1)[-1] == "self_attn":
                    hooks.append(module.register_forward_pre_hook(self.enter_self_attention))
                    hooks.append(module.register_forward_hook(self.leave_self_attention))
            return executor(*args, **kwargs)
        finally:
            self.in_self_attention = False
            for hook in hooks:
                hook.remove()
            entries.remove()
            if self.unweigh is not None:
                self.unweigh()
            self.mesh = self.unweigh = None

    def enter_self_attention(self, _module, _args):
        self.in_self_attention = True

    def leave_self_attention(self, _module, _args, _output):
        self.in_self_attention = False

    def entry_forward(self, diffusion_model, i: int, total: int, inner):
        first, last = i == 0, i == total - 1

        def forward(x, *args, **kwargs):
            m = self.mesh
            if first:
                self.tokens = x.shape[1]
                core.check_sequence(self.tokens, m.sequence)
                self.sizes = core.shard_sizes(self.tokens, m.sequence)
                self.part = core.shard(self.tokens, m.sequence, m.place)
                x = x[:, self.part]
                weight = core.statistic_weight(self.tokens, m.sequence, m.place)
                if weight != 1.0 and self.unweigh is None:
                    self.unweigh = cache_dit_backend.weigh_statistic(diffusion_model, weight)
            for name in ("freqs", "e"):  # per-token inputs follow the tokens; per-video ones stay whole
                value = kwargs.get(name)
                if isinstance(value, torch.Tensor) and value.dim() > 1 and value.shape[1] == self.tokens > 1:
                    kwargs[name] = value[:, self.part]
            out = inner(x, *args, **kwargs)
            if not last:
                return out
            miss = (kwargs.get("transformer_options") or {}).get(MISS_SLOT)
            # the error criterion's forecast difference, gathered as the hidden state is
            if miss is not None and miss.get("delta") is not None:
                miss["delta"] = self.gather(miss["delta"], 1, m.sequence_group, self.sizes)
            return self.gather(out, 1, m.sequence_group, self.sizes)
        return forward

    # --- self-attention across the ranks ---

    def attend(self, func, *args, **kwargs):
        """ComfyUI's attention, through the MODEL's own override when it has one (as one process runs it)."""
        if self.inner is not None:
            return self.inner(func, *args, **kwargs)
        return func(*args, **kwargs)

    def attention(self, func, *args, **kwargs):
        if not self.in_self_attention:
            return self.attend(func, *args, **kwargs)
        q, k, v = args[:3]
        heads = kwargs.get("heads", args[3] if len(args) > 3 else None)
        if kwargs.get("mask") is not None or kwargs.get("skip_reshape") or q.dim() != 3:
            raise Wan22InputError("ulysses_degree", "the experts' self-attention is not the plain Wan attention the "
                                                    "sequence split runs (a mask, or another layout): remove the "
                                                    "attention patch, or run without the parallel plan")
        m, sizes = self.mesh, self.sizes
        b, s, width = q.shape
        d = width // heads
        local = core.local_heads(heads, m.sequence)
        most = max(sizes)
        even = most * m.sequence == self.tokens  # every share the same length: nothing to pad or drop

        def scatter_heads(t):  # [b, own tokens, heads, d] -> [b, every token, own heads, d]
            t = F.pad(t.reshape(b, s, heads, d), (0, 0, 0, local * m.sequence - heads, 0, most - s))
            t = self.timed(all_to_all, t, 2, 1, m.sequence_group)
            return t if even else \
                torch.cat([t[:, j * most:j * most + size] for j, size in enumerate(sizes)], dim=1)

        q, k, v = (scatter_heads(t) for t in (q, k, v))
        n = q.shape[1]
        rest = dict(kwargs, heads=local)
        out = self.attend(func, q.reshape(b, n, local * d), k.reshape(b, n, local * d),
                          v.reshape(b, n, local * d), *args[4:], **rest).reshape(b, n, local, d)
        if not even:  # each rank's tokens padded to the longest share again
            out = torch.cat([F.pad(part, (0, 0, 0, 0, 0, most - part.shape[1]))
                             for part in out.split(sizes, dim=1)], dim=1)
        out = self.timed(all_to_all, out, 1, 2, m.sequence_group)
        return out[:, :s, :heads].reshape(b, s, heads * d)
