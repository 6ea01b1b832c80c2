"""Training one expert of a test bed by flow matching in ComfyUI's convention for Wan (`x = s * noise + (1 - s) *
x0`, target `noise - x0`, timestep `1000 * s`): the high-noise expert on s >= 0.875, the low-noise expert below, a
single transformer (TI2V-5B) over every level. A tenth of the samples use the negative prompt (CFG dropout).
Deterministic for a config: one thread, seeded generators. It stops when the validation loss has not improved for
`patience` evaluations, or at `max_steps`, and keeps the best evaluated weights. With world.py, the beds' cache key.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from devtools.testbed.world import (BOUNDARY, PROMPT_TOKENS, SINGLE, TEXT_ROWS, TEXT_WIDTH, VACE_CHANNELS,
                                    BedConfig, World)


def model_config(config: BedConfig) -> dict:
    from devtools.tiny_wan import tiny_config

    out = tiny_config("ti2v" if config.single else "t2v", num_layers=config.num_layers, dim=config.dim,
                      ffn_dim=config.ffn_dim)
    if config.vace:
        out.update(vace_layers=list(config.vace_layers), vace_in_channels=VACE_CHANNELS)
    return out


def transformer_class(config: BedConfig):
    """diffusers' Wan transformer, or its VACE one (whose hints are added after config.vace_layers)."""
    from diffusers import WanTransformer3DModel, WanVACETransformer3DModel

    return WanVACETransformer3DModel if config.vace else WanTransformer3DModel


class ShortContextAttention:
    """Cross-attention over the prompt's token slots plus one zero row standing for all the zero rows of
    ComfyUI's 512: zero rows give identical keys and values, so attending to n of them equals attending to one
    with log(n) added to its logit (exact, and 40 times cheaper in the text embedding). Training only: the
    saved experts are sampled with the real 512 rows."""

    def __init__(self, zero_rows: int):
        self.bias = math.log(zero_rows)

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        query = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1)).transpose(1, 2)
        key = attn.norm_k(attn.to_k(encoder_hidden_states)).unflatten(2, (attn.heads, -1)).transpose(1, 2)
        value = attn.to_v(encoder_hidden_states).unflatten(2, (attn.heads, -1)).transpose(1, 2)
        mask = torch.zeros(1, key.shape[2], dtype=query.dtype)
        mask[0, -1] = self.bias
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
        out = out.transpose(1, 2).flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))


def short_contexts(world: World, classes: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
    """(n, PROMPT_TOKENS + 1, 4096): each sample's token slots (a class prompt, or the negative's tokens then
    zeros) and the zero row that stands for the rest of the 512."""
    out = torch.zeros(len(classes), PROMPT_TOKENS + 1, TEXT_WIDTH)
    for i, (c, neg) in enumerate(zip(classes.tolist(), negative.tolist())):
        tokens = world.negative if neg else world.prompts[c]
        out[i, :len(tokens)] = tokens
    return out


def draw_s(role: str, n: int, g: torch.Generator) -> torch.Tensor:
    """Noise levels for an expert: high U[0.875, 1]; low in [0, 0.875), half uniform, half where a shift-8
    schedule visits; one transformer (SINGLE) likewise over [0, 1)."""
    u = torch.rand(n, generator=g)
    if role == "high":
        return BOUNDARY + (1 - BOUNDARY) * u
    if role == SINGLE:
        pick = torch.rand(n, generator=g) < 0.5
        return torch.where(pick, u, 8 * u / (1 + 7 * u)).clamp(max=1 - 1e-4)
    shifted = 8 * u / (1 + 7 * u) * BOUNDARY
    uniform = u * BOUNDARY
    pick = torch.rand(n, generator=g) < 0.5
    return torch.where(pick, uniform, shifted).clamp(max=BOUNDARY - 1e-4)


def flow_batch(world: World, role: str, n: int, g: torch.Generator, dropout: float,
               size: tuple[int, int] | None = None):
    """One batch in ComfyUI's convention: (x_s, timestep 1000 s, short contexts, target noise - x0, and for a
    VACE bed each sample's control, else None)."""
    x0, classes, *controls = world.sample(n, g, size, controls=world.config.vace)
    negative = torch.rand(n, generator=g) < dropout
    s = draw_s(role, n, g)
    noise = torch.randn(x0.shape, generator=g)
    x = s[:, None, None, None, None] * noise + (1 - s[:, None, None, None, None]) * x0
    return x, 1000 * s, short_contexts(world, classes, negative), noise - x0, (controls or [None])[0]


def predict(model, x, t, ctx, control):
    """The model's prediction, with the batch's VACE control where the bed has one."""
    if control is None:
        return model(x, t, ctx, return_dict=False)[0]
    return model(x, t, ctx, control_hidden_states=control, return_dict=False)[0]


def train_expert(role: str, config: BedConfig, log=print) -> tuple[dict, dict]:
    """Trains one expert (one thread, deterministic for config.seed); returns (its best state dict in
    diffusers' names, its training log)."""
    torch.set_num_threads(1)
    torch.manual_seed(config.seed * 100 + (1 if role == "high" else 2))
    model = transformer_class(config)(**model_config(config))
    processor = ShortContextAttention(TEXT_ROWS - PROMPT_TOKENS)
    for block in [*model.blocks, *getattr(model, "vace_blocks", ())]:
        block.attn2.set_processor(processor)
    world = World(config)
    g_val = torch.Generator().manual_seed(config.seed * 100 + 50 + (1 if role == "high" else 2))
    sizes = config.sizes  # trained in turn, a batch of one size each step; validated on each alike
    validations = [flow_batch(world, role, config.validation // len(sizes), g_val, config.cfg_dropout, size)
                   for size in sizes]
    g = torch.Generator().manual_seed(config.seed * 100 + (11 if role == "high" else 12))
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01)

    def lr_at(step):
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        progress = (step - config.warmup_steps) / max(1, config.max_steps - config.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)

    def validate():
        model.eval()
        per_size = []
        with torch.no_grad():
            for validation in validations:
                losses = []
                for i in range(0, len(validation[0]), 16):
                    x, t, ctx, v, control = (None if part is None else part[i:i + 16] for part in validation)
                    losses.append(F.mse_loss(predict(model, x, t, ctx, control), v, reduction="sum"))
                per_size.append(float(sum(losses) / validation[0].numel()))
        model.train()
        return sum(per_size) / len(per_size)

    started = time.perf_counter()
    history = [{"step": 0, "validation": validate()}]
    best = (history[0]["validation"], 0, {k: v.clone() for k, v in model.state_dict().items()})
    stale, step, train_losses = 0, 0, []
    model.train()
    while step < config.max_steps:
        x, t, ctx, v, control = flow_batch(world, role, config.batch, g, config.cfg_dropout, sizes[step % len(sizes)])
        loss = F.mse_loss(predict(model, x, t, ctx, control), v)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        train_losses.append(float(loss))
        if step % config.eval_every == 0 or step == config.max_steps:
            val = validate()
            history.append({"step": step, "validation": val,
                            "train": sum(train_losses[-config.eval_every:]) / len(train_losses[-config.eval_every:])})
            log(f"[testbed] {role} step {step}: validation {val:.4f} ({time.perf_counter() - started:.0f} s)")
            if val < best[0] * 0.995:
                best, stale = (val, step, {k: v.clone() for k, v in model.state_dict().items()}), 0
            else:
                stale += 1
                if stale >= config.patience:
                    break
    return best[2], {"role": role, "steps": step, "best_step": best[1], "best_validation": best[0],
                     "first_validation": history[0]["validation"], "history": history,
                     "stopped": "plateau" if step < config.max_steps else "max_steps",
                     "seconds": round(time.perf_counter() - started, 1)}


def expert_model(config: BedConfig, state_dict: dict):
    """The trained expert as a diffusers model (the default attention: what ComfyUI's loader then reads)."""
    model = transformer_class(config)(**model_config(config))
    model.load_state_dict(state_dict)
    return model.eval().requires_grad_(False)
