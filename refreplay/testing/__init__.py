"""Tools for testing kernels against refreplay, on top of ``conformance``:
``strategies`` (public hypothesis strategies over binary32 values, shapes
and op inputs, for kernel authors' own tests) and ``fuzz`` (the engine of
`refreplay fuzz`).  Both need hypothesis (the ``fuzz`` extra)."""
