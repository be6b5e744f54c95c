"""Why a kernel fails ([conf.diagnosis.r1]): conclusions drawn from which probe families failed
and which passed, each citing the clauses it rests on.

A family isolates one property (see ``cases.FAMILIES``), so the pattern of
failures names the broken rule.  For a sum that fails, the candidate orders
of ``orders.py`` are evaluated on the failing case's inputs and the ones that
reproduce the kernel's output exactly are named: on the failing order probes,
or, where only random cases fail (a live run at a model's shapes has nothing
else), on those cases or slices of them.  For a transformer op, which
has random cases only, the op is re-evaluated on the smallest failing cases
with the spec's algorithm changed in one or two places (``variants.py``) and
the variants that reproduce the kernel, or else the closest one, are named.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..base import deviant as fp
from ..readings import orders
from ..readings import transformer as variants
from ..base.case import load_inputs
from ..table import OPS
from .slices import SLICE_FROM, model_bytes, slices
from .slices import stored as _stored


@dataclass
class Finding:
    op: str
    message: str
    clauses: list[str]

    def text(self) -> str:
        return f"{self.op}: {self.message} — see " + " ".join(f"[{c}]" for c in self.clauses)


def _by_family(results):
    fam: dict[str, tuple[list, list]] = {}
    for r in results:
        if r.status == "skip" or not r.actual:  # skipped or errored: no output to reason about
            continue
        bad = r.status in ("fail", "xfail")
        fam.setdefault(r.case.family, ([], []))[0 if bad else 1].append(r)
    return fam


def _zero_sign_only(r) -> bool:
    """Every element where the case differs is a zero of the other sign."""
    for n, e in r.case.outputs.items():
        a = np.asarray(r.actual.get(n, np.zeros(0)))
        if e.dtype != np.float32 or a.dtype != e.dtype or a.shape != e.shape:
            return False
        diff = fp.bits(e.ravel()) != fp.bits(a.ravel())
        if not np.all((e.ravel()[diff] == 0) & (a.ravel()[diff] == 0)):
            return False
    return True


def _rounded_inputs_reproduce(op, r, keep) -> bool:
    """The spec's op on inputs whose significands are rounded to ``keep`` bits gives the kernel's output."""
    if not r.actual or len(op.outputs) != 1 or next(iter(r.case.outputs.values())).dtype != np.float32:
        return False
    inputs = [
        fp.round_mantissa(x, keep) if x.dtype == np.float32 else x for x in load_inputs(list(r.case.inputs.values()))
    ]
    return _same(op.reference(*inputs), _flat_actual(r))


def _tf32_keep(op, fam):
    """10 (TF32) or 7 (bfloat16) when rounding the inputs to that many bits
    reproduces every failing tf32 probe; None otherwise."""
    bad = fam.get("tf32", ([], []))[0]
    for keep in (10, 7):
        if bad and all(_rounded_inputs_reproduce(op, r, keep) for r in bad):
            return keep
    return None


def _explain_away(op, fam):
    """[conf.diagnosis.r1] A probe fails for its own property only: failing
    cases that another, established deviation fully explains are taken out
    of the other families, so one deviation gets one finding.  A +0 start
    shows up wherever an output is a sum of zeros (load and flush probes
    too); TF32 inputs change the products of the flush probes."""
    explains = []
    if fam.get("signed_zero", ([], []))[0] and all(_zero_sign_only(r) for r in fam["signed_zero"][0]):
        explains.append(("signed_zero", _zero_sign_only))
    keep = _tf32_keep(op, fam)
    if keep is not None:
        explains.append(("tf32", lambda r: _rounded_inputs_reproduce(op, r, keep)))
    for name, (bad, good) in list(fam.items()):
        for owner, explained in explains:
            if name != owner:
                bad = [r for r in bad if not explained(r)]
        fam[name] = (bad, good)
    return fam


def _count(fam, name):
    bad, good = fam.get(name, ([], []))
    return f"{len(bad)} of {len(bad) + len(good)} {name} probes fail"


def _flat_actual(r):
    return np.asarray(next(iter(r.actual.values())), dtype=np.float32).ravel()


def _same(x, y) -> bool:
    x, y = np.asarray(x, np.float32).ravel(), np.asarray(y, np.float32).ravel()
    if x.shape != y.shape:
        return False
    return bool(np.all((fp.bits(x) == fp.bits(y)) | (np.isnan(x) & np.isnan(y))))


def matching_orders(op, r) -> list[str]:
    """Candidate orders that reproduce the kernel's output on this case."""
    if op.terms is None or not r.actual or next(iter(r.actual.values())).dtype != np.float32:
        return []
    a, b = op.terms(*load_inputs(list(r.case.inputs.values())))
    actual = _flat_actual(r)
    return [c.name for c in orders.candidates(b is not None) if _same(c(a, b), actual)]


ORDER_CASES = 16  # failing order probes a candidate order must reproduce


def _order_finding(op, fam):
    bad, good = fam.get("order", ([], []))
    if not bad:
        return None
    clause = [c for c in op.clauses if c.startswith(("mm.", "red."))]
    ran = [x for x in bad if x.status != "error"][:ORDER_CASES]
    matched = [set(matching_orders(op, r)) for r in ran]
    common = set.intersection(*matched) if matched else set()
    cands = orders.candidates(op.terms is not None)
    names = [c.name for c in cands if c.name in common]
    # a candidate is named the order only if it reproduces every failing probe re-evaluated
    hits = {c.name: sum(c.name in m for m in matched) for c in cands}
    part = max(hits, key=hits.get, default=None)
    if names:
        what = "output matches " + "; ".join(names)
        if len(ran) < len(bad):
            what += f" (on all {len(ran)} failing order probes re-evaluated)"
    elif part and hits[part]:
        what = (
            f"partial: the closest candidate, {part}, reproduces {hits[part]} of the {len(ran)} failing order "
            f"probes re-evaluated; no candidate reproduces them all"
        )
    else:
        what = (
            "matches none of the candidate orders (reversed, pairwise, blocked/split-k, strided lanes, NumPy pairwise)"
        )
    return Finding(op.name, f"sums in a different order — {_count(fam, 'order')}; {what}", clause)


ORDER_FAMILIES = ("random", "sweep")  # failing cases on which the candidate orders are tried when no order probe fails
ORDER_SCREEN = 512  # sums of each case every candidate order is first tried on (half of them differing, if so many)


def _agree(x, y) -> np.ndarray:
    """Element-wise: the same bits, or both NaN."""
    return (fp.bits(x) == fp.bits(y)) | (np.isnan(x) & np.isnan(y))


def _f32_result(r) -> bool:
    if not r.actual or len(r.case.outputs) != 1:
        return False
    e, a = next(iter(r.case.outputs.values())), np.asarray(next(iter(r.actual.values())))
    return e.dtype == np.float32 and a.dtype == np.float32 and a.shape == e.shape


class _Sums:
    """Case ``r`` (whole or a slice) as the op's R sums of N terms
    (``op.terms``), with the spec's and the kernel's result for each."""

    def __init__(self, op, r):
        self.a, self.b = op.terms(*load_inputs(list(r.case.inputs.values())))
        self.actual = _flat_actual(r)
        self.differ = ~_agree(np.asarray(next(iter(r.case.outputs.values())), np.float32).ravel(), self.actual)

    def screen(self, most: int) -> np.ndarray:
        """Up to ``most`` sums: differing ones first (up to half), then ones where the kernel agrees."""
        hit, same = np.flatnonzero(self.differ), np.flatnonzero(~self.differ)
        take = hit[: max(most // 2, most - same.size)]
        return np.sort(np.concatenate([take, same[: most - take.size]]))

    def tally(self, cands, rows=None) -> dict:
        """name -> (reproduces every sum, differing sums it reproduces, sums
        where the kernel has the spec's bits and it has not), on ``rows`` (all)."""
        a, b, actual, differ = self.a, self.b, self.actual, self.differ
        if rows is not None:
            a, b, actual, differ = a[rows], None if b is None else b[rows], actual[rows], differ[rows]
        out = {}
        for c in cands:
            got = np.asarray(c(a, b), np.float32).ravel()
            hit = _agree(got, actual) if got.shape == actual.shape else np.zeros(actual.shape, bool)
            out[c.name] = (bool(hit.all()), int(np.count_nonzero(hit & differ)), int(np.count_nonzero(~hit & ~differ)))
        return out


def _order_passing(op, results) -> list:
    """Up to ``PASSING_CASES`` random or sweep cases the kernel passes, the
    largest first (the longest sums, where the candidate orders differ
    most), a case over ``SLICE_FROM`` cut to a slice of it (``slices``)."""
    good = [r for r in results if r.status in ("pass", "xpass") and r.case.family in ORDER_FAMILIES]
    good.sort(key=lambda r: (r.case.family != "random", -model_bytes(op, r)))
    out = []
    for r in good:
        if len(out) == PASSING_CASES:
            break
        if model_bytes(op, r) > SLICE_FROM:
            subs = slices(op, r)
            if not subs:
                continue
            r = subs[0][0]
        if _f32_result(r):
            out.append(r)
    return out


def _cases(n: int, what: str = "") -> str:
    return f"{n} {what}case{'s' if n != 1 else ''}"


def _case_order_finding(op, fam, results) -> tuple[Finding | None, str]:
    """[conf.diagnosis.r1] For a sum with no variant model (the matmuls, the
    plain sums) whose failing random or sweep cases (whole, or the slices
    ``_bounded`` made of them) no order probe covers: the candidate orders
    of ``orders.py`` on those cases.  Every candidate is tried on up to
    ``ORDER_SCREEN`` sums of each of the ``VARIANT_CASES`` failing cases
    with the shortest sums; the ones that reproduce those are evaluated on
    every sum of up to ``VERIFY_CASES`` failing cases and of up to
    ``PASSING_CASES`` cases the kernel passes.  An order is named only if it
    reproduces every element of all of them (every differing one, and the
    kernel's agreement with the spec elsewhere); otherwise (None, a sentence
    with the closest candidate's counts) for the finding that says how far
    the outputs are off."""
    if op.terms is None or op.name in variants.MODELS:
        return None, ""
    bad = [r for f in ORDER_FAMILIES for r in fam.get(f, ([], []))[0] if r.status != "error" and _f32_result(r)]
    if not bad:
        return None, ""
    length = {id(r): _Sums(op, r).a.shape[1] for r in bad}
    # random cases first, the shortest sums first: a candidate folds its terms one k at a time
    bad = sorted(bad, key=lambda r: (r.case.family != "random", length[id(r)], model_bytes(op, r)))[:VERIFY_CASES]
    first = [_Sums(op, r) for r in bad[:VARIANT_CASES]]
    cands = [c for c in orders.candidates(first[0].b is not None) if not c.spec]
    rows = [s.screen(ORDER_SCREEN) for s in first]
    tallies = [s.tally(cands, ix) for s, ix in zip(first, rows)]
    screened = [c for c in cands if all(t[c.name][0] for t in tallies)]
    differ = sum(int(np.count_nonzero(s.differ[ix])) for s, ix in zip(first, rows))
    del first  # the terms of every case are not held at once
    verified = screened
    for r in bad:
        if not verified:
            break
        t = _Sums(op, r).tally(verified)
        verified = [c for c in verified if t[c.name][0]]
    passing = _order_passing(op, results)
    broken = {c.name: 0 for c in verified}  # elements of the passing cases the candidate changes
    for r in passing:
        if not verified:
            break
        t = _Sums(op, r).tally(verified)
        for c in verified:
            broken[c.name] += t[c.name][2]
    named = [c for c in verified if not broken[c.name]]
    fams = "/".join(sorted({r.case.family for r in bad}))
    on = f"all {len(bad)} failing {fams} cases" if len(bad) > 1 else f"the failing {fams} case"
    if named:
        what = named[0].name if len(named) == 1 else "any of: " + "; ".join(c.name for c in named)
        also = f" and of the {_cases(len(passing))} it passes" if passing else ""
        fused, sequential = all(c.fused for c in named), all(c.name.startswith("sequential") for c in named)
        if sequential:  # the spec's order: what differs is the contraction or the start
            lead = "contracts multiply-add (a*b + c rounded once)" if fused else "starts its sums from +0, not -0"
        else:
            lead = "sums in a different order" + (", with multiply-add contracted" if fused else "")
        clauses = [c for c in op.clauses if c.startswith(("mm.", "red."))] + (["num.nofma.c1"] if fused else [])
        msg = f"{lead} — no probe isolates it; output matches {what} (every element of {on} re-evaluated{also})"
        return Finding(op.name, msg, clauses), ""
    if verified:  # every failing case, but not the passing ones
        n = verified[0].name
        return None, (
            f"; the candidate order {n} reproduces every element of {on} re-evaluated, but changes "
            f"{broken[n]} elements of the {_cases(len(passing))} the kernel passes, so no order is named "
            f"(the kernel may change its order with shape)"
        )
    n_first = len(tallies)
    sums = sum(ix.size for ix in rows)
    smallest = f"{sums} sums of the {_cases(n_first, 'failing ')} with the shortest sums"
    if screened:
        return None, (
            f"; the candidate order {screened[0].name} reproduces the {smallest} but not every element of "
            f"{on} re-evaluated, so no order is named"
        )
    score = {
        c.name: (sum(t[c.name][1] - t[c.name][2] for t in tallies), sum(t[c.name][1] for t in tallies)) for c in cands
    }
    best = max(score, key=score.get)
    explained = score[best][1]
    if not explained:
        return None, (
            f"; no candidate order (reversed, pairwise, blocked/split-k, strided lanes, NumPy pairwise, each "
            f"with and without fused multiply-add) reproduces any of the {differ} differing elements among "
            f"the {smallest}"
        )
    changed = sum(t[best][2] for t in tallies)
    return None, (
        f"; partial: the closest candidate order, {best}, reproduces {explained} of the {differ} differing "
        f"elements among the {smallest}"
        + (f" and changes {changed} where the kernel has the spec's bits" if changed else "")
        + "; no candidate order reproduces them all"
    )


def _outputs_where(fam, family, pred):
    """Elements of failing cases of ``family`` where pred(expected, actual)."""
    hits = 0
    for r in fam.get(family, ([], []))[0]:
        if not r.actual:
            continue
        for n, e in r.case.outputs.items():
            a = np.asarray(r.actual[n])
            if e.dtype == np.float32 and a.shape == e.shape and a.dtype == e.dtype:
                hits += int(pred(e.ravel(), a.ravel()).sum())
    return hits


def _flush_mode_findings(op_name, fam, failing) -> list[Finding]:
    """[num.flush.c1] Which hardware flush a kernel behaves like, from the two
    windows of products just below FLT_MIN (``values.window_pairs``): the
    spec rounds both up to FLT_MIN; ARM FZ (tininess before rounding) flushes
    both; x86 MXCSR.FTZ (tininess on the result rounded with an unbounded
    exponent) flushes only the lower window."""
    zero = lambda e, a: (np.abs(e) == fp.FLT_MIN) & (a == 0)
    before = "ftz_before_rounding" in failing
    after = "ftz_after_rounding" in failing
    out = []
    if before:
        how = (
            "flushes before rounding: products FLT_MIN (1 - d), 0 < d <= 2^-25, that IEEE rounds up to "
            "FLT_MIN come out 0 (tininess judged on the exact product, as ARM's FZ mode does)"
            if _outputs_where(fam, "ftz_before_rounding", zero)
            else "products just below FLT_MIN do not round to FLT_MIN"
        )
        out.append(Finding(op_name, f"{how} — {_count(fam, 'ftz_before_rounding')}", ["num.flush.c1"]))
    if after and not before:
        how = (
            "flushes the way x86 FTZ (MXCSR.FTZ) does: tininess judged on the product rounded to 24 bits "
            "with an unbounded exponent, so products FLT_MIN (1 - d), 2^-25 < d <= 2^-24, that IEEE "
            "rounds up to FLT_MIN come out 0 (0xAB123191 x 0x14E0241F: IEEE and the spec give 0x80800000, "
            "x86 FTZ 0x80000000); the spec flushes the IEEE (gradual-underflow) result, so x86 FTZ is not "
            "the spec's flush"
            if _outputs_where(fam, "ftz_after_rounding", zero)
            else "products just below FLT_MIN do not round to FLT_MIN"
        )
        out.append(Finding(op_name, f"{how} — {_count(fam, 'ftz_after_rounding')}", ["num.flush.c1"]))
    return out


def _nan_patterns(fam):
    pats = set()
    for r in [r for bad, _ in fam.values() for r in bad]:
        for n, e in r.case.outputs.items():
            a = np.asarray(r.actual.get(n, np.zeros(0)))
            if a.dtype == np.float32 and a.shape == e.shape:
                bad = np.isnan(a.ravel()) & (fp.bits(a.ravel()) != fp.CANONICAL_NAN)
                pats |= {f"0x{int(b):08X}" for b in fp.bits(a.ravel()[bad])[:50]}
    return sorted(pats)


NAN_ASIDE = "with NaN payloads set aside: "


def _nan_canonical(r):
    """[num.nan.c1] ``r`` with every binary32 NaN the kernel gave made the
    canonical NaN, and its status judged again: what the kernel's other
    arithmetic does, with its NaN payloads set aside."""
    if r.status not in ("fail", "xfail") or not r.actual:
        return r
    actual = dict(r.actual)
    for n, e in r.case.outputs.items():
        a = np.asarray(actual.get(n, np.zeros(0)))
        if f"out/{n}" in r.case.bf16:  # [bf16.round.c1]: a NaN is bf16(0x7FC0); a bf16 NaN is any pattern above 0x7F80
            if a.dtype == np.uint16 and e.dtype == np.uint16:
                nan16 = (a & np.uint16(0x7FFF)) > np.uint16(0x7F80)
                actual[n] = np.where(nan16, np.uint16(0x7FC0), a).astype(np.uint16)
        elif a.dtype == np.float32 and e.dtype == np.float32:
            actual[n] = np.where(np.isnan(a), fp.f32(fp.CANONICAL_NAN), a).astype(np.float32)
    same = all(
        n in actual
        and np.asarray(actual[n]).shape == e.shape
        and np.asarray(actual[n]).dtype == e.dtype
        and np.array_equal(np.asarray(actual[n]).view(np.uint8), e.view(np.uint8))
        for n, e in r.case.outputs.items()
    )
    return replace(r, actual=actual, status=("xpass" if r.status == "xfail" else "pass") if same else r.status)


def diagnose(op_name: str, results) -> list[Finding]:
    """[conf.diagnosis.r1] The findings for one op.  A non-canonical NaN never
    hides another difference: the op is diagnosed again with the kernel's NaNs
    made canonical, and what remains is reported after the NaN finding.
    A failing case too large to re-evaluate whole (the variant models, the
    bf16 misreadings) is re-evaluated on a slice of it, or else, above
    ``MODEL_BUDGET``, left out (``_bounded``); a finding says which."""
    out = _bounded(op_name, results)
    nan = [f for f in out if f.message.startswith("non-canonical NaN")]
    bf16 = [f for f in out if f.message.startswith("non-canonical bf16 NaN")]
    if not (nan or bf16):
        return out
    aside = [_nan_canonical(r) for r in results]
    if not any(r.status in ("fail", "xfail") for r in aside):
        return out  # the NaN payloads are the only difference
    skip = ("the kernel failed to run", "non-canonical NaN", "non-canonical bf16 NaN", TOO_BIG, SLICED)
    rest = [f for f in _bounded(op_name, aside) if not f.message.startswith(skip)]
    errors = [f for f in out if f.message.startswith("the kernel failed to run")]
    # a finding the first pass made too stands as it is; one the NaNs hid says how it was found
    first = {f.message for f in out}
    return (
        errors
        + nan
        + bf16
        + [f if f.message in first else Finding(f.op, NAN_ASIDE + f.message, f.clauses) for f in rest]
    )


MODEL_BUDGET = 1 << 30  # bytes the re-evaluation of one case may take
# a failing case above ``SLICE_FROM`` is re-evaluated on a slice where the op splits (``slices``), and a
# passing one is not re-evaluated: every variant is evaluated on it, so time as well as memory
# grows with it (no committed vector the variants see comes near: 12 MiB; a sweep case 48 MiB)
TOO_BIG = "diagnosis skipped"
SLICED = "diagnosed on a slice"


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


def _reevaluated(op) -> str:
    """What the diagnosis re-evaluates on a case of ``op``, for the slice note."""
    if op.name in variants.MODELS:
        return "for each variant of the algorithm"
    if op.bf16:
        return "for each misreading of the bf16 profile"
    if op.terms is not None:
        return "for each candidate summation order"
    return "to re-evaluate"


def _bounded(op_name, results) -> list[Finding]:
    """``_diagnose`` with each failing case too large to re-evaluate replaced
    by slices of it that fit (``slices``), or else left out of every
    re-evaluation, then a finding naming them."""
    op = OPS[op_name]
    big, notes, kept = [], [], []
    for r in results:
        need = model_bytes(op, r) if r.status in ("fail", "xfail") and r.actual else 0
        subs = slices(op, r) if need > SLICE_FROM else []
        if subs:
            kept += [sub for sub, _ in subs]
            notes.append(f"{r.case.id} at its {'; and at its '.join(where for _, where in subs)}")
        else:
            kept.append(r)
            if need > MODEL_BUDGET:
                big.append((r, need))
    results = kept
    too_big = {id(r) for r, _ in big}
    out = _diagnose(op_name, results, fits=lambda r: id(r) not in too_big)
    if notes:
        out.append(
            Finding(
                op_name,
                f"{SLICED}: {'; '.join(notes[:4])}{f'; and {len(notes) - 4} more' if len(notes) > 4 else ''} "
                f"(a whole case would take over {_gib(SLICE_FROM)} {_reevaluated(op)}; the "
                f"slice's outputs are the case's own there)",
                ["conf.diagnosis.r1"],
            )
        )
    if big:
        r, need = max(big, key=lambda rb: rb[1])
        n = len(big)
        out.append(
            Finding(
                op_name,
                f"{TOO_BIG} on {n} failing case{'s' if n > 1 else ''} (largest: {r.case.id}): re-evaluating "
                f"the spec's algorithm and its variants there would need about {_gib(need)}, above the "
                f"diagnosis budget of {_gib(MODEL_BUDGET)}; the findings above rest on the other cases "
                f"and on the outputs alone",
                ["conf.diagnosis.r1"],
            )
        )
    return out


def _diagnose(op_name: str, results, fits=lambda r: True) -> list[Finding]:
    """``fits(r)``: whether a model may be re-evaluated on failing case ``r``."""
    op = OPS[op_name]
    fam = _explain_away(op, _by_family(results))
    out: list[Finding] = []
    if op.bf16:  # [bf16.probes.c1] a profile misreading explains its cases away from the binary32 probes
        found, explained = _bf16_findings(op, results, fits)
        out += found
        fam = {f: ([r for r in bad if id(r) not in explained], good) for f, (bad, good) in fam.items()}
    failing = {f for f, (bad, good) in fam.items() if bad}
    errors = [r for r in results if r.status == "error"]
    if errors:
        out.append(
            Finding(
                op_name,
                f"the kernel failed to run on {len(errors)} cases (first: {errors[0].case.id}: {errors[0].message})",
                ["conv.conformance.c1"],
            )
        )
    if "fma" in failing and op.bf16:  # [bf16.exact.r1] only a product below 2^-126 can tell, and both keep it
        out.append(
            Finding(
                op_name,
                f"keeps a product below 2^-126 that the spec flushes: a fused multiply-add or "
                f"unflushed (gradual-underflow) products, which bf16's exact products make "
                f"indistinguishable — {_count(fam, 'fma')}",
                ["num.nofma.c1", "num.flush.c1", "bf16.exact.r1"],
            )
        )
    elif "fma" in failing:
        out.append(
            Finding(op_name, f"contracts multiply-add (a*b + c rounded once) — {_count(fam, 'fma')}", ["num.nofma.c1"])
        )
    f = _order_finding(op, fam)
    if f:
        out.append(f)
    # only random or sweep cases fail (a live run has no probes): the candidate orders on those cases themselves
    f, order_note = _case_order_finding(op, fam, results) if failing <= set(ORDER_FAMILIES) else (None, "")
    if f:
        out.append(f)
    out += _flush_mode_findings(op_name, fam, failing)
    if "flush" in failing:
        s = _outputs_where(fam, "flush", lambda e, a: (e == 0) & fp.is_subnormal(a))
        t = _outputs_where(fam, "flush", lambda e, a: (e == 0) & (a != 0) & (np.abs(a) <= 2 * fp.FLT_MIN))
        how = (
            "does not flush subnormal results to zero (IEEE gradual underflow; the spec flushes the "
            "IEEE result after rounding)"
            if s
            else "does not flush subnormal results to zero: unflushed subnormal products or partial sums "
            "reach the output (2^-127 + 2^-127 gives FLT_MIN instead of 0)"
            if t
            else "subnormal results handled differently"
        )
        out.append(Finding(op_name, f"{how} — {_count(fam, 'flush')}", ["num.flush.c1"]))
    if "input_zeroing" in failing:
        out.append(
            Finding(op_name, f"does not zero subnormal inputs — {_count(fam, 'input_zeroing')}", ["num.load.c1"])
        )
    pats = _nan_patterns(fam)
    if pats:
        out.append(
            Finding(op_name, f"non-canonical NaN ({', '.join(pats[:4])} where 0x7FC00000 is required)", ["num.nan.c1"])
        )
    elif "nan" in failing:
        out.append(Finding(op_name, f"NaN handling differs — {_count(fam, 'nan')}", ["num.nan.c1"]))
    if "signed_zero" in failing:
        clause = [c for c in op.clauses if c.startswith(("red.", "num.minmax", "mm."))] or list(op.clauses)
        rule = {"max": "max(-0, +0) is +0", "fmax": "fmax(-0, +0) is +0", "fmin": "fmin(-0, +0) is -0"}.get(
            op_name,
            "a sum of -0 terms is -0: start the sum from -0, not +0"
            if op.terms
            else "a zero result has the sign IEEE gives it",
        )
        out.append(Finding(op_name, f"sign of zero differs ({rule}) — {_count(fam, 'signed_zero')}", clause))
    if "empty" in failing and op_name not in variants.MODELS:  # there the variant finding says what differs
        out.append(
            Finding(
                op_name,
                f"an empty reduction differs (the empty sum is +0, not the -0 a sum starts "
                f"from; the empty maximum is -inf) — {_count(fam, 'empty')}",
                list(dict.fromkeys(["red.sum.c1"] + [c for c in op.clauses if c.startswith("red.")])),
            )
        )
    if failing == {"sweep"}:  # otherwise the short cases already say what differs
        out.append(_sweep_finding(op, fam))
    if "vendor_transcendental" in failing:
        out.append(
            Finding(
                op_name,
                f"uses a vendor {op_name} (libm, NumPy, CUDA) instead of the spec's algorithm "
                f"— {_count(fam, 'vendor_transcendental')}",
                list(op.clauses),
            )
        )
    if "tf32" in failing:
        out.append(_tf32_finding(op, fam))
    f = _variant_finding(op, results, fits)
    if f:
        out.append(f)
    if not out and failing:
        f = _unexplained_finding(op, [r for f in sorted(failing) for r in fam[f][0]], failing, results)
        out.append(Finding(f.op, f.message + order_note, f.clauses))
    elif order_note:
        out.append(Finding(op_name, order_note.removeprefix("; "), list(op.clauses)))
    return out


def _unexplained_finding(op, bad, failing, results=()):
    """What can still be said when no probe isolates a failure and the op has
    no variant model: a sign of zero alone (a sum started from +0), special
    inputs under every difference, or how far the binary32 outputs are off
    (a few ulp: another order, fused or vendor arithmetic; far: another
    formula).  The finding leads (the results table shows the message up to
    its first detail); where it was measured follows."""
    where = f"no diagnostic probe isolates it (fails {', '.join(sorted(failing))} cases, first: {bad[0].case.id})"
    if all(_zero_sign_only(r) for r in bad):
        if _outputs_where(
            {"x": (bad, [])},
            "x",
            lambda e, a: (e == 0) & (a == 0) & (fp.bits(e) != fp.bits(a)) & (fp.bits(e) != np.uint32(0x80000000)),
        ):
            return Finding(op.name, f"only the sign of zero differs; {where}", list(op.clauses))
        return Finding(
            op.name,
            f"the spec's -0 comes out +0 (a sum started from +0 instead of -0 does this); {where}",
            list(dict.fromkeys(list(op.clauses) + ["red.sum.c1"])),
        )
    plus, also = _plus_zero_note(bad)
    # ordinary values first: edge cases hold specials and extremes whose ulp distances say little
    measured = [r for r in bad if r.case.family == "random"] or bad
    dists, total, nan_vs_number = [], 0, 0
    for r in measured:
        for n, e in r.case.outputs.items():
            a = np.asarray(r.actual.get(n, np.zeros(0)))
            if e.dtype != np.float32 or a.dtype != e.dtype or a.shape != e.shape:
                continue
            d = fp.ulp_distance(e.ravel(), a.ravel())
            dists.append(d[d > 0])
            total += d.size
            nan_vs_number += int(np.count_nonzero(np.isnan(e.ravel()) != np.isnan(a.ravel())))
    d = np.concatenate(dists) if dists else np.zeros(0, np.int64)
    differ = d.size + nan_vs_number
    if not differ:
        return Finding(op.name, f"outputs differ; {where}", list(op.clauses))
    counted = f"{where}; in its {measured[0].case.family} cases {differ} of {total} binary32 output elements differ"
    special = _special_inputs_at_differences(op, measured)
    if special:
        return Finding(op.name, f"differs only where the input {special}; {counted}", list(op.clauses))
    if nan_vs_number:
        return Finding(
            op.name,
            _located(f"gives a NaN where the spec has a number, or the reverse; {counted}", op, results),
            list(op.clauses),
        )
    med, worst = (int(np.median(d)), int(d.max())) if d.size else (0, 0)
    if med <= 16:
        near_zero = ", where cancellation leaves a result near zero" if worst > 1 << 10 else ""
        size = (
            f"differs by a median of {med} ulp (max {worst}{near_zero}): a different summation order, "
            f"fused operations or vendor functions give differences of this size"
        )
    else:
        size = f"differs by a median of {med} ulp (max {worst}): more than rounding, another formula"
    clauses = list(op.clauses) + (["red.sum.c1"] if plus and "red.sum.c1" not in op.clauses else [])
    return Finding(op.name, _located(f"{size}; {counted}", op, results) + also, clauses)


def _size(r):
    return sum(x.size for x in r.case.inputs.values())


def _sweep_finding(op, fam):
    """[conf.probes.c1] Only the sweep cases fail: where along the lengths the
    kernel stops matching, and whether a split of the sum in two halves
    reproduces the smallest failing case."""
    bad, good = fam["sweep"]
    first = min(bad, key=_size)
    shapes = ", ".join(f"{n}{list(x.shape)}" for n, x in first.case.inputs.items())
    msg = f"fails long reductions — {_count(fam, 'sweep')}; smallest failing: {first.case.id} ({shapes})"
    passing = [r for r in good if _size(r) < _size(first)]
    if passing:
        msg += f"; longest passing below it: {max(passing, key=_size).case.id}"
    msg += (
        "; every short case passes, so the kernel changes algorithm with shape (split-K, a blocked or "
        "online softmax, tiling)"
    )
    if op.terms is not None and first.actual and next(iter(first.actual.values())).dtype == np.float32:
        from ..inputs.separation import split_in_two

        terms = op.terms(*load_inputs(list(first.case.inputs.values())))
        n = terms[0].shape[1]
        if any(_same(split_in_two(*terms, first=h), _flat_actual(first)) for h in {n // 2, (n + 1) // 2}):
            msg += "; output matches the sum split into two halves (split-K)"
    return Finding(op.name, msg, list(op.clauses))


def _tf32_finding(op, fam):
    keep = _tf32_keep(op, fam)
    how = (
        "drops low significand bits of fp32 inputs"
        if keep is None
        else f"rounds fp32 inputs to {'TF32' if keep == 10 else 'bfloat16'} inside the matmul"
    )
    return Finding(
        op.name, f"{how} — {_count(fam, 'tf32')}", ["num.format.c1"] + [c for c in op.clauses if c.startswith("mm.")]
    )


VARIANT_CASES = 3  # failing cases re-evaluated per op under every variant, smallest first
VERIFY_CASES = 8  # failing cases a matching variant must reproduce before it is named the cause
PASSING_CASES = 3  # passing cases it must reproduce too (the kernel gives the spec's bits there)


def _as_f32(r, n):
    """Output ``n`` as binary32 (a bf16 output widened: the variants' form)."""
    from ..base.bf16 import widen

    return widen(_stored(r, n)) if f"out/{n}" in r.case.bf16 else _stored(r, n)


def _loaded(rs):
    """[(loaded inputs, the kernel's outputs in the op's order)]; an output a
    slice does not hold (``slices``) is None, and is not compared."""
    return [
        (
            load_inputs(list(r.case.inputs.values())),
            [_as_f32(r, n) if n in r.case.outputs else None for n in OPS[r.case.op].outputs],
        )
        for r in rs
    ]


def _variant_finding(op, results, fits):
    """[conf.diagnosis.r1] Which variant of the op's algorithm reproduces the
    kernel (``variants.explain``) on its smallest failing cases.  A variant
    is named the cause only when it reproduces every differing element of
    every failing case re-evaluated and the passing cases too; otherwise it
    is called partial, with how many of the differing elements it explains."""
    if op.name not in variants.MODELS:
        return None
    # sweep cases are long rows: re-evaluating every variant on them would take minutes
    bad = [
        r
        for r in results
        if r.status in ("fail", "xfail")
        and r.case.family != "sweep"
        and fits(r)
        and r.actual
        and all(
            n in r.actual and _stored(r, n).shape == e.shape and _stored(r, n).dtype == e.dtype
            for n, e in r.case.outputs.items()
        )
    ]  # a wrong shape or dtype is no arithmetic variant
    if not bad:
        return None
    # random cases first: they hold the op's arithmetic at ordinary values, where the variants differ;
    # the edge and empty cases are small but hold specials on which many variants agree
    bad.sort(key=lambda r: (r.case.family != "random", _size(r)))
    cases = _loaded(bad[:VARIANT_CASES])
    ex = variants.explain(op.name, cases)
    if ex.spec_differ == 0:  # the spec's arithmetic reproduces them: NaN payloads only, found elsewhere
        return None
    on = f"on the {ex.cases} smallest failing case{'s' if ex.cases > 1 else ''}"
    checked = _loaded(bad[VARIANT_CASES:VERIFY_CASES])
    good = sorted(
        [
            r
            for r in results
            if r.status in ("pass", "xpass")
            and r.case.family != "sweep"
            and r.actual
            and model_bytes(op, r) <= SLICE_FROM
        ],
        key=lambda r: (r.case.family != "random", _size(r)),
    )  # random rows are the long ones
    passing = _loaded(good[:PASSING_CASES])
    full = [v for v in ex.matches if variants.tally(op.name, checked, v).exact]
    # a variant that breaks a case the kernel passes is not the kernel (a +0 start and NumPy's
    # pairwise sum agree on short rows of -0; only the longer passing rows tell them apart)
    agree = [v for v in full if variants.tally(op.name, passing, v).exact]
    full = agree or full
    if checked and full:
        on += f"; every differing element of all {len(bad[:VERIFY_CASES])} failing cases re-evaluated"
    if full:
        names = [variants.name(v) for v in full]
        what = (
            names[0]
            if len(names) == 1
            else "any of: " + "; ".join(names[:4]) + (f"; and {len(names) - 4} more" if len(names) > 4 else "")
        )
        msg = f"reproduced exactly by the spec's algorithm with {what} ({on})"
        devs = [d for v in full[:4] for d in v]
    else:
        rs = cases + checked
        scored = [(variants.tally(op.name, rs, v), v) for v in ex.matches or ([ex.closest] if ex.closest else [])]
        t, best = max(scored, key=lambda tv: (tv[0].explained - tv[0].differ, tv[0].explained), default=(None, None))
        n_cases = len(rs)
        size = _ulp_summary(op.name, rs) + _plus_zero_note(bad[:VERIFY_CASES])[1]
        if best is not None and t.explained > 0:
            ulp = "a NaN" if t.max_ulp >= 1 << 32 else f"{t.max_ulp} ulp"
            still = t.spec_differ - t.explained
            broken = t.differ - still  # elements where the kernel has the spec's bits and the variant has not
            msg = (
                f"partial: closest variant {variants.name(best)} explains {t.explained} of {t.spec_differ} "
                f"differing elements"
                + (f" ({still} still differ)" if still else "")
                + (f", but changes {broken} elements where the kernel has the spec's bits" if broken else "")
                + f" (max {ulp} under it); no single deviation or pair reproduces them all "
                f"(on the {n_cases} smallest failing case{'s' if n_cases > 1 else ''}){size}"
            )
            devs = list(best)
            msg = _located(msg, op, results)
        else:
            msg = (
                f"no single deviation or pair of the spec's algorithm comes closer to it than the spec's own "
                f"({ex.spec_differ} of {ex.total} elements differ) ({on}){size}"
            )
            devs = []
            msg = _located(msg, op, results)
    clauses = list(dict.fromkeys(list(op.clauses) + [c for d in devs for c in d.clauses]))
    return Finding(op.name, msg, clauses)


def _nice_between(lo, hi) -> str:
    """The shortest decimal v with lo < v <= hi (lo < hi, finite), as text."""
    for digits in range(0, 10):
        for v in (np.ceil(lo * 10**digits) / 10**digits, np.floor(hi * 10**digits) / 10**digits):
            if lo < v <= hi:
                return np.format_float_positional(np.float64(v), trim="-")
    return np.format_float_positional(np.float32(hi), trim="-")


def _range_location(xs, differ) -> tuple[float, str] | None:
    """(coverage, 'x > 5') for the one-sided range of x or |x| that holds
    every differing element and the fewest elements in all; None when the
    differences do not cluster (the range holds more than half the elements)."""
    best = None
    for label, v in (("x", xs), ("|x|", np.abs(xs))):
        d = v[differ]
        for side in (">", "<"):
            edge = d.min() if side == ">" else d.max()
            inside = v >= edge if side == ">" else v <= edge
            beyond = v[~inside & ~differ]
            if not beyond.size:
                continue
            near = beyond.max() if side == ">" else beyond.min()
            t = _nice_between(near, edge) if side == ">" else "-" + _nice_between(-near, -edge)
            t = t.replace("--", "")
            cov = float(inside.mean())
            if best is None or cov < best[0]:
                best = (cov, f"{label} {side} {t}", int(differ.sum()), int(inside.sum()))
    if best is None or best[0] > 0.5:
        return None
    cov, where, nd, ni = best
    return cov, f"{where} ({nd} of the {ni} elements there differ, none elsewhere)"


def _where(op, results) -> str:
    """Where the differing elements lie, when they cluster: an input range
    of an element-wise op ('only where |x| > 5'), or the rows or trailing
    columns of the outputs ('only in rows 512 and above'); '' otherwise.
    Every case that ran counts (the passing ones agree everywhere); the
    sweep cases' long rows are left out, as in the variant search."""
    bad = [
        r for r in results if r.actual and r.status in ("pass", "fail", "xfail", "xpass") and r.case.family != "sweep"
    ]
    found = []
    names = None
    for r in bad:  # the float32 inputs of the outputs' shape, in every case
        ns = {
            n
            for n, x in r.case.inputs.items()
            if x.dtype == np.float32
            and all(x.shape == e.shape for e in r.case.outputs.values() if e.dtype == np.float32)
        }
        names = ns if names is None else names & ns
    for name in sorted(names or ()):
        xs, ds = [], []
        for r in bad:
            for n, e in r.case.outputs.items():
                a = np.asarray(r.actual.get(n, np.zeros(0)))
                if e.dtype != np.float32 or a.shape != e.shape or a.dtype != e.dtype:
                    return ""
                with np.errstate(invalid="ignore"):  # a signalling NaN input widens quietly
                    xs.append(r.case.inputs[name].astype(np.float64).ravel())
                ds.append(~((fp.bits(e.ravel()) == fp.bits(a.ravel())) | (np.isnan(e.ravel()) & np.isnan(a.ravel()))))
        x, d = np.concatenate(xs), np.concatenate(ds)
        if d.any() and np.isfinite(x[d]).all():
            loc = _range_location(x[np.isfinite(x)], d[np.isfinite(x)])
            if loc:
                found.append((loc[0], f"only where {loc[1].replace('x', name, 1)}"))
    if found:
        return min(found)[1]
    # per output: its [rows, columns] shape, the first row and the longest tail holding a difference
    shapes, firsts, tails, count = [], [], [], 0
    for r in bad:
        for n, e in r.case.outputs.items():
            a = np.asarray(r.actual.get(n, np.zeros(0)))
            if e.dtype != np.float32 or a.shape != e.shape or e.ndim < 2 or e.size == 0:
                continue
            e2, a2 = e.reshape(-1, e.shape[-1]), a.reshape(-1, e.shape[-1])
            diff = (fp.bits(e2) != fp.bits(a2)) & ~(np.isnan(e2) & np.isnan(a2))
            shapes.append(e2.shape)
            n_diff = int(np.count_nonzero(diff))
            if n_diff:  # counted, not listed: a live case can differ in 10^8 elements
                count += n_diff
                firsts.append(int(np.argmax(diff.any(axis=1))))
                tails.append(e2.shape[1] - int(np.argmax(diff.any(axis=0))))
    if not count:
        return ""
    # a region counts when, were the differences spread evenly, at least 8 would fall outside it
    density = count / sum(h * w for h, w in shapes)
    r0, k = min(firsts), max(tails)
    if r0 > 0 and density * sum(min(r0, h) * w for h, w in shapes) >= 8:
        return f"only in rows {r0} and above (rows from 0; up to {max(h for h, _ in shapes)} in a case)"
    if density * sum(max(0, w - k) * h for h, w in shapes) >= 8:
        return f"only in the last {k} column{'s' if k > 1 else ''} of each row (a tail)"
    return ""


def _located(msg, op, results) -> str:
    try:
        where = _where(op, results)
    except Exception:  # noqa: BLE001  a fault in a diagnostic aid never hides the finding
        where = ""
    return f"{msg}; the differences lie {where}" if where else msg


def _plus_zero_note(bad) -> tuple[int, str]:
    """A +0 start beside another difference: the spec's -0s that come out +0,
    counted, and the sentence that says so ('' if none)."""
    plus = _outputs_where(
        {"x": (bad, [])}, "x", lambda e, a: (fp.bits(e) == np.uint32(0x80000000)) & (fp.bits(a) == np.uint32(0))
    )
    return plus, (
        f"; besides, {plus} of the differing elements are the spec's -0 come out +0 (a sum started "
        f"from +0 instead of -0 does this)"
        if plus
        else ""
    )


def _ulp_summary(op_name, cases) -> str:
    """'; the spec's algorithm differs from the kernel by a median of 1 ulp
    (max 3)' over the differing ordinary elements of ``cases``."""
    ds = []
    for inputs, actual in cases:
        for e, a in zip(variants.evaluate(op_name, inputs), actual):
            if a is None:  # an output the slice does not hold
                continue
            e, a = np.asarray(e, np.float32).ravel(), np.asarray(a, np.float32).ravel()
            if e.shape == a.shape:
                d = fp.ulp_distance(e, a)
                ds.append(d[(d > 0) & np.isfinite(e) & np.isfinite(a)])
    d = np.concatenate(ds) if ds else np.zeros(0, np.int64)
    if not d.size:
        return ""
    return f"; where both are finite the kernel is off by a median of {int(np.median(d))} ulp (max {int(d.max())})"


def _special_inputs_at_differences(op, bad) -> str:
    """For an element-wise op (an input of the output's shape): 'x is NaN (5),
    subnormal (1)' when every differing element has a special input there
    (NaN, infinite, subnormal, a zero), else ''."""
    classes = {"NaN": np.isnan, "infinite": np.isinf, "subnormal": fp.is_subnormal, "a zero": lambda x: x == 0}
    counts: dict[str, int] = {}
    names = set()
    for r in bad:
        for n, e in r.case.outputs.items():
            a = np.asarray(r.actual.get(n, np.zeros(0)))
            x = next(((k, v) for k, v in r.case.inputs.items() if v.shape == e.shape and v.dtype == np.float32), None)
            if x is None or e.dtype != np.float32 or a.shape != e.shape or a.dtype != e.dtype:
                return ""
            xs = x[1].ravel()[fp.bits(e.ravel()) != fp.bits(a.ravel())]
            names.add(x[0])
            for v in xs:
                c = next((c for c, pred in classes.items() if pred(v)), None)
                if c is None:
                    return ""
                counts[c] = counts.get(c, 0) + 1
    if not counts or len(names) != 1:
        return ""
    return f"{names.pop()} is " + ", ".join(f"{c} ({k})" for c, k in counts.items())


BF16_CASES = 4  # failing cases per family re-evaluated under each bf16 misreading, smallest first


def _bf16_actual(r) -> tuple | None:
    """The kernel's outputs in stored form (bf16 as uint16 bits), or None if a
    shape or dtype differs (no arithmetic misreading explains that)."""
    from ...numerics.bf16 import as_bits

    out = []
    for n, e in r.case.outputs.items():
        a = np.asarray(r.actual.get(n, np.zeros(0)))
        a = as_bits(a) if f"out/{n}" in r.case.bf16 else a
        if a.shape != e.shape or a.dtype != e.dtype:
            return None
        out.append(a)
    return tuple(out)


def _bf16_findings(op, results, fits) -> tuple[list[Finding], set]:
    """[conf.diagnosis.r1] [bf16.probes.c1] The misreadings of the bf16 profile
    (``bf16_variants``) that reproduce failing cases bit for bit (NaN payloads
    aside) where they differ from the spec, non-canonical bf16 NaNs, and the
    ids of the results a misreading explains."""
    from ..readings import bf16 as BV

    bad = [r for r in results if r.status in ("fail", "xfail") and r.actual and fits(r)]
    actual = {id(r): _bf16_actual(r) for r in bad}
    bad = [r for r in bad if actual[id(r)] is not None]
    out = []
    nans = set()
    for r in bad:
        for n, a in zip(r.case.outputs, actual[id(r)]):
            if a.dtype == np.uint16 and f"out/{n}" in r.case.bf16:
                flat = a.ravel()
                nans |= {f"0x{int(b):04X}" for b in flat[((flat & 0x7FFF) > 0x7F80) & (flat != 0x7FC0)][:50]}
    if nans:
        out.append(
            Finding(
                op.name,
                f"non-canonical bf16 NaN ({', '.join(sorted(nans)[:4])} where 0x7FC0 is required)",
                ["bf16.round.c1", "bf16.load.c1", "num.nan.c1"],
            )
        )
    by_family: dict[str, list] = {}
    for r in sorted(bad, key=_size):
        by_family.setdefault(r.case.family, []).append(r)
    sample = [r for rs in by_family.values() for r in rs[:BF16_CASES]]
    explained: set = set()
    hits_of = []
    for m in BV.MISREADINGS:
        hits = []
        for r in sample:
            inputs = [np.ascontiguousarray(x) for x in r.case.inputs.values()]
            try:
                got = m.fn(op, inputs)
            except Exception:  # noqa: BLE001  a fault in a diagnostic aid never hides the mismatch
                continue
            if got is not None:  # only the outputs a slice holds (``slices``)
                got = tuple(g for n, g in zip(op.outputs, got) if n in r.case.outputs)
            if BV.matches(actual[id(r)], got) and not BV.matches(tuple(r.case.outputs.values()), got):
                hits.append(r)
        if hits:
            hits_of.append((m, hits))
    for m, hits in hits_of:
        ids = {id(r) for r in hits}
        # a misreading whose matches another one's cover, and more, is a coincidence of small cases
        if any(ids < {id(r) for r in other} for _, other in hits_of):
            continue
        fams = sorted({r.case.family for r in hits})
        out.append(
            Finding(
                op.name,
                f"{m.name} — reproduces {len(hits)} of the {len(sample)} failing cases "
                f"re-evaluated ({', '.join(fams)}; first {hits[0].case.id})",
                list(m.clauses),
            )
        )
        explained |= ids
    return out, explained
