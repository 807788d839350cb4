"""What a run hands back and writes: the printed accuracy table, the JSON report
(``report.json``), the per-step history (``history.json``), the forget-loss histogram PNG and the
fingerprint of the splits a run (or a cached original model) was made from."""
from __future__ import annotations

import datetime
import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from .files import atomic_write
from .fingerprint import splits_fingerprint

__all__ = ["format_table", "plot_forget_histograms", "forget_histogram_figure", "build_report",
           "write_report", "save_report_json", "plot_available", "PlotSkippedWarning", "split_fingerprint", "UNITS",
           "write_curves_png"]

GOOD_DIRECTION = {"forget": "↓", "adjacent": "↑", "remote": "↑"}
"""Split base name → the direction of its accuracy that unlearning aims for."""

UNITS = {"acc": "fraction of samples classified correctly, in [0, 1] (the printed table shows %)",
         "retained": "fraction of forget samples still classified correctly, in [0, 1]",
         "loss": "mean cross-entropy per sample, nats", "c0": "nats", "timings_s": "seconds",
         "lambda_final": "dual variable of the Stage-1 constraint (dimensionless)"}
"""The units of the numbers in ``report.json`` (written into it as ``"units"``)."""

_LABEL_W, _CELL_W = 10, 25
_TAGS = {"original": "original", "stage1": "after Stage 1", "stage2": "after Stage 2"}


@dataclass
class UnlearnResult:
    """Result of `unlearn`.

    Attributes:
        model: the unlearned model (the input model itself with ``inplace=True``, the module it
            holds for a DDP wrapper; else a copy), its ``training`` flags as the input's were.
        report: JSON-serialisable dict: config, c0, λ, step counts, timings, the evaluations
            under ``"evals"`` ({"original"|"stage1"|"stage2"|...|"final": {split: {"acc", "loss",
            "n", ...}}}; ``"final"`` is the returned model's, a baseline's end state under
            ``"end"``, a selected checkpoint's under ``"selected"``), split fingerprint, resume
            information, paths.
        history: per-step records (dicts with "stage", "step", "loss", ... floats), every stage.
        table: the printed accuracy table.
    """
    model: torch.nn.Module
    report: Dict[str, Any]
    history: List[Dict[str, float]] = field(default_factory=list)
    table: str = ""


# ------------------------------------------------------------------------------------ the table
def _cell(r: Optional[dict], ref: Optional[dict]) -> str:
    if r is None:
        return f"{'-':>{_CELL_W}}"
    delta = "" if ref is None else f"{100 * (r['acc'] - ref['acc']):+.2f}"
    return f" {100 * r['acc']:>7.2f} {delta:>8} {r['loss']:>7.2f}"


def _block(title: str, cols: List[str], evals: Dict[str, Dict[str, dict]]) -> List[str]:
    bases = [n[:-len("_test")] if n.endswith("_test") else n for n in cols]
    heads = [f"{b} {GOOD_DIRECTION.get(b, '')}".rstrip() for b in bases]
    lines = [f"{title:<{_LABEL_W}}" + "".join(f"   {h:<{_CELL_W - 3}}" for h in heads),
             f"{'':<{_LABEL_W}}" + f" {'acc %':>7} {'Δ':>8} {'CE':>7}" * len(cols)]
    lines.append("-" * (_LABEL_W + _CELL_W * len(cols)))
    base = evals.get("original")
    for tag, e in evals.items():
        ref = None if tag == "original" or base is None else base
        lines.append(f"{tag:<{_LABEL_W}}" + "".join(_cell(e.get(n), None if ref is None else ref.get(n))
                                                    for n in cols))
    return lines


def format_table(evals: Dict[str, Dict[str, dict]]) -> str:
    """The result table, at most 100 columns for the three standard splits.

    Rows = evaluation points (original, stage1, stage2, ...); a "train" block and, when held-out
    splits are present, a "held-out" block; per split: accuracy (%), Δ = change of accuracy
    against the original model (percentage points) and the mean cross-entropy CE (nats). The
    column head marks the good direction of each split's accuracy: ↓ forget, ↑ adjacent/remote.

    Args:
        evals: {tag: {split: {"acc": fraction, "loss": nats, ...}}} as returned by `evaluate`.
    """
    names: List[str] = []
    for e in evals.values():
        names += [n for n in e if n not in names]
    lines = ["accuracy % · Δ = change against the original (points) · CE = mean cross-entropy (nats)",
             "good direction: forget ↓ (forgotten), adjacent ↑ and remote ↑ (kept)"]
    for title, cols in (("train", [n for n in names if not n.endswith("_test")]),
                        ("held-out", [n for n in names if n.endswith("_test")])):
        if cols:
            lines += [""] + _block(title, cols, evals)
    return "\n".join(line.rstrip() for line in lines)


# ------------------------------------------------------------------------------- the histogram
def forget_histogram_figure(evals: Dict[str, Dict[str, dict]], bins: int = 40,
                            num_classes: Optional[int] = None):
    """A matplotlib Figure of the per-sample forget-train CE distributions (nats), on common bins.

    The right axes overlays the distributions after Stage 1 and after Stage 2 (the pair the W2
    term of Stage 2 compares, docs/algorithm.md §3); the left axes shows the original model's
    (other evaluation points without a stage go there too). With ``num_classes`` a dashed line,
    labelled in the legend, marks log C, the CE of a uniform prediction (the threshold of
    docs/algorithm.md §3, Prop. 4.2). Evaluation points without per-sample losses are left out.
    """
    from matplotlib.figure import Figure

    tags = [t for t, e in evals.items() if "losses" in e.get("forget", {})]
    stages = [t for t in tags if t.startswith("stage")]
    others = [t for t in tags if t not in stages]
    fig = Figure(figsize=(9.6, 3.6))
    axes = fig.subplots(1, 2, sharex=True, gridspec_kw={"width_ratios": [1, 2]}) if others and stages \
        else [fig.add_subplot()]
    top = [max(evals[t]["forget"]["losses"], default=0.0) for t in tags]
    hi = max(top + [math.log(num_classes or 2)]) * 1.02 or 1.0
    edges = [hi * i / bins for i in range(bins + 1)]   # common bins: comparable distributions
    colors = {"original": "tab:gray", "stage1": "tab:orange", "stage2": "tab:blue"}
    groups = [(axes[0], others), (axes[-1], stages)] if len(axes) == 2 else [(axes[0], tags)]
    for ax, group in groups:
        for t in group:
            ax.hist(evals[t]["forget"]["losses"], bins=edges, histtype="stepfilled", alpha=0.4,
                    color=colors.get(t), edgecolor=colors.get(t), linewidth=1.2,
                    label=f"{_TAGS.get(t, t)} (forget acc {100 * evals[t]['forget']['acc']:.1f}%)")
        if num_classes:
            ax.axvline(math.log(num_classes), color="k", ls="--", lw=1,
                       label=f"log C = {math.log(num_classes):.2f} nats (uniform prediction)")
        ax.set_xlabel("per-sample CE on the forget train set (nats)")
        ax.legend(fontsize="small")
    axes[0].set_ylabel("forget samples")
    if len(axes) == 2:
        axes[0].set_title("original model", fontsize="medium")
        axes[1].set_title("Stage 1 vs Stage 2 (the pair the W2 term compares)", fontsize="medium")
    fig.tight_layout()
    return fig


def plot_forget_histograms(evals: Dict[str, Dict[str, dict]], path: str, bins: int = 40,
                           num_classes: Optional[int] = None) -> str:
    """Write `forget_histogram_figure` as a PNG to ``path`` (no pyplot state is touched).
    Returns the path written."""
    fig = forget_histogram_figure(evals, bins=bins, num_classes=num_classes)
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"), what="histogram plot")
    return path


# ---------------------------------------------------------------------------- the fingerprint
#: the old name of `entangle_ext.unlearn.fingerprint.splits_fingerprint` (the same function)
split_fingerprint = splits_fingerprint


# ------------------------------------------------------------------------------- report files
def build_report(*, config: Dict[str, Any], num_classes: int, c0: float, lam: Optional[float],
                 history: List[Dict[str, float]], timings: Dict[str, float],
                 evals: Dict[str, Dict[str, dict]], checkpoint: Optional[str],
                 splits_fingerprint: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The JSON-serialisable report of `unlearn`: package version, UTC timestamp (ISO 8601), the
    `UNITS` of its numbers, config, C, c0 (nats), final λ, step counts per stage, timings
    (seconds), evaluations without the per-sample losses, last checkpoint and (when given) the
    `splits_fingerprint` of the data."""
    from .._version import __version__

    report = {"entangle_ext_version": __version__,
              "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "units": dict(UNITS), "config": config, "num_classes": num_classes, "c0": c0,
              "lambda_final": lam,
              "steps": {"stage1": sum(1 for h in history if h["stage"] == 1),
                        "stage2": sum(1 for h in history if h["stage"] == 2)},
              "timings_s": timings,
              "evals": {t: {n: {k: v for k, v in r.items() if k != "losses"} for n, r in e.items()}
                        for t, e in evals.items()},
              "checkpoint": checkpoint}
    if splits_fingerprint is not None:
        report["splits_fingerprint"] = splits_fingerprint
    return report


def save_report_json(out: Path, report: Dict[str, Any]) -> Path:
    """(Re)write ``out / "report.json"`` (`atomic_write`: a failed write is a `WriteError`
    naming the file, the cause and the free space); returns its path."""
    return atomic_write(Path(out) / "report.json", lambda tmp: tmp.write_text(json.dumps(report, indent=2)),
                        what="report")


class PlotSkippedWarning(UserWarning):
    """matplotlib is not installed: a figure was not drawn (the report and tables are written)."""


def plot_available(path) -> bool:
    """Whether matplotlib can be imported; when not, a `PlotSkippedWarning` names the figure
    ``path`` that is skipped and how to get it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        warnings.warn(f"matplotlib is not installed: {path} is not drawn (the report and tables are "
                      "written); pip install matplotlib to get it", PlotSkippedWarning, stacklevel=3)
        return False
    return True


def write_report(out: Path, report: Dict[str, Any], history: List[Dict[str, float]],
                 evals: Dict[str, Dict[str, dict]], *, bins: int, num_classes: int) -> None:
    """Write ``report.json`` and ``history.json`` under ``out``, then ``forget_loss_hist.png`` (its
    path goes into ``report["histogram_png"]``; None, with a `PlotSkippedWarning`, when
    matplotlib is not installed): the report never depends on the plot."""
    png = out / "forget_loss_hist.png"
    report["histogram_png"] = None
    save_report_json(out, report)
    atomic_write(out / "history.json", lambda tmp: tmp.write_text(json.dumps(history)), what="history")
    if plot_available(png):
        report["histogram_png"] = plot_forget_histograms(evals, str(png), bins=bins, num_classes=num_classes)
        save_report_json(out, report)


def write_curves_png(out: Path, report: Dict[str, Any], evals: Dict[str, Dict[str, dict]]) -> None:
    """``curves.png`` under ``out`` (a run's out_dir) when the run has curves and matplotlib is
    installed (its path into ``report["curves_png"]``, report.json rewritten), with the held-out
    accuracies of the stage-end evaluations (``evals``: {tag: {split: {"acc", ...}}}) as markers."""
    from . import curves   # only when a run has curves
    png = Path(out) / "curves.png"
    if not report["curves"] or not plot_available(png):
        return
    at, total = {"original": 0}, 0
    for key, n in report["steps"].items():
        total += n
        at[key if key.startswith("stage") else "final"] = total
    at.setdefault("final", total)
    at["end"] = total
    if report.get("selected") and report["selected"]["global_step"] is not None:
        at["selected"] = report["selected"]["global_step"]
    marks: Dict[str, list] = {}
    for tag, e in evals.items():
        for name, r in e.items():
            if name.endswith("_test") and tag in at:
                marks.setdefault(name[:-len("_test")], []).append((at[tag], r["acc"]))
    report["curves_png"] = curves.plot_curves(report["curves"], str(png), marks)
    save_report_json(Path(out), report)
