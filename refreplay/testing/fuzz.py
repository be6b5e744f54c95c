"""Property-based differential testing of a kernel against the live
reference ([conf.runner.c1]: bit-for-bit, as for the vectors).

Hypothesis draws shapes and edge-heavy inputs (``refreplay.testing.
strategies``), the reference computes the expected bits (``live.expected``)
and the runner compares them with the kernel's.  A difference is shrunk to
a minimal case by hypothesis, which then becomes a live case like any other:
reported with the runner's diagnosis and saved as replayable vectors.

Deterministic for a given seed: hypothesis runs with that seed, no example
database (nothing is written to the working directory), no deadline and no
"local constants" (``_no_local_constants``), whatever ran before in the
process and whichever entry point called it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from ..conformance.shapes import live
from ..conformance.running import compare as runner
from ..conformance.running.kernel import Kernel
from ..errors import InputError


@dataclass
class Outcome:
    examples: int  # examples run in all (shrinking included)
    seconds: float
    found_after: int | None  # examples until the first failure; None: none failed
    result: runner.Result | None  # the shrunk failing case's result
    dims: dict | None


def hypothesis_or_exit():
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        raise InputError(
            "refreplay fuzz needs hypothesis: pip install 'refreplay[fuzz]' (or pip install hypothesis)"
        ) from None


class _Failed(AssertionError):
    pass


@contextlib.contextmanager
def _no_local_constants():
    """Hypothesis (6.131 and later) draws now and then from the literals of
    the "local" modules (not stdlib, not site-packages, not tests) that are in
    ``sys.modules`` when an example is drawn, refreplay's own included.  The
    same seed then gives a different run depending on what was imported
    before (``refreplay fuzz`` imports the save checks, a test session others)
    and on the source of every such module.  For the duration of the run that
    pool is empty, and the cache of the constants each draw may use is
    emptied before and after, so that none drawn before leaks in and none of
    ours leaks out.  Versions without the feature have neither name: nothing
    to do."""
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants
    except ImportError:
        yield
        return
    get = getattr(providers, "_get_local_constants", None)
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    if get is None or cache is None:
        yield
        return
    empty = Constants()
    providers._get_local_constants = lambda: empty
    cache.cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = get
        cache.cache.clear()


def fuzz(kernel: Kernel, op: str, examples: int, seed: int, max_elements: int) -> Outcome:
    """Run up to ``examples`` generated cases of ``op``; stop at the first
    failing one and shrink it."""
    hypothesis_or_exit()
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    from . import strategies

    strategy = strategies.op_inputs(op, max_elements)  # checks the op and the bound (ValueError)
    state = {"n": 0, "first": None, "last": None, "error": None}

    @hseed(seed)
    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        derandomize=False,
        print_blob=False,
        phases=(Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    @given(strategy)
    def check(drawn):
        dims, inputs = drawn
        state["n"] += 1
        try:
            case = live.make_case(
                op, inputs, f"{op}-fuzz-00", f"{live.format_dims(dims)}; fuzz seed {seed}", family="edge"
            )
        except InputError as exc:  # the reference refused a drawn shape: a bug in the strategies
            state["error"] = exc
            raise
        r = runner.run_case(kernel, case)
        if r.status != "pass":
            if state["first"] is None:
                state["first"] = state["n"]
            state["last"] = (r, dims)
            raise _Failed(r.status)

    import numba

    threads = numba.get_num_threads()
    # Fuzzed cases are small: starting a parallel loop would cost more than
    # the loop (milliseconds on a busy machine).  The bits do not depend on
    # the thread count ([red.sum.c1]; tests/test_reference_properties.py).
    numba.set_num_threads(1)
    t0 = time.perf_counter()
    try:
        with _no_local_constants():
            check()
    except _Failed:
        pass
    except InputError:
        raise
    except Exception as exc:  # hypothesis could not run (e.g. unsatisfiable): no verdict
        if state["error"] is not None:
            raise InputError(f"fuzz {op}: {state['error']}") from None
        raise InputError(f"fuzz {op}: hypothesis stopped: {type(exc).__name__}: {exc}") from None
    finally:
        numba.set_num_threads(threads)
    seconds = time.perf_counter() - t0
    r, dims = state["last"] if state["last"] else (None, None)
    return Outcome(state["n"], seconds, state["first"], r, dims)
