"""Stage 0 of the suite: what every stage shares -- the case record and the probe families
(``case``), bit casts, ulp distance and deviant arithmetic in NumPy (``deviant``), bf16
roundings, widening and loading (``bf16``).
"""
