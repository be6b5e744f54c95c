"""Stage 4: cases at any shape over the op table -- the live forms of the ops (``live``), the
axis sweeps over every shape letter (``axes``), edge cases for readings that passed
everything else (``edges``), and the domain a verdict covers (``domain``).
"""
