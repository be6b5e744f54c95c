"""The verifier: a published run replayed and checked bit for bit, the last
stage of the data flow recipe -> stream -> step -> TreeFold -> optimizer ->
hash -> replay.  Listed in the order a replay uses them:

    artifacts  the published checkpoint a replay starts from, and the check of
               every checkpoint it recomputes                 [step.verified.c1]
    replay     recompute steps k+1..n with ``refreplay.training`` and compare
               each data hash, state root, loss and chain link; localise the
               first divergence
    trace      op-level hashes of one step: name the first operation that differs
    audit      unpredictable step sampling, certificates, coverage
    plot       the coverage picture (the ``plot`` extra)

Layers import only downward: this package reads runs through
``training.run`` and recomputes steps with ``training``; nothing below it
imports it.
"""
