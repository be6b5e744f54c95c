"""One module per sub-command; see ``refreplay/cli.py``."""
