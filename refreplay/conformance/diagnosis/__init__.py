"""Stage 7: why a kernel fails (``diagnose``) and which accumulation tree it uses
(``order_probe``).
"""
