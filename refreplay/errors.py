"""Exceptions that the command line maps to exit codes.

0 success; 1 verification or conformance failure; 2 bad input or usage.
Anything else escaping a command is a bug in refreplay (exit 3, traceback).
"""


class InputError(ValueError):
    """Bad input or usage: a missing or corrupt file, a bad argument (exit 2)."""


class VerificationFailure(Exception):
    """The thing checked does not match (exit 1)."""


class UnfitPlatform(Exception):
    """The process cannot produce conformant bits (hardware FTZ/DAZ on, SVML
    in use, ...): refreplay refuses to compute (exit 1)."""
