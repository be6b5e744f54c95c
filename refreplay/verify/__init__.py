"""The verifier: a published run replayed and checked bit for bit, the last
stage of the data flow recipe -> stream -> step -> TreeFold -> optimizer ->
hash -> replay.  Listed in the order a replay uses them:

    artifacts  the published checkpoint a replay starts from, and the check of
               every checkpoint it recomputes                 [step.verified.c1]
    replay     recompute steps k+1..n with ``refreplay.training`` and compare
               each data hash, state root, loss and chain link; localise the
               first divergence
    trace      op-level hashes of one step: name the first operation that differs
    keys       auditors' RSA keys and signatures (``cryptography``)   [step.audit.key.c1]
    audit      sampling by a key's unique signature, signed certificates (made
               and written in one place), coverage per key  [step.audit.coverage.c1]
    cluster    replays as Dask tasks on fit workers; the client certifies
               (the ``cluster`` extra)                       [step.verified.r2]
    plot       the coverage picture (the ``plot`` extra)

Layers import only downward: this package reads runs through
``training.run`` and recomputes steps with ``training``; nothing below it
imports it.
"""
