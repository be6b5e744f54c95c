HELP = (
    "property-based differential testing: generated shapes and edge-heavy inputs, the kernel against the "
    "live reference; a difference is shrunk to a minimal case, diagnosed and saved (needs hypothesis)"
)

DEFAULT_SAVE = "refreplay-fuzz"  # under the working directory, only when a case fails
SHOWN = 16  # inputs with at most this many elements are printed in hex


def add_arguments(p):
    p.add_argument("kernel", metavar="KERNEL", help="as for `refreplay conform`")
    p.add_argument("--op", required=True, metavar="OP", help="the op to fuzz")
    p.add_argument("--examples", type=int, default=100, metavar="N", help="examples to try (default 100)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="hypothesis seed (default 0); same seed, same run")
    p.add_argument(
        "--max-elements",
        type=int,
        default=1 << 16,
        metavar="E",
        help="bound on the elements of one case, inputs and outputs (default 65536)",
    )
    p.add_argument(
        "--save", metavar="DIR", help=f"where a failing case is saved as vectors (default ./{DEFAULT_SAVE}/OP-seedS)"
    )
    p.add_argument("--json", metavar="FILE", help="also write the report of the failing case as JSON")
    p.add_argument("--junit", metavar="FILE", help="also write JUnit XML")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="exec: kernels: seconds per example before the program's whole process group is killed (default: 120)",
    )


def _inputs_text(case) -> list[str]:
    from ..conformance.base import deviant as fp

    lines = []
    for name, a in case.inputs.items():
        if a.size > SHOWN:
            lines.append(f"      {name}: {a.dtype}{list(a.shape)} (saved)")
        elif a.dtype.kind == "f":
            words = ", ".join(f"0x{int(b):08X}" for b in fp.bits(a.ravel()))
            lines.append(f"      {name}: f32{list(a.shape)} = [{words}]")
        else:
            lines.append(f"      {name}: {a.dtype}{list(a.shape)} = {a.ravel().tolist()}")
    return lines


def _order_findings(op, r):
    """For a sum or matmul: the candidate orders that reproduce the kernel on
    the shrunk case (``diagnose.matching_orders``)."""
    from ..conformance.diagnosis import diagnose
    from ..conformance.table import OPS

    names = [n for n in diagnose.matching_orders(OPS[op], r) if not n.startswith("sequential k increasing")]
    if not names:
        return []
    clauses = [c for c in OPS[op].clauses if c.startswith(("mm.", "red."))]
    return [
        diagnose.Finding(
            op,
            f"sums in another order: on the shrunk case the output matches {len(names)} "
            f"candidate order{'s' if len(names) > 1 else ''} ({'; '.join(names[:4])}"
            f"{'; ...' if len(names) > 4 else ''})",
            clauses,
        )
    ]


def _write_json(obj, path):
    import json

    from ..files import write_atomic

    write_atomic(path, json.dumps(obj, indent=1) + "\n")


def _write_pass(args, run_info):
    """The reports of a run without a difference: every example passed."""
    import xml.etree.ElementTree as ET

    if args.json:
        _write_json(
            {
                "kernel": args.kernel,
                "conformant": True,
                "counts": {"pass": run_info["examples"]},
                "diagnosis": [],
                "cases": [],
                "fuzz": run_info,
            },
            args.json,
        )
    if args.junit:
        root = ET.Element("testsuites", name=f"refreplay fuzz {args.kernel}")
        suite = ET.SubElement(root, "testsuite", name=args.op, tests="1", failures="0", errors="0", skipped="0")
        ET.SubElement(
            suite,
            "testcase",
            classname=f"refreplay.fuzz.{args.op}",
            name=f"{args.op}-fuzz ({run_info['examples']} examples, seed {run_info['seed']})",
        )
        from ..files import write_atomic

        write_atomic(args.junit, ET.tostring(root, encoding="utf-8", xml_declaration=True))


def _keep_hypothesis_out_of_cwd():
    """Hypothesis keeps a cache in ./.hypothesis unless told otherwise; the
    fuzzer uses no example database, so nothing of it belongs in the user's
    working directory (HYPOTHESIS_STORAGE_DIRECTORY, if set, is honoured)."""
    import os
    import tempfile

    from hypothesis.configuration import set_hypothesis_home_dir

    if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), f"refreplay-hypothesis-{os.getuid()}"))


def run(args) -> int:
    from pathlib import Path

    from .. import spec
    from ..conformance.running import adapters as kernels
    from ..conformance.shapes import live
    from ..conformance.golden import live_save
    from ..conformance.reporting import report
    from ..testing import fuzz
    from ..errors import InputError
    from .conform_live import check_seed

    fuzz.hypothesis_or_exit()
    _keep_hypothesis_out_of_cwd()
    seed = check_seed(args.seed)
    if not 1 <= args.examples <= 1_000_000:
        raise InputError(f"--examples must be in [1, 10^6], got {args.examples}")
    if not 1 <= args.max_elements <= live.MAX_ELEMENTS:
        raise InputError(f"--max-elements must be in [1, 2^27], got {args.max_elements}")
    lv = live.live_op(args.op)
    low = {x: lv.minimum.get(x, 0) for x in lv.letters}
    if lv.elements(low) > args.max_elements:
        raise InputError(f"--max-elements {args.max_elements}: the smallest {args.op} case has more")
    directory = args.save or str(Path(DEFAULT_SAVE) / f"{args.op}-seed{seed}")
    live_save.check_save_target(directory)  # before the run, not after it
    kernel = kernels.resolve(args.kernel, exec_timeout=args.timeout)
    live.require_fit()
    out = fuzz.fuzz(kernel, args.op, args.examples, seed, args.max_elements)
    head = f"refreplay fuzz {args.kernel} --op {args.op} --seed {seed} --max-elements {args.max_elements}"
    run_info = {
        "op": args.op,
        "seed": seed,
        "max_elements": args.max_elements,
        "examples": out.examples,
        "found_after": out.found_after,
        "dims": out.dims,
        "seconds": round(out.seconds, 3),
    }
    if out.result is None:
        print(f"{head}: {out.examples} examples, every one matches the reference bit for bit ({out.seconds:.1f} s)")
        _write_pass(args, run_info)
        return 0
    r = out.result
    manifest = {"spec_version": spec.version(), "generator_version": live.GENERATOR_VERSION}
    summary = report.summarize(args.kernel, manifest, [r])
    summary.findings += _order_findings(args.op, r) if r.status == "fail" else []
    live_save.save([r.case], directory, seed)  # first: a closed stdout must not lose the case
    what = {"fail": "a difference", "error": "the kernel failed", "skip": "the kernel declined the op"}[r.status]
    print(
        f"{head}: {what} after {out.found_after} examples, shrunk to "
        f"{live.format_dims(out.dims)} ({out.examples} examples in all, {out.seconds:.1f} s)"
    )
    print("\n".join(_inputs_text(r.case)))
    print(report.text(summary, verbose=True))
    if args.json:
        _write_json({**report.to_json(summary), "fuzz": run_info}, args.json)
    if args.junit:
        report.write_junit(summary, args.junit)
    print(f"saved the shrunk case to {directory} (replay: refreplay conform {args.kernel} --vectors {directory})")
    return 1
