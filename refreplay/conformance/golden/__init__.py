"""Stage 5: the golden vectors on disk -- the format (``store``), generating every case
(``generate``), byte-for-byte regeneration (``regenerate``), saving live cases
(``live_save``), and the golden training steps (``steps``).
"""
