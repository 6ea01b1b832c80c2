"""Peers the quality benchmark compares against, as MODEL -> MODEL patches in the template's graph (per expert
MODEL -> [cache node] -> ModelSamplingSD3 -> KSamplerAdvanced, devtools/bed_runs.BedRuns.run's `patch`).

Spectrum (ComfyUI-Spectrum-WAN-Proper, GPL-3.0, not in the repository): its node SpectrumApplyWAN, one per
expert (backend wan22_high_noise / wan22_low_noise), loaded unmodified through devtools/third_party.py. It
forecasts the last block's output on skipped steps. It does not stay on its MODEL clone: it wraps
`apply_model` on the BaseModel and `forward_orig` / `_forward` on the Wan transformer, which every clone of
the loaded expert shares, and binds its runtime there; from then on every call of that expert, a run without
Spectrum included, runs with the last runtime applied (bit-identical to that Spectrum run). Its node
cannot undo this (enabled=False returns the MODEL untouched). So `spectrum_patch` applies it afresh per run
(a new runtime: no step history from an earlier run) and takes what it put on the shared objects off again
when that expert's sampling ends, leaving them as they were before: an uncached run after it is
bit-identical to one before it (tests/in_comfyui/test_peers.py)."""

from __future__ import annotations

import ast
import os

from devtools import third_party

SPECTRUM_BACKENDS = {"high": "wan22_high_noise", "low": "wan22_low_noise"}
_MARK = "_spectrum_wan"  # the prefix of the attributes it sets on the shared objects
_WRAPPED = ("apply_model", "forward_orig", "_forward")  # the methods it replaces there
_MISSING = object()
_SAVED = {}  # id(BaseModel) -> what the shared objects held before an application not yet taken off


def _node_defaults() -> dict:
    """SpectrumApplyWAN's inputs at their defaults (`model` left out; `backend` is set per role), read from
    its INPUT_TYPES in the pack's nodes.py without importing it; {} where the copy is not there."""
    path = os.path.join(third_party.FOLDER, third_party.PACKS["spectrum"][0], "nodes.py")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef) and cls.name == third_party.PACKS["spectrum"][1]:
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "INPUT_TYPES":
                    returned = next(n.value for n in ast.walk(fn) if isinstance(n, ast.Return))
                    required = ast.literal_eval(returned)["required"]
                    return {k: spec[1]["default"] for k, spec in required.items() if k != "model"}
    raise RuntimeError(f"{path} has no {third_party.PACKS['spectrum'][1]}.INPUT_TYPES")


SPECTRUM_DEFAULTS = _node_defaults()


def spectrum_missing() -> str | None:
    """Why Spectrum cannot be loaded here (None when it can)."""
    return third_party.missing("spectrum")


def spectrum_node(harness):
    """The SpectrumApplyWAN class, its pack loaded into the in-process ComfyUI `harness` (once per process)."""
    import nodes

    reason = spectrum_missing()
    if reason:
        raise RuntimeError(reason)
    third_party.load(harness, "spectrum")
    return nodes.NODE_CLASS_MAPPINGS[third_party.PACKS["spectrum"][1]]


def _shared(model) -> list:
    """The objects every clone of `model` shares that Spectrum can patch: its BaseModel, and the modules of
    its diffusion model that have a `forward_orig` (where Spectrum looks for the Wan transformer)."""
    outer = model.model
    return [outer] + [m for m in outer.diffusion_model.modules() if callable(getattr(m, "forward_orig", None))]


def spectrum_restore(model) -> None:
    """Takes Spectrum off the loaded expert that the MODEL `model` shares: the wrapped methods back as they
    were before the first application through spectrum_patch (or, on objects patched without it, the
    instance attributes removed, so the class's methods run again), and every `_spectrum_wan*` attribute
    (its runtime, markers, saved originals) removed. A no-op on a clean model."""
    saved = _SAVED.pop(id(model.model), (None, {}))[1]
    for obj in _shared(model):
        before = saved.get(id(obj), {})
        if not before and not any(k.startswith(_MARK) for k in vars(obj)):
            continue
        for name in _WRAPPED:
            value = before.get(name, _MISSING)
            if value is _MISSING:
                vars(obj).pop(name, None)
            else:
                vars(obj)[name] = value
        for key in [k for k in vars(obj) if k.startswith(_MARK)]:
            del vars(obj)[key]


def spectrum_patched(model) -> bool:
    """Whether Spectrum has left anything on the loaded expert that `model` shares."""
    return any(k.startswith(_MARK) for obj in _shared(model) for k in vars(obj))


def spectrum_patch(harness, **inputs):
    """`patch(role, MODEL) -> MODEL` for a run of the template's graph: SpectrumApplyWAN on the expert with the
    role's backend, its other inputs at SPECTRUM_DEFAULTS unless given. Each call is a fresh application (a
    new runtime) on a clean expert (leftovers of an application that never sampled are taken off first); the
    MODEL it returns carries an OUTER_SAMPLE wrapper that takes Spectrum off the shared expert when its
    sampling ends (spectrum_restore), so each MODEL serves one sampling: apply the patch again per run (as
    BedRuns.run does); a second sampling of the same MODEL raises rather than run without Spectrum."""
    import comfy.patcher_extension

    node = spectrum_node(harness)
    unknown = (set(inputs) - set(SPECTRUM_DEFAULTS)) | ({"backend"} & set(inputs))
    if unknown:
        raise ValueError(f"not SpectrumApplyWAN inputs set here: {sorted(unknown)}")

    def patch(role, model):
        spectrum_restore(model)
        outer = model.model
        _SAVED[id(outer)] = (outer, {id(obj): {n: vars(obj)[n] for n in _WRAPPED if n in vars(obj)}
                                     for obj in _shared(model)})
        settings = {**SPECTRUM_DEFAULTS, **inputs, "backend": SPECTRUM_BACKENDS[role]}
        patched = node().apply(model=model, **settings)[0]
        if patched is model:  # enabled=False: it returns the MODEL as it came and installs nothing
            spectrum_restore(model)
            return model
        runtime = patched.model_options["transformer_options"]["spectrum_wan_runtime"]

        def take_off_after(executor, *args, **kwargs):
            if getattr(outer, "_spectrum_wan_runtime", None) is not runtime:
                raise RuntimeError("a Spectrum MODEL from spectrum_patch serves one sampling: apply the patch "
                                   "again for each run")
            try:
                return executor(*args, **kwargs)
            finally:
                spectrum_restore(model)

        patched.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.OUTER_SAMPLE, "bench.peers.spectrum",
                                     take_off_after)
        return patched
    return patch
