"""The reference trainer (spec chapters 20-23), one module per stage, listed
in the order the data flows: recipe -> stream -> step -> TreeFold ->
optimizer -> hash -> the published run that ``refreplay.verify`` replays.

    presets   the recipe's records: ModelConfig, TrainConfig, named presets
    run       the recipe and the published run directory, written and read back
    tokens    pre-tokenized files -> one flat token sequence
    data      corpus or tokens -> samples -> shards -> each step's stream
    model     the decoder's forward and backward, op by op (``refreplay.ops``)
    backend   where the ops run: the CPU reference or the CUDA twin
    arrays    the CPU's exact copies and moves of step tensors (no arithmetic)
    step      one step: micro-batches -> forward/backward -> TreeFold -> scale
              -> clip -> AdamW (``ops.optim``) -> state hash (``state``) -> chain link
    treefold  the fixed combination tree of the micro-batch gradients
    launch    the ranks that evaluate the tree's leaves: in-process or MPI
    budget    where a step's large tensors live under ``--max-memory``
    estimate  a step's FLOPs, bytes, peak memory and time, before it runs
    train     the driver: data -> recipe -> state 0 -> steps 1..N -> run directory

Layers import only downward: this package uses the package's top-level
modules and ``numerics``, ``linalg``, ``ops`` below it, never ``verify``,
``conformance``, ``torch`` or ``commands``, which sit above it.
"""
