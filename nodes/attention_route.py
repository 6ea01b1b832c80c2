"""A newer ComfyUI's attention-route history, followed by a cached stage's forecasting calibrator.

Upstream ComfyUI (comfy_extras/sparse_attention_history.py, not in 0.30.0) lets an attention node publish, in
transformer_options[POLICIES], policies a forecasting cache asks before each model call for an identity of the
numerical route the call will take (its dense or sparse phase, its kernels); None means the route cannot be
vouched for. A forecast made from computed steps of one route must not be carried into another: a change of
identity, or no identity, must start the forecast afresh from steps computed on the new route.

So, with a calibrator, the stage asks the policies at the first call of each evaluation (`RouteFollow`, the
calibrator's part of the stage: stage_parts.py); where the identity is None or differs from the last one, the
stage's cache context is replaced by a fresh one before the call (its calibrator empty, its warm-up computing the
call): the forecast restarts from an anchor computed on this route. With no policies published, nothing is asked
and nothing changes.
"""

from __future__ import annotations

from types import SimpleNamespace

from .core.parallel import latent_tokens
from .stage_parts import Call, Part

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


class RouteFollow(Part):
    """A calibrator's stage following the attention route: a fresh context wherever the route of an evaluation is
    unvouched or changed; the contexts' outcomes merged into the stage's, and where each fresh forecast began
    (`fresh_forecasts`) in its report. `separate()`: whether the stage runs its prompts in separate calls."""

    def __init__(self, backend, diffusion_model, plan, role: str, separate):
        self.backend, self.model, self.plan, self.role, self.separate = backend, diffusion_model, plan, role, separate
        self.route = UNASKED  # the route's identity at the last evaluation
        self.contexts = []  # (the evaluation it began at, its outcome) of each context a route change replaced
        self.begun = 0  # the evaluation the stage's current context began at
        self.evaluation = -1  # the evaluation in progress, counted from 0

    def begin_evaluation(self) -> None:
        self.evaluation += 1

    def before(self, call: Call) -> None:
        if not call.first:
            return
        identity = route_identity(call.options, self.model, call.argument("x"))
        if identity is None or (self.route is not UNASKED and identity != self.route):
            self.contexts.append((self.begun, self.backend.outcome(self.model)))
            self.backend.refresh(self.model, self.plan, self.role, self.separate())
            self.begun = self.evaluation
        self.route = identity

    def outcome(self, outcome: dict) -> dict:
        return merged(self.contexts + [(self.begun, outcome)])

    def statistics(self) -> dict:
        if not self.contexts:
            return {}
        return {"fresh_forecasts": [begun for begun, _ in self.contexts[1:]] + [self.begun]}
