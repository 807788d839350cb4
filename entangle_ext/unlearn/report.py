"""What a run hands back and writes: the printed accuracy table, the JSON report
(``report.json``), the per-step history (``history.json``) and the forget-loss histogram PNG."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional

__all__ = ["format_table", "plot_forget_histograms", "build_report", "write_report"]


def format_table(evals: Dict[str, Dict[str, dict]]) -> str:
    """Accuracy (%) / mean CE table: rows = checkpoints (original, stage1, stage2), columns = splits."""
    names = []
    for e in evals.values():
        for n in e:
            if n not in names:
                names.append(n)
    head = f"{'model':<10}" + "".join(f"{n:>18}" for n in names)
    lines = ["accuracy % (mean CE)", head, "-" * len(head)]
    for tag, e in evals.items():
        cells = []
        for n in names:
            r = e.get(n)
            cells.append(f"{'-':>18}" if r is None else f"{100 * r['acc']:>9.2f} ({r['loss']:5.2f})")
        lines.append(f"{tag:<10}" + "".join(cells))
    return "\n".join(lines)


def plot_forget_histograms(evals: Dict[str, Dict[str, dict]], path: str, bins: int = 40,
                           num_classes: Optional[int] = None) -> str:
    """PNG of the per-sample forget-train CE histograms at each evaluation point (matplotlib, Agg).

    The dashed line marks log C (the threshold of docs/algorithm.md §3, Prop. 4.2) when
    ``num_classes`` is given. Returns the path written.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tags = [t for t, e in evals.items() if "losses" in e.get("forget", {})]
    fig, axes = plt.subplots(1, max(len(tags), 1), figsize=(4.2 * max(len(tags), 1), 3.2),
                             sharex=True, sharey=True, squeeze=False)
    hi = max([max(evals[t]["forget"]["losses"]) for t in tags] + [math.log(num_classes or 2)]) * 1.02
    edges = [hi * i / bins for i in range(bins + 1)]   # common bins: comparable panels
    for ax, t in zip(axes[0], tags):
        ls = evals[t]["forget"]["losses"]
        ax.hist(ls, bins=edges, color="tab:blue", alpha=0.8)
        ax.set_title(f"{t}: forget acc {100 * evals[t]['forget']['acc']:.1f}%")
        ax.set_xlabel("per-sample CE (nats)")
        if num_classes:
            ax.axvline(math.log(num_classes), color="k", ls="--", lw=1)
    axes[0][0].set_ylabel("forget samples")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def build_report(*, config: Dict[str, Any], num_classes: int, c0: float, lam: Optional[float],
                 history: List[Dict[str, float]], timings: Dict[str, float],
                 evals: Dict[str, Dict[str, dict]], checkpoint: Optional[str]) -> Dict[str, Any]:
    """The JSON-serialisable report of `unlearn`: config, C, c0 (nats), final λ, step counts
    per stage, timings (seconds), evaluations without the per-sample losses, last checkpoint."""
    return {"config": config, "num_classes": num_classes, "c0": c0, "lambda_final": lam,
            "steps": {"stage1": sum(1 for h in history if h["stage"] == 1),
                      "stage2": sum(1 for h in history if h["stage"] == 2)},
            "timings_s": timings,
            "evals": {t: {n: {k: v for k, v in r.items() if k != "losses"} for n, r in e.items()}
                      for t, e in evals.items()},
            "checkpoint": checkpoint}


def write_report(out: Path, report: Dict[str, Any], history: List[Dict[str, float]],
                 evals: Dict[str, Dict[str, dict]], *, bins: int, num_classes: int) -> None:
    """Write ``forget_loss_hist.png`` (its path goes into ``report["histogram_png"]``),
    ``report.json`` and ``history.json`` under ``out``."""
    report["histogram_png"] = plot_forget_histograms(evals, str(out / "forget_loss_hist.png"),
                                                     bins=bins, num_classes=num_classes)
    with open(out / "report.json", "w") as f:
        json.dump(report, f, indent=2)
    with open(out / "history.json", "w") as f:
        json.dump(history, f)
