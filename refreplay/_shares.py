"""Independent calls side by side on threads, in shares balanced by size.

Used where the calls are independent by the spec, so the order they run in
changes no bit: the state hash's chunk leaves ([state.root.c1]) and the
per-tensor sums of squares of gradient clipping ([optim.clip.c1] step 1).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

_POOL: ThreadPoolExecutor | None = None


def _pool(workers: int) -> ThreadPoolExecutor:
    """One long-lived pool, grown on demand: starting threads on every call
    would cost more than a small state's hash or a few norms."""
    global _POOL
    if _POOL is None or _POOL._max_workers < workers:
        if _POOL is not None:
            _POOL.shutdown(wait=False)
        _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="refreplay-shares")
    return _POOL


def in_shares(work, sizes: list[int], workers: int) -> None:
    """Call ``work(i)`` once for every i < len(sizes) on ``workers`` threads
    (the calling one included), each thread a share balanced by ``sizes``
    (largest first, each to the least-loaded share).  The calls must be
    independent (they run in no fixed order) and release the GIL to run side
    by side (``hashlib`` on a buffer, a ``nogil`` kernel).  A call's
    exception is raised here."""
    workers = max(1, min(workers, len(sizes)))
    shares: list[list[int]] = [[] for _ in range(workers)]
    load = [0] * workers
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        t = load.index(min(load))
        shares[t].append(i)
        load[t] += sizes[i]

    def run(share):
        for i in share:
            work(i)

    futures = [_pool(workers - 1).submit(run, sh) for sh in shares[1:]] if workers > 1 else []
    run(shares[0])
    for f in futures:
        f.result()
