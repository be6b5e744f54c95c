"""Stage 2: inputs -- value grids and random binary32 draws (``values``), where elementwise
clauses change branch (``boundaries``), thin-but-long reductions (``long_shapes``), the case
builders per kind of op (``builders``) and per transformer op (``model``).
"""
