"""Stage 1: wrong readings of the spec, modelled in NumPy -- other summation orders
(``orders``), the transformer ops computed another way (``transformer``), misreadings of
the bf16 profile (``bf16``).  Probes are built to separate them; the diagnosis names them.
"""
