"""Command line: argument parsing and exit codes only.

Each sub-command lives in ``refreplay/commands/<name>.py`` and defines
``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``.  Command modules
import the library inside ``run`` so that start-up stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__
from .errors import InputError, UnfitPlatform, VerificationFailure

# name -> module under refreplay.commands (order is the order of --help)
COMMANDS = {
    "demo": "demo",
    "train": "train",
    "replay": "replay",
    "keygen": "keygen",
    "audit": "audit",
    "coverage": "coverage",
    "trace": "trace",
    "conform": "conform",
    "report": "report",
    "fuzz": "fuzz",
    "vectors": "vectors",
    "probe-order": "probe_order",
    "spec": "spec",
    "doctor": "doctor",
}


def _version_text() -> str:
    from . import spec

    return f"refreplay {__version__}\nspec {spec.version()} sha256:{spec.spec_sha256()}"


class _VersionAction(argparse.Action):
    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, help="print package and spec versions")

    def __call__(self, parser, namespace, values, option_string=None):
        print(_version_text())
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="refreplay", description="Normative reference for bitwise-reproducible training arithmetic."
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        try:
            mod = importlib.import_module(f"refreplay.commands.{module}")
        except ModuleNotFoundError as exc:
            if exc.name != f"refreplay.commands.{module}":
                raise
            continue  # command not built yet
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def _silence_stdout():
    """Point stdout at /dev/null so that flushing it at exit raises nothing."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _printable_streams() -> None:
    """Let stdout and stderr print any path: under PYTHONIOENCODING=ascii (or a
    C locale) a non-ASCII file name is written with backslash escapes
    instead of raising UnicodeEncodeError in the middle of a verdict."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass  # not a text file of the interpreter (a test's StringIO): nothing to do


def main(argv: list[str] | None = None) -> int:
    from .environ import check

    _printable_streams()

    try:  # before a command module can import Numba, which would trip over a bad value
        check()
    except InputError as exc:
        print(f"refreplay: error: {exc}", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        status = int(args._run(args))
        sys.stdout.flush()  # a closed pipe is reported here, not at interpreter exit
        return status
    except InputError as exc:
        print(f"refreplay {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except UnfitPlatform as exc:
        print(f"refreplay {args.command}: refusing to run: {exc} (see `refreplay doctor`)", file=sys.stderr)
        return 1
    except VerificationFailure as exc:
        print(f"refreplay {args.command}: FAILED: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as Unix tools do
        _silence_stdout()
        return 141
    except Exception:  # a bug in refreplay, not in the input
        import traceback

        traceback.print_exc()
        print(f"refreplay {args.command}: internal error (a bug: please report it)", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
