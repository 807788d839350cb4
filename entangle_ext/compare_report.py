"""The outputs of `entangle_ext.compare`: the per-seed summary (mean ± std; no std for one seed), the
markdown table with the direction of every metric and the best value per column in bold (among the
unlearning methods that keep the adjacent and remote splits within a band of the original model,
`BOLD_BAND`; when two or more of them have the metric), the bar-chart PNG, and the one
`MIAUndefinedWarning` of a comparison (`warn_undefined_mia`)."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import math
import numbers
import warnings

import numpy as np

from .unlearn.files import atomic_write
from .unlearn.metrics import METRICS
from .unlearn.mia import MIA_MIN_BALANCED_ACCURACY, MIAUndefinedWarning

__all__ = ["summarize", "format_markdown", "plot_comparison", "TABLE_COLUMNS", "REFERENCE_ROWS", "BOLD_BAND",
           "BAND_SPLITS", "check_band", "warn_undefined_mia"]

REFERENCE_ROWS = ("original", "retrain")   # shown, never marked best
TABLE_COLUMNS = ("acc_forget_test", "acc_adjacent_test", "acc_remote_test", "UA", "RA", "TA", "mia_forget",
                 "mia_adjacent", "mia_remote", "avg_gap", "forget_quality", "forget_ks", "relearn_steps", "time_s")
"""The metrics of the table, in order (`METRICS` keys); absent ones are dropped."""
BOLD_BAND = 5.0
"""Default band of the bold rule, in percentage points: a method is bold-eligible only when its mean
accuracy on each split of `BAND_SPLITS` is within ± this of the original model's (the "within 5
points of the original" adjacent / remote target of README). A method that wipes the adjacent
split (or inflates it) is never bold, whatever its forget column says."""
BAND_SPLITS = ("adjacent", "remote")
"""The "other" splits of the bold band: held-out accuracy (``acc_<split>_test``), or train accuracy
(``acc_<split>``) where the original row has no held-out value."""


def summarize(runs: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """{method: {metric: {"mean", "std", "n"}}} over seeds; std is the sample standard deviation
    (ddof 1), None for one value (undefined, not zero: one seed says nothing about the spread);
    None values are left out. NaN values (undefined metrics: an MIA attack without signal,
    docs/algorithm.md §10) are left out of mean, std and "n" (the count of defined values) and
    counted in "undefined" (present only when > 0); a metric undefined on every seed has mean and
    std None and n 0."""
    out = {}
    for method, by_seed in runs.items():
        keys = [k for r in by_seed.values() for k in r]
        out[method] = {}
        for k in dict.fromkeys(keys):
            vals = [float(r[k]) for r in by_seed.values() if r.get(k) is not None]
            v = np.array([x for x in vals if not math.isnan(x)])
            undefined = len(vals) - v.size
            if v.size:
                out[method][k] = {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else None,
                                  "n": int(v.size)}
            elif undefined:
                out[method][k] = {"mean": None, "std": None, "n": 0}
            if undefined:
                out[method][k]["undefined"] = undefined
    return out


def _defined(s: Optional[Mapping[str, Any]]) -> bool:
    return s is not None and s.get("mean") is not None


def _cell(k: str, s: Mapping[str, Any]) -> str:
    """"mean ± std", or the mean alone when std is None (one value); "–" when undefined on every
    seed; "(n/N)" after it when only n of N values are defined."""
    if not _defined(s):
        return "–"
    if s.get("undefined"):
        return f"{_cell(k, {**s, 'undefined': 0})} ({s['n']}/{s['n'] + s['undefined']})"
    mean = _shown(k, s["mean"])
    if s["std"] is None:
        return mean
    std = f"{s['std']:.2g}" if k == "forget_quality" else _shown(k, s["std"])
    return f"{mean} ± {std}"


def _shown(k: str, x: float) -> str:
    """A mean (or std) of metric ``k`` as its cell prints it: 3 decimals for forget_ks, 3
    significant digits for forget_quality, 2 decimals for time_s, else 1 (percentages)."""
    if k == "forget_ks":
        return f"{x:.3f}"
    if k == "forget_quality":
        return f"{x:.3g}"
    return f"{x:.{2 if k == 'time_s' else 1}f}"


def _band(summary, order: Sequence[str], band: Optional[float]) -> Tuple[List[str], List[str], str]:
    """(the unlearning rows eligible for bold, the accuracy keys the band was judged on, why none can
    be judged or ""). ``band`` None: every unlearning row, no keys. Otherwise a row is eligible when
    for every split of `BAND_SPLITS` it has a defined mean within ± ``band`` points of the original
    row's (held-out accuracy, else train); no original row or no such accuracy: none is eligible."""
    rows = [m for m in order if m not in REFERENCE_ROWS]
    if band is None:
        return rows, [], ""
    ref = summary.get("original")
    if ref is None:
        return [], [], "no original row to judge the band"
    keys = [k for k in (next((k for k in (f"acc_{sp}_test", f"acc_{sp}") if _defined(ref.get(k))), None)
                        for sp in BAND_SPLITS) if k is not None]   # held-out accuracy, else train
    if not keys:
        return [], [], "the original row has no adjacent / remote accuracy to judge the band"
    ok = [m for m in rows if all(_defined(summary[m].get(k)) and abs(summary[m][k]["mean"] - ref[k]["mean"]) <= band
                                  for k in keys)]
    return ok, keys, ""


def _best(summary, eligible: Sequence[str], cols: Sequence[str]) -> Dict[str, float]:
    """{metric: best mean} among the ``eligible`` rows (`_band`), for the metrics where at least two
    of them have a value (with one, "best" would say nothing)."""
    best = {}
    for k in cols:
        cand = [summary[m][k]["mean"] for m in eligible if _defined(summary[m].get(k))]
        if len(cand) >= 2:
            best[k] = max(cand) if METRICS[k].direction == "up" else min(cand)
    return best


def _bold_rule(order: Sequence[str], band: Optional[float], eligible: Sequence[str], keys: Sequence[str],
               why: str, bold: bool) -> str:
    """The one line under the table that states the bold rule and which rows it admitted."""
    refs = "original and retrain are references, never bold"
    if band is None:
        return (f"Bold rule: **bold** = best among the unlearning methods, no band on the other splits ({refs}); "
                + ("" if bold else "no value is bold: fewer than two unlearning methods to rank."))
    on = " and ".join(METRICS[k].label for k in keys) or "adjacent and remote accuracy"
    rule = (f"Bold rule: **bold** = best mean per column among the unlearning methods whose {on} stay within "
            f"{band:g} points (either way) of the original's ({refs}); a column with fewer than two such values "
            "has no bold")
    out = [m for m in order if m not in REFERENCE_ROWS and m not in eligible]
    if why:
        return f"{rule}. No value is bold: {why}."
    admitted = f"Within the band: {', '.join(eligible) or 'none'}; outside: {', '.join(out) or 'none'}"
    return f"{rule}. {admitted}" + ("." if bold else "; no value is bold: fewer than two methods within the band.")


def _legend(summary, order: Sequence[str], cols: Sequence[str], seeds: Sequence[int]) -> str:
    undefined = any(summary[m].get(k, {}).get("undefined") for m in order for k in cols)
    stds = [summary[m][k]["std"] for m in order for k in cols if _defined(summary[m].get(k))]
    if stds and all(s is None for s in stds):
        spread = f"One value per cell (seeds {list(seeds)}: one run each, so no std)."
    else:
        spread = f"Mean ± std (ddof 1) over seeds {list(seeds)}" + \
            ("; a cell without ± holds one value." if any(s is None for s in stds) else ".")
    units = ", ".join(f"{METRICS[k].label} in {METRICS[k].unit}" for k in cols if METRICS[k].unit != "%")
    return (f"{spread} ↑ higher is better, ↓ lower is better. Accuracies, UA/RA/TA and MIA in %; "
            f"{units}. MIA-efficacy = % of a split's train samples an SVC on the true-label probability calls "
            "non-member: high on forget = forgotten, high on adjacent / remote = damaged (docs/algorithm.md §10)."
            + (" MIA \"–\" = undefined on every seed, \"(n/N)\" = mean over the n of N seeds where it is defined: "
               "undefined when the attack has no signal on its own members vs non-members (balanced accuracy "
               f"<= {MIA_MIN_BALANCED_ACCURACY})." if undefined else ""))


def check_band(band) -> Optional[float]:
    """``band`` as a float: None (no band) or a finite number >= 0 of percentage points (ValueError
    otherwise, TypeError for a non-number); see `BOLD_BAND`."""
    if band is None:
        return None
    if not isinstance(band, numbers.Real) or isinstance(band, bool):
        raise TypeError(f"band must be None or a number of percentage points, got {band!r}")
    if not (math.isfinite(band) and band >= 0):
        raise ValueError(f"band must be a finite number of percentage points >= 0 (or None), got {band!r}")
    return float(band)


def format_markdown(summary: Mapping[str, Mapping[str, Mapping[str, Any]]], *, seeds: Sequence[int] = (),
                    order: Optional[Sequence[str]] = None, columns: Sequence[str] = TABLE_COLUMNS,
                    failures: Optional[Mapping[str, Mapping[int, str]]] = None, budget: float = 1.0,
                    band: Optional[float] = BOLD_BAND) -> str:
    """Markdown table: rows = methods (``order``), columns = the metrics of ``columns`` present in
    ``summary`` with their direction (↑ / ↓), cells "mean ± std" (the mean alone for one seed;
    "–" for a metric undefined on every seed, "(n/N)" after a mean over n of N seeds, see
    `summarize`).

    Bold: the best (defined) mean per column, as printed (every mean whose cell prints the best
    one's digits is bold: a tie on the page is a tie), among the unlearning methods (never original / retrain)
    whose mean adjacent and remote accuracy (held-out, else train; `BAND_SPLITS`) are within
    ± ``band`` percentage points of the "original" row's (default `BOLD_BAND` = 5), in a column where
    at least two such methods have a value; a method outside the band is bold nowhere, and without an
    original row nothing is bold. ``band=None``: no band (every unlearning method ranks). The line
    under the table states this rule and which methods were within the band; the legend follows
    (cells, directions, units), then, when ``budget`` is not 1, the common factor of every method's
    epochs (``from entangle_ext.compare import scale_budget``), then one line per failed run of
    ``failures`` ({method: {seed: message}}). Returns the markdown text (str).
    Raises: ValueError / TypeError for a bad ``band`` (`check_band`); KeyError for a column not in
    `METRICS`."""
    band = check_band(band)
    order = list(order or summary)
    cols = [k for k in columns if any(k in summary[m] for m in order)]
    eligible, keys, why = _band(summary, order, band)
    best = _best(summary, eligible, cols)
    head = ["method"] + [f"{METRICS[k].label} {METRICS[k].arrow}" for k in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in order:
        cells = [m]
        for k in cols:
            s = summary[m].get(k)
            c = "–" if s is None else _cell(k, s)
            # bold as printed: a mean that prints as the best one is bold too (ranking unrounded
            # means bolded one of two cells that read the same)
            top = k in best and _defined(s) and m in eligible and _shown(k, s["mean"]) == _shown(k, best[k])
            cells.append(f"**{c}**" if top else c)
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", _bold_rule(order, band, eligible, keys, why, bool(best)), "", _legend(summary, order, cols, seeds)]
    if budget != 1:
        lines += ["", f"Every method's training passes (epochs; Stage 1 / Stage 2 epochs; Retrain's epochs) are "
                      f"its preset's × {float(budget)!r}, rounded up to whole epochs (one common factor)."]
    failed = [(m, sd, msg) for m, by_seed in (failures or {}).items() for sd, msg in sorted(by_seed.items())]
    if failed:
        lines += ["", "Runs that stopped on a non-finite loss (not in the means; no retry, no tuning):"]
        lines += [f"- {m}, seed {sd}: {msg.split(';')[0]}" for m, sd, msg in failed]
    return "\n".join(lines)


def error_bar_caption(summary: Mapping[str, Mapping[str, Mapping[str, float]]], order: Sequence[str]) -> str:
    """What the comparison figure's error bars are: ± 1 sample standard deviation over the seeds
    (with their number), or none for one seed."""
    ns = sorted({int(v["n"]) for m in order for v in summary[m].values()
                 if isinstance(v, Mapping) and v.get("n")})
    if not ns or ns == [1]:
        return "one seed per method: no error bars"
    seeds = str(ns[0]) if len(ns) == 1 else f"{ns[0]}-{ns[-1]}"
    return f"bars: mean over {seeds} seeds; error bars: ± 1 sample standard deviation over the seeds"


TICK_CHARS = 40
"""The longest method name `plot_comparison` writes under its bars whole: a longer one (a
`MethodSpec` of one's own) left tight_layout no room for the axes ("Tight layout not applied")."""


def _tick(name: str) -> str:
    return name if len(name) <= TICK_CHARS else name[:TICK_CHARS - 1] + "…"


def plot_comparison(summary: Mapping[str, Mapping[str, Mapping[str, float]]], path: str,
                    order: Optional[Sequence[str]] = None) -> str:
    """PNG (matplotlib, Agg): per-method bars of forget / adjacent / remote held-out accuracy and of
    MIA-efficacy per split, with ± std error bars (none for one seed), said under the figure
    (`error_bar_caption`); no bar where a value is absent or undefined (an MIA attack without
    signal on every seed). A method name longer than `TICK_CHARS` is cut to that many characters,
    ending in "…", on the axis (the table has it whole). Returns ``path``."""
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
            s = [summary[m].get(k) for m in order]
            keep = [i for i, v in enumerate(s) if _defined(v)]   # no bar for an absent / undefined value
            ax.bar(x[keep] + (j - 1) * w, [s[i]["mean"] for i in keep], w, yerr=[s[i]["std"] or 0.0 for i in keep],
                   capsize=2, color=color, label=k.split("_")[1])
        ax.set_xticks(x, [_tick(m) for m in order], rotation=30, ha="right")
        ax.set_ylim(0, 105)
        ax.set_title(title)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="upper center", ncol=3, fontsize=8, frameon=False)
    fig.text(0.5, 0.005, error_bar_caption(summary, order), ha="center", va="bottom", fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 0.96))
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"), what="comparison plot")
    finally:
        plt.close(fig)
    return path


def warn_undefined_mia(runs: Mapping[str, Mapping[int, Mapping[str, Any]]],
                       skip: Optional[Mapping[str, Sequence[int]]] = None) -> None:
    """The one `MIAUndefinedWarning` of a `compare` call (whose runs warned none themselves, inside
    `mia_undefined_scope`): it names every run of ``runs`` = {method: {seed: metrics}} with an
    undefined (NaN) "mia_<split>", but those of ``skip`` = {method: [seeds]} (results reused from
    the cache), and the splits. No such run: no warning."""
    bad: Dict[str, List[int]] = {}
    splits = set()
    for m, by in runs.items():
        for seed, r in by.items():
            nan = {k[len("mia_"):] for k, v in r.items()
                   if k.startswith("mia_") and isinstance(v, float) and math.isnan(v)}
            if nan and seed not in (skip or {}).get(m, ()):
                bad.setdefault(m, []).append(seed)
                splits |= nan
    if bad:
        names = "; ".join(f"{m} seed{'s' if len(k) > 1 else ''} {','.join(map(str, k))}" for m, k in bad.items())
        warnings.warn(f"MIA-efficacy undefined (NaN) for {sorted(splits)} in {sum(map(len, bad.values()))} run(s) of "
                      f"this comparison ({names}): the attack's balanced accuracy on its own members vs non-members "
                      f"was <= {MIA_MIN_BALANCED_ACCURACY} (no signal), so its verdict on a split would only say on "
                      "which side of an arbitrary boundary it lies; the table shows \"–\" (or the mean over the "
                      "seeds where it is defined)", MIAUndefinedWarning, stacklevel=3)
