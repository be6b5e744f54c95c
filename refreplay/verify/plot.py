"""Coverage picture: the run's steps with certified ones marked, and the loss
curve from the published (bit-exact) per-step losses.  Needs matplotlib (the
``plot`` extra); nothing on the normative path uses it."""

from __future__ import annotations

from pathlib import Path

from .. import files
from ..errors import InputError


def plot_coverage(path, run, cov) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("--plot needs matplotlib: pip install 'refreplay[plot]'") from None
    steps = [rec.step for rec in run.records[1:]]
    loss = [float(rec.loss) for rec in run.records[1:]]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5), sharex=True, gridspec_kw={"height_ratios": [1, 3]})
    ok = [s for s, cs in cov.certified.items() if all(c["verdict"] == "verified" for c in cs)]
    bad = cov.mismatched_steps
    top.scatter(steps, [0] * len(steps), marker="|", color="0.7", label="published step")
    top.scatter(ok, [0] * len(ok), marker="s", color="tab:green", label="certified, verified")
    if bad:
        top.scatter(bad, [0] * len(bad), marker="x", color="tab:red", label="certified, mismatch")
    top.set_yticks([])
    top.set_title(f"coverage {cov.percent:.1f}% of {len(steps)} steps")
    top.legend(loc="upper right", fontsize=7, ncol=3)
    bottom.plot(steps, loss, color="tab:blue")
    for s in ok:
        bottom.axvline(s, color="tab:green", alpha=0.25)
    bottom.set_xlabel("step")
    bottom.set_ylabel("published loss")
    fig.tight_layout()
    try:
        with files.atomic_file(path) as f:  # synced temporary, renamed: whole or absent
            fig.savefig(f, dpi=110, format=Path(path).suffix.lstrip(".").lower() or "png")
    except ValueError as exc:  # an image format matplotlib does not know
        raise InputError(f"cannot write {path}: {exc}") from None
    finally:
        plt.close(fig)
