"""A newer ComfyUI's attention-route history, followed by a cached stage's forecasting calibrator.

Upstream ComfyUI (comfy_extras/sparse_attention_history.py, not in 0.30.0) lets an attention node publish, in
transformer_options[POLICIES], policies a forecasting cache asks before each model call for an identity of the
numerical route the call will take (its dense or sparse phase, its kernels); None means the route cannot be
vouched for. A forecast made from computed steps of one route must not be carried into another: a change of
identity, or no identity, must start the forecast afresh from steps computed on the new route.

So, with a calibrator, the stage asks the policies at the first call of each evaluation; where the identity is
None or differs from the last one, the stage's cache context is replaced by a fresh one before the call (its
calibrator empty, its warm-up computing the call): the forecast restarts from an anchor computed on this route.
With no policies published, nothing is asked and nothing changes.
"""

from __future__ import annotations

from types import SimpleNamespace

from .core.parallel import latent_tokens

POLICIES = "attention_backend_history_v1"
NONE = ()  # the identity of a stage with no policies published: one route throughout
UNASKED = object()  # a stage's route before its first evaluation (None is a route no policy vouches for)


def route_identity(options: dict, diffusion_model, x) -> tuple | None:
    """The identity of the route of the call about to run, from every published policy (sorted by provider), or
    None where one of them cannot vouch for it (returns None, raises, or the key is not the contract's shape)."""
    policies = options.get(POLICIES)
    if policies is None:
        return NONE
    if not isinstance(policies, dict):
        return None
    tokens = latent_tokens(x.shape, tuple(getattr(diffusion_model, "patch_size", (1, 2, 2))))
    layout = SimpleNamespace(seq_len=tokens, segments=((0, tokens),), signature=tuple(x.shape))
    found = []
    for provider in sorted(policies, key=str):
        try:
            identity = policies[provider](layout=layout, options=options, model=diffusion_model)
        except Exception:  # a policy that cannot read this model vouches for nothing
            return None
        if identity is None:
            return None
        found.append((str(provider), identity))
    return tuple(found)


def merged(parts: list[tuple[int, dict]]) -> dict:
    """One stage's cache outcome from those of its successive contexts, each (the evaluation it began at, its
    outcome): their step indices made the stage's."""
    out = {"cached_steps": [], "cfg_cached_steps": [], "residual_diffs": {}}
    for offset, outcome in parts:
        out["cached_steps"] += [offset + s for s in outcome["cached_steps"]]
        out["cfg_cached_steps"] += [offset + s for s in outcome["cfg_cached_steps"]]
        out["residual_diffs"].update({str(offset + int(k)): v for k, v in outcome["residual_diffs"].items()})
    out["cached_steps"].sort()
    out["cfg_cached_steps"].sort()
    return out
