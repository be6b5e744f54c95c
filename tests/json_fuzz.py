"""Hypothesis strategies for damaged JSON, shared by the loader fuzz tests and
the certificate fuzz tests: any value at any depth replaced, deleted, or a key
added."""

import copy
import json

from hypothesis import strategies as st

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70), st.floats(allow_nan=False), st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=6), c, max_size=3)),
    max_leaves=6,
)
deep = st.integers(60, 3000).map(lambda d: "[" * d + "]" * d)
deep_value = st.integers(60, 400).map(lambda d: json.loads("[" * d + "]" * d))  # json.dumps can write it


def paths(obj, prefix=()):
    """Every path (a tuple of keys and indices) into ``obj``, the root first."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from paths(v, prefix + (i,))


@st.composite
def mutated(draw, original, replacements=json_values):
    """A deep copy of ``original`` with one to three values replaced (drawn
    from ``replacements``), deleted, or a key added."""
    obj = copy.deepcopy(original)
    for _ in range(draw(st.integers(1, 3))):
        inner = [p for p in paths(obj) if p]
        if not inner:
            break
        path = draw(st.sampled_from(inner))
        parent = obj
        for k in path[:-1]:
            parent = parent[k]
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=6))] = draw(json_values)
        else:
            parent[path[-1]] = draw(replacements)
    return obj
