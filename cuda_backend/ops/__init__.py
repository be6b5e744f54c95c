"""Transformer ops on the device, one module per op family, forward and
backward side by side; mirrors ``refreplay.ops``."""
