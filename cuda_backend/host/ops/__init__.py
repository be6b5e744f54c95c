"""Host entry points of the transformer ops, one module per op family (as ``refreplay.ops``)."""
