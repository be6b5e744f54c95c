"""[bf16.ops.c1] The table of the bf16 profile in the spec's text and the
reference's ``ops.bf16.PROFILE`` say the same: the same ops, and for each
the same kind (bf16, binary32, int32) of every input and output in order."""

import re

import pytest

from refreplay import spec
from refreplay.ops import bf16 as OB

KIND = {"h": "h", "f": "f", "i32": "i"}
ROW = re.compile(r"^\s{4}(bf16_\w+(?:,\s*bf16_\w+)*)\s+\(([^)]*)\)\s*->\s*(\([^)]*\)|\w+ \w+)")


def _kinds(group: str) -> str:
    """ "(a h, W h, b i32)" or "y h" -> "hhi"."""
    out = []
    for item in group.strip("()").split(","):
        name, kind = item.split()
        out.append(KIND[kind])
    return "".join(out)


def spec_table(text: str) -> dict[str, tuple[str, str]]:
    table = {}
    for line in text.splitlines():
        m = ROW.match(line)
        if not m:
            continue
        ins, outs = _kinds(m.group(2)), _kinds(m.group(3))
        for op in re.split(r",\s*", m.group(1)):
            assert op not in table, f"{op} is listed twice in [bf16.ops.c1]"
            table[op.removeprefix("bf16_")] = (ins, outs)
    return table


def check_profile(profile):
    table = spec_table(spec.parse()["bf16.ops.c1"].text())
    assert len(table) >= 25, f"only {len(table)} rows parsed from [bf16.ops.c1]"
    assert set(table) == set(profile), sorted(set(table) ^ set(profile))
    wrong = {op: (table[op], profile[op]) for op in table if table[op] != profile[op]}
    assert not wrong, f"spec (inputs, outputs) vs PROFILE: {wrong}"


def test_the_profile_table_is_the_spec_table():
    check_profile(OB.PROFILE)


@pytest.mark.parametrize(
    "change",
    [
        {"add": ("hf", "h")},  # a kind changed
        {"rmsnorm_forward": ("hh", "hh")},  # an output's kind changed
        {"embedding_backward": ("hi", "f")},  # an input dropped
        {"extra_op": ("h", "h")},  # an op the spec does not list
    ],
)
def test_a_changed_profile_is_noticed(change):
    with pytest.raises(AssertionError):
        check_profile({**OB.PROFILE, **change})


def test_a_missing_op_is_noticed():
    with pytest.raises(AssertionError):
        check_profile({k: v for k, v in OB.PROFILE.items() if k != "rope_backward"})


@pytest.mark.parametrize(
    "edit",
    [
        (
            "bf16_rmsnorm_forward          (x h, w h) -> (out h, rrms f)",
            "bf16_rmsnorm_forward          (x h, w h) -> (out h, rrms h)",
        ),
        ("bf16_add                      (a h, b h) -> out h", "bf16_add                      (a h, b f) -> out h"),
    ],
)
def test_a_changed_row_is_noticed(edit):
    text = spec.parse()["bf16.ops.c1"].text()
    assert edit[0] in text
    changed = spec_table(text.replace(edit[0], edit[1]))
    assert changed != OB.PROFILE and {k: v for k, v in changed.items() if OB.PROFILE.get(k) != v}
