"""refreplay: the portable, normative reference for bitwise-reproducible
training arithmetic.  See ``spec/`` for the normative text.

The package in layers, bottom up: a module imports only from layers below
its own (``tests/test_layering.py`` holds the code to this map).

    0      errors _env _jit _shares _scratch resources
           exit codes, process set-up, the one compiler, independent calls on threads, scratch kept
           between calls, where the data lies
    1      environ untrusted files _tiles numerics state spec philox
           checked settings, files an adversary wrote, files written whole, tile moves the compiler
           misses, binary32 arithmetic, the state hash, the spec's text, the integer Philox round
           (plain Python, compiled by rng and by cuda_backend)
    2      rng tensorio doctor linalg
           Philox, tensor files, the platform check, reductions and matmul
    3      ops
           the transformer ops, forward and backward, and the optimizer
    4      training
           the trainer: recipe -> stream -> step -> TreeFold -> optimizer -> hash
    5      verify conformance torch
           replay and audit of a run; kernels against the vectors; PyTorch on the reference
    6      testing pytest_plugin
           tools for kernel authors' own tests
    7      commands cli
           the command line
    8      __main__
"""

from . import _env  # noqa: F401  (must run before anything imports numba)

__version__ = "0.4.0"
