"""Hypothesis strategies of the fuzz suites: any JSON value a hostile client sends, and a valid body (an API
prompt, a request) mutated at any depth, so that most generated cases come close to what is accepted."""

from __future__ import annotations

import copy

from hypothesis import strategies as st

HOSTILE_TEXTS = ("<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "../../etc/passwd", "/etc/passwd",
                 "C:\\Windows\\win.ini", "", " ", "none", "\x00", "\u202e", "%s%n", "x" * 10000, "é" * 300)
HOSTILE_NUMBERS = (float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 5e-324, 0, -1, 2**31, 2**63, 2**64,
                   10**30, -(10**30), 0.5, True, False)

scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=40) | st.sampled_from(HOSTILE_TEXTS) | st.sampled_from(HOSTILE_NUMBERS))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=20)


def nested(depth: int, leaf=0):
    """A list `depth` deep (built without recursion)."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def paths(value, prefix=()):
    """Every place in a JSON value: the value itself, and each key or index inside it, at any depth."""
    found, todo = [], [(prefix, value)]
    while todo:
        path, here = todo.pop()
        found.append(path)
        if isinstance(here, dict):
            todo += [((*path, key), inner) for key, inner in here.items()]
        elif isinstance(here, list):
            todo += [((*path, index), inner) for index, inner in enumerate(here)]
    return sorted(found, key=repr)


def at(value, path):
    for key in path:
        value = value[key]
    return value


@st.composite
def mutated(draw, base, values=json_values, max_changes: int = 3, near=()):
    """`base` with up to `max_changes` changes at places drawn from all of its places: a value replaced
    (by any JSON value, by one of `near`, values close to valid ones, or nested deep), a key deleted, a key
    added. Returns (body, changes), changes as (action, path)."""
    body, changes = copy.deepcopy(base), []
    replacement = values | (st.sampled_from(near) if near else values) | st.integers(2, 60).map(nested)
    for _ in range(draw(st.integers(1, max_changes))):
        path = draw(st.sampled_from(paths(body)))
        action = draw(st.sampled_from(("replace", "replace", "delete", "add")))
        if not path:
            action = "replace"
        if action == "replace":
            value = copy.deepcopy(draw(replacement))
            if not path:
                body = value
            else:
                at(body, path[:-1])[path[-1]] = value
        elif action == "delete":
            parent = at(body, path[:-1])
            parent.pop(path[-1])
        else:
            parent = at(body, path[:-1])
            if isinstance(parent, dict):
                parent[draw(st.text(max_size=12))] = draw(values)
            else:
                parent.append(draw(values))
        changes.append((action, path))
        if not isinstance(body, (dict, list)):
            break
    return body, changes
