"""`compress --plot DIR`: the paper's per-layer figures, for the model at hand (matplotlib, optional).

* ``pruning_by_layer.png``: per eligible layer, the share removed by each step: hashing (distinct
  values), merge (parameters), split (parameters it removes, or would remove when kept as Conv).
* ``expected_pruning.png``: the birthday-problem expectations ``E_m`` and ``E_s`` (uniform prior,
  from the number of distinct values after hashing) against the per-layer merge and split ratios
  measured on the hashed weights.
"""

from __future__ import annotations

from pathlib import Path

from .errors import RedppError


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RedppError("--plot needs matplotlib: pip install 'redpp-onnx[plot]'") from None
    return plt


PLOT_FILES = ("pruning_by_layer.png", "expected_pruning.png")


def write_plots(folder, model, report, hashed=None) -> list:
    """Write the figures for ``model`` (the input) and its ``report``; returns the paths written."""
    plt = _pyplot()
    out = Path(folder)
    out.mkdir(exist_ok=True)
    rows = [l for l in report.layers if l.get("eligible", True)]
    x = list(range(len(rows)))
    paths = []

    def share(r, step):
        if step == "hash" and r.get("distinct_before"):
            return 1 - r["distinct_after"] / r["distinct_before"]
        if step == "merge" and r.get("merge", {}).get("params_before"):
            return r["merge"]["params_removed"] / r["merge"]["params_before"]
        if step == "split" and r.get("split", {}).get("params_before"):
            return 1 - r["split"]["params_after"] / r["split"]["params_before"]
        return 0.0

    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(rows)), 4))
    width = 0.27
    for k, step in enumerate(("hash", "merge", "split")):
        ax.bar([i + (k - 1) * width for i in x], [100 * share(r, step) for r in rows], width, label=step)
    ax.set_xticks(x, [str(i) for i in x])
    ax.set_xlabel("eligible layer (graph order; names in the JSON report)")
    ax.set_ylabel("removed (%)")
    ax.set_title("per-layer reduction by step (hash: distinct values; merge, split: parameters)")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "pruning_by_layer.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    if hashed is not None:
        from .analysis.theory import layer_theory

        theory = [t for t in layer_theory(model, hashed.layers, hashed.model) if t.hashed and t.E_m is not None]
        fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(theory)), 4))
        xs = list(range(len(theory)))
        ax.plot(xs, [100 * t.E_m for t in theory], "o-", label="E_m (merge, expected)")
        ax.plot(xs, [100 * t.E_s for t in theory], "s-", label="E_s (split, expected)")
        ax.plot(xs, [100 * (t.measured_merge or 0) for t in theory], "o--", label="merge, measured (equal weight rows)")
        ax.plot(xs, [100 * (t.measured_split or 0) for t in theory], "s--", label="split, measured (repeated kernels)")
        ax.set_xlabel("hashed layer (graph order)")
        ax.set_ylabel("pruning ratio (%)")
        ax.set_title("birthday-problem expectations (uniform prior) vs measured, per layer")
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(out / "expected_pruning.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return [str(p) for p in paths]
