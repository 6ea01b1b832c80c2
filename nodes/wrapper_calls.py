"""The arguments of a call that a ComfyUI wrapper receives, found by name in the wrapped function's own
signature, never by position: ComfyUI reorders and adds parameters between versions."""

from __future__ import annotations

import inspect


def call_argument(executor, args: tuple, kwargs: dict, name: str):
    """The value of parameter `name` in the call `executor.original(*args, **kwargs)` (its default when the
    call leaves it out). `executor` is the WrapperExecutor ComfyUI hands every wrapper."""
    signature = inspect.signature(executor.original)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as e:
        raise RuntimeError(f"a call to {getattr(executor.original, '__qualname__', executor.original)} does not "
                           f"fit its own signature {signature} ({e})") from None
    bound.apply_defaults()
    if name in bound.arguments:
        return bound.arguments[name]
    for parameter in signature.parameters.values():  # passed through **kwargs
        if parameter.kind is inspect.Parameter.VAR_KEYWORD and name in bound.arguments.get(parameter.name, {}):
            return bound.arguments[parameter.name][name]
    raise KeyError(f"{getattr(executor.original, '__qualname__', executor.original)} has no parameter {name!r}")


def with_argument(executor, args: tuple, kwargs: dict, name: str, value) -> tuple[tuple, dict]:
    """The call's (args, kwargs) with parameter `name` set to `value`, found by name as call_argument finds it."""
    bound = inspect.signature(executor.original).bind(*args, **kwargs)
    bound.arguments[name] = value
    return bound.args, bound.kwargs


# ComfyUI's sampling tells the transformer which prompts a call carries: transformer_options["cond_or_uncond"],
# 0 for the positive (conditional) prompt, 1 for the negative (unconditional) one, one entry per batch chunk.
PROMPT_NAMES = {0: "positive", 1: "negative"}


def prompt_indices(transformer_options: dict) -> tuple[int, ...]:
    """The prompts one transformer call carries, as ComfyUI's sampling marks them (empty when it does not)."""
    return tuple(transformer_options.get("cond_or_uncond", ()))


def prompts_in(transformer_options: dict) -> int:
    """How many prompts (conditional, unconditional) one transformer call carries."""
    return len(prompt_indices(transformer_options)) or 1
