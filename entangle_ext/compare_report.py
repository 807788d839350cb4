"""The outputs of `entangle_ext.compare`: the per-seed summary (mean ± std), the markdown table with
the direction of every metric and the best value per column marked, and the bar-chart PNG."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np

from .unlearn.metrics import METRICS

__all__ = ["summarize", "format_markdown", "plot_comparison", "TABLE_COLUMNS", "REFERENCE_ROWS"]

REFERENCE_ROWS = ("original", "retrain")   # shown, never marked best
TABLE_COLUMNS = ("acc_forget_test", "acc_adjacent_test", "acc_remote_test", "UA", "RA", "TA", "mia_forget",
                 "mia_adjacent", "mia_remote", "avg_gap", "forget_quality", "relearn_steps", "time_s")
"""The metrics of the table, in order (`METRICS` keys); absent ones are dropped."""


def summarize(runs: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> Dict[str, Dict[str, Dict[str, float]]]:
    """{method: {metric: {"mean", "std", "n"}}} over seeds; std is the sample standard deviation
    (ddof 1; 0 for one seed); None values are left out."""
    out = {}
    for method, by_seed in runs.items():
        keys = [k for r in by_seed.values() for k in r]
        out[method] = {}
        for k in dict.fromkeys(keys):
            v = np.array([float(r[k]) for r in by_seed.values() if r.get(k) is not None])
            if v.size:
                out[method][k] = {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0,
                                  "n": int(v.size)}
    return out


def _cell(k: str, s: Mapping[str, float]) -> str:
    if k == "forget_quality":
        return f"{s['mean']:.3g} ± {s['std']:.2g}"
    digits = 2 if k == "time_s" else 1
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"


def format_markdown(summary: Mapping[str, Mapping[str, Mapping[str, float]]], *, seeds: Sequence[int] = (),
                    order: Optional[Sequence[str]] = None, columns: Sequence[str] = TABLE_COLUMNS) -> str:
    """Markdown table: rows = methods (``order``), columns = the metrics of ``columns`` present in
    ``summary`` with their direction (↑ / ↓), cells mean ± std; the best mean per column among the
    rows other than original / retrain is in bold. A legend follows the table."""
    order = list(order or summary)
    cols = [k for k in columns if any(k in summary[m] for m in order)]
    best = {}
    for k in cols:
        cand = [summary[m][k]["mean"] for m in order if m not in REFERENCE_ROWS and k in summary[m]]
        if cand:
            best[k] = max(cand) if METRICS[k].direction == "up" else min(cand)
    head = ["method"] + [f"{METRICS[k].label} {METRICS[k].arrow}" for k in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in order:
        cells = [m]
        for k in cols:
            s = summary[m].get(k)
            c = "–" if s is None else _cell(k, s)
            cells.append(f"**{c}**" if s is not None and m not in REFERENCE_ROWS and s["mean"] == best.get(k) else c)
        lines.append("| " + " | ".join(cells) + " |")
    units = ", ".join(f"{METRICS[k].label} in {METRICS[k].unit}" for k in cols if METRICS[k].unit != "%")
    lines += ["", f"Mean ± std (ddof 1) over seeds {list(seeds)}. ↑ higher is better, ↓ lower is better; **bold** = "
              "best among the unlearning methods (original and retrain are references). Accuracies, UA/RA/TA "
              f"and MIA in %; {units}. MIA-efficacy = % of a split's train samples an SVC on the true-label "
              "probability calls non-member: high on forget = forgotten, high on adjacent / remote = damaged "
              "(docs/algorithm.md §10)."]
    return "\n".join(lines)


def plot_comparison(summary: Mapping[str, Mapping[str, Mapping[str, float]]], path: str,
                    order: Optional[Sequence[str]] = None) -> str:
    """PNG (matplotlib, Agg): per-method bars of forget / adjacent / remote held-out accuracy and of
    MIA-efficacy per split, with ± std error bars. Returns ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = list(order or summary)
    panels = [("held-out accuracy (%)", ("acc_forget_test", "acc_adjacent_test", "acc_remote_test")),
              ("MIA-efficacy (% non-member)", ("mia_forget", "mia_adjacent", "mia_remote"))]
    fig, axes = plt.subplots(2, 1, figsize=(max(7.0, 0.55 * len(order) + 2), 7.0), squeeze=False)
    x, w = np.arange(len(order)), 0.8 / 3
    for ax, (title, keys) in zip(axes[:, 0], panels):
        for j, (k, color) in enumerate(zip(keys, ("tab:red", "tab:orange", "tab:blue"))):
            s = [summary[m].get(k, {"mean": np.nan, "std": 0.0}) for m in order]
            ax.bar(x + (j - 1) * w, [v["mean"] for v in s], w, yerr=[v["std"] for v in s], capsize=2,
                   color=color, label=k.split("_")[1])
        ax.set_xticks(x, order, rotation=30, ha="right")
        ax.set_ylim(0, 105)
        ax.set_title(title)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="upper center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
