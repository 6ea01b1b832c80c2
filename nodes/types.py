"""The pack's socket types. The frontend only connects sockets whose type names match."""

from dataclasses import dataclass, field
from typing import Any

from comfy_api.latest import io

from .core.errors import Wan22InputError
from .core.schedule import RunSchedule

ExpertsType = io.Custom("WAN22_EXPERTS")
ScheduleType = io.Custom("WAN22_SCHEDULE")


@dataclass(frozen=True)
class ScheduleHandle:
    """What the schedule socket carries: core's schedule (a plain value) and, when it has a lead stage, the
    MODEL the lead runs on (the Lead Stage node's experts' high-noise expert), which core never holds."""

    schedule: RunSchedule
    lead_model: Any = field(default=None, repr=False, compare=False)

CATEGORY = "Wan2.2 Cache-DiT"

# A node's validate_inputs sees an input that takes a node's output (experts, schedule, MODEL, ...) as None
# when it is linked (its value is known only when the prompt runs), and as the value itself when the prompt gives
# a value instead of a link (an API client's `"experts": 5`). A null is caught when the node runs (linked_given).


def linked_only(**values) -> str | bool:
    """For validate_inputs: an input that takes a node's output but was given a value is refused by name;
    True when every one is linked (or left out, where it is optional)."""
    for name, value in values.items():
        if value is not None:
            return str(Wan22InputError(name, f"{value!r} is a value, but {name} takes a link: connect a node's "
                                             "output to it (in an API prompt, [node id, output index])"))
    return True


def linked_given(**values) -> None:
    """For execute: a required input that takes a node's output and was given null is refused by name."""
    for name, value in values.items():
        if value is None:
            raise Wan22InputError(name, f"is null, but {name} takes a link: connect a node's output to it (in an "
                                        "API prompt, [node id, output index])")
