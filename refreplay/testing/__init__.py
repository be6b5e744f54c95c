"""Tools for kernel authors' own tests: ``strategies`` (hypothesis strategies
over binary32 values, shapes and op inputs; needs the ``fuzz`` extra)."""
