"""Curves of every train split during the stages, and the opt-in stopping rules that read them
(docs/algorithm.md "Curves, certificate and stopping rules (ours)"; not in the paper or the
reference code).

Every ``eval_every`` steps of a stage and at its end, `StageProbe` evaluates the model (eval
mode, no grad, no draw from any global generator) on a bounded seeded subsample of each train
split (`CurveProbe`, ``curve_samples`` samples per split) and appends one "curve" record: the
accuracy and mean CE of forget / adjacent / remote, and for the two-stage family the share of
forget samples with CE >= m, the Stage-1 constraint violation and the W2 distance of the
forget-loss profile to θ̄. A stopping rule is a predicate on that record."""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch.utils.data import Subset

from ..wasserstein import wasserstein2_1d
from .data import BatchStream, Source, Splits, loss_logits, split_batch, stream_seed
from .distributed import current
from .files import atomic_write, stage_label
from .inputs import training_flags_kept
from .precision import model_dtype

__all__ = ["curve_indices", "CurveProbe", "StageProbe", "default_margin", "forget_margin_rule",
           "adjacent_recovered_rule", "first_within_rule", "require_origin", "stage_label", "SelectionWarning", "CURVE_SPLITS",
           "curves_figure", "plot_curves"]

CURVE_SPLITS = ("forget", "adjacent", "remote")
"""The train splits a curve probe evaluates (each when present)."""


def default_margin(num_classes: int) -> float:
    """m = log C + 1 nats: the forget-loss margin of the certificate and of Stage 1's
    "forget_margin" rule when ``Stage1Config.margin`` is None. CE above log C means the true
    label gets less than the uniform 1/C probability (below-chance confidence); the extra nat asks
    for e-fold less than that. Raises ValueError for C < 1."""
    if int(num_classes) < 1:
        raise ValueError(f"the margin log C + 1 needs C >= 1 classes, got {num_classes}")
    return math.log(int(num_classes)) + 1.0


def curve_indices(n: int, samples: int, seed: int, name: str) -> torch.Tensor:
    """The dataset indices of split ``name``'s curve subsample: all n when n <= ``samples``, else
    ``samples`` distinct indices drawn by a private generator seeded from (seed, "curve/<name>")
    (no global generator is touched), sorted. Returns an int64 tensor of shape (min(n, samples),).
    Raises ValueError for samples < 1 or n < 0."""
    if samples < 1 or n < 0:
        raise ValueError(f"curve_indices: need samples >= 1 and n >= 0, got samples={samples}, n={n}")
    if n <= samples:
        return torch.arange(n)
    g = torch.Generator().manual_seed(stream_seed(seed, f"curve/{name}", 0))
    return torch.randperm(n, generator=g)[:samples].sort().values


@torch.no_grad()
def _per_sample(model, source: Source, device, batch_size: int):
    """(CE (N,) float64 nats, correct (N,) float64 0/1) of ``model`` on ``source``, in order;
    under several ranks each evaluates its part and every rank receives all N values."""
    d = current()
    s = BatchStream(source, batch_size, shuffle=False, seed=0, name="curve", device=device,
                    input_dtype=model_dtype(model))
    ce, ok = [], []
    for b in s.epoch_batches(0):
        inputs, y = split_batch(b)
        logits = loss_logits(model, inputs)
        ce.append(F.cross_entropy(logits, y.long(), reduction="none").double())
        ok.append(((logits.argmax(1) == y) & torch.isfinite(ce[-1])).double())   # NaN logits: not correct
    sizes = [len(i) for i in s.global_batch_indices(0)]
    return d.gather(torch.cat(ce), sizes), d.gather(torch.cat(ok), sizes)


class CurveProbe:
    """The curve subsamples of a run's train splits and their evaluation.

    Args:
        model: classifier returning (B, C) logits. splits: the run's `Splits` (forget, adjacent,
            remote each used when present). samples: subsample size per split (>= 1). seed: the
            run's seed (fixes the subsample). device, batch_size: of the evaluation passes.
    ``indices[name]``: the subsample's dataset indices (`curve_indices`).
    """

    def __init__(self, model: torch.nn.Module, splits: Splits, *, samples: int, seed: int, device,
                 batch_size: int):
        self.model, self.device, self.batch_size = model, device, batch_size
        self.indices: Dict[str, torch.Tensor] = {}
        self.sources: Dict[str, Source] = {}
        for name in CURVE_SPLITS:
            if getattr(splits, name) is None:
                continue
            src = splits.source(name)
            idx = curve_indices(len(src.dataset), samples, seed, name)
            self.indices[name] = idx
            self.sources[name] = Source(Subset(src.dataset, idx.tolist()), src.collate_fn, {})

    def measure(self, *, margin: Optional[float] = None, origin: Optional[Dict[str, Any]] = None,
                w2_ref: Optional[torch.Tensor] = None) -> Dict[str, float]:
        """One probe: {"<split>_acc" (fraction), "<split>_loss" (mean CE, nats)} per split; with
        ``margin`` m also "forget_margin_share" (fraction of forget samples with CE >= m); with
        ``origin`` (the original model's probe record) "violation" = remote mean CE − origin's
        (nats, the Stage-1 constraint g on the subsample); with ``w2_ref`` (the forget
        subsample's per-sample CE at θ̄, shape (n_forget,)) "w2" = W2(profile now, w2_ref) in
        nats (the square root of `entangle_ext.wasserstein2_1d`, docs/algorithm.md §4). The model
        runs in eval mode; its training flags are restored."""
        out: Dict[str, float] = {}
        with training_flags_kept(self.model):
            self.model.eval()
            ce_f = None
            for name, src in self.sources.items():
                ce, ok = _per_sample(self.model, src, self.device, self.batch_size)
                out[f"{name}_acc"], out[f"{name}_loss"] = float(ok.mean()), float(ce.mean())
                ce_f = ce if name == "forget" else ce_f
        if margin is not None and ce_f is not None:
            out["forget_margin_share"] = float((ce_f >= margin).double().mean())
        if origin is not None and "remote_loss" in out and "remote_loss" in origin:
            out["violation"] = out["remote_loss"] - float(origin["remote_loss"])
        if w2_ref is not None and ce_f is not None:
            w2sq = wasserstein2_1d(ce_f.cpu(), w2_ref.detach().double().cpu(), validate=False)
            out["w2"] = math.sqrt(max(float(w2sq), 0.0)) if math.isfinite(float(w2sq)) else float("nan")
        return out


class StageProbe:
    """The ``probe`` of one stage's `StageLoop` (``entangle_ext/unlearn/loop.py``): called with the
    number of steps completed (and ``final``: the budget's last step, where no rule is checked),
    it appends the curve record {"kind": "curve", "stage", "step", "global_step" (= ``offset`` +
    step), **``measure()``} to ``records``, passes it to ``observe`` (when given; the model is
    still at that state) and returns True when the
    stopping ``rule`` (a predicate on that record, named ``rule_name``) holds, i.e. the stage
    ends after this step (``stopped_at`` = step; `stop_reason` says why). A run object: its
    records travel in every mid-stage checkpoint (`state_dict` / `load_state_dict`), so a resumed
    stage's curve equals the uninterrupted one's."""

    def __init__(self, measure: Callable[[], Dict[str, float]], *, stage, offset: int = 0,
                 rule: Optional[Callable[[Dict[str, Any]], bool]] = None, rule_name: Optional[str] = None,
                 observe: Optional[Callable[[Dict[str, Any]], None]] = None):
        self.measure, self.stage, self.offset = measure, stage, int(offset)
        self.rule, self.rule_name, self.observe = rule, rule_name, observe
        self.records: List[Dict[str, Any]] = []
        self.stopped_at: Optional[int] = None

    def __call__(self, step: int, final: bool = False) -> bool:
        rec = {"kind": "curve", "stage": self.stage, "step": int(step), "global_step": self.offset + int(step),
               **self.measure()}
        self.records.append(rec)
        if self.observe is not None:   # the run's checkpoint selection sees every probed state
            self.observe(rec)
        if self.rule is not None and not final and bool(self.rule(rec)):
            self.stopped_at = int(step)
            return True
        return False

    def stop_reason(self) -> str:
        """Which rule ended the stage and why, for the console: "stopping rule '<rule_name>' held"
        and, when the rule has an ``explain(record)`` (the rules of this module do), its values at
        the step it held (``stopped_at``)."""
        rec = next((r for r in reversed(self.records) if r["step"] == self.stopped_at), None)
        explain = getattr(self.rule, "explain", None)
        why = f": {explain(rec)}" if explain is not None and rec is not None else ""
        return f"stopping rule {self.rule_name!r} held{why}"

    def state_dict(self) -> Dict[str, Any]:
        return {"records": [dict(r) for r in self.records], "stopped_at": self.stopped_at}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.records = [dict(r) for r in state.get("records", [])]
        self.stopped_at = state.get("stopped_at")


#: Slack of the accuracy comparisons of the rules (fractions): an accuracy of k/n minus another is
#: not exact in floating point (1 − 0.98 = 0.020000000000000018), and a gap of exactly δ counts.
ACC_TOL = 1e-9


def forget_margin_rule(fraction: float, tolerance: float) -> Callable[[Dict[str, Any]], bool]:
    """Stage 1's "forget_margin" rule: True when a share >= ``fraction`` (q) of the forget train
    subsample has CE >= m (the record's "forget_margin_share") and |violation| <= ``tolerance``
    nats. Reads train data only. ``rule.explain(record)``: the values it compared, in words."""
    def rule(r: Dict[str, Any]) -> bool:
        return r["forget_margin_share"] >= fraction and abs(r["violation"]) <= tolerance
    rule.explain = lambda r: (
        f"{100 * r['forget_margin_share']:.1f}% of the forget train subsample has CE >= the margin m "
        f"(needed: >= {100 * fraction:.1f}%) and the constraint violation |g| = {abs(r['violation']):.4f} "
        f"nats (<= {tolerance:g})")
    return rule


def adjacent_recovered_rule(original_acc: float, delta: float, eps: float) -> Callable[[Dict[str, Any]], bool]:
    """Stage 2's "adjacent_recovered" rule: True when the adjacent train subsample's accuracy is
    at most ``delta`` (a fraction) below ``original_acc`` (the original model's on the same
    subsample; a gap of exactly ``delta`` counts, `ACC_TOL`) and the forget profile's W2 distance
    to θ̄ is <= ``eps`` nats. Train data only. ``rule.explain(record)``: the values it compared,
    in words."""
    def rule(r: Dict[str, Any]) -> bool:
        return original_acc - r["adjacent_acc"] <= delta + ACC_TOL and r["w2"] <= eps
    rule.explain = lambda r: (
        f"the adjacent train subsample's accuracy {100 * r['adjacent_acc']:.2f}% is within "
        f"{100 * delta:.2f} points of the original model's {100 * original_acc:.2f}% and the forget-loss "
        f"W2 to θ̄ is {r['w2']:.4g} nats (<= {eps:g})")
    return rule


def require_origin(origin: Optional[Dict[str, Any]], what: str) -> Dict[str, Any]:
    """``origin`` (the original model's curve record), or ValueError naming ``what`` (e.g.
    "stage2.until='adjacent_recovered'") that needs it: a run resumed from a checkpoint written
    with curves off has none."""
    if origin is None:
        raise ValueError(f"{what} compares with the original model's curve record, which this run lacks: it "
                         "resumed a checkpoint written with eval_every=0; restart the run with eval_every > 0")
    return origin


class SelectionWarning(UserWarning):
    """``select="first_within"`` found no probed state within its bounds: the run returned its
    final state (the report's ``selected`` entry says so)."""


def first_within_rule(origin: Dict[str, Any], forget_acc_max: float,
                      delta: float) -> Callable[[Dict[str, Any]], bool]:
    """The checkpoint-selection rule "first_within": True for a curve record whose forget train
    subsample accuracy is <= ``forget_acc_max`` (a fraction) and whose adjacent and remote ones
    (those the run has) are at most ``delta`` (a fraction) below ``origin``'s (the original
    model's record); a gap of exactly ``delta`` counts (`ACC_TOL`). Train data only."""
    kept = [n for n in ("adjacent", "remote") if f"{n}_acc" in origin]

    def rule(r: Dict[str, Any]) -> bool:
        return r["forget_acc"] <= forget_acc_max + ACC_TOL and \
            all(float(origin[f"{n}_acc"]) - r[f"{n}_acc"] <= delta + ACC_TOL for n in kept)
    return rule


def curves_figure(records: List[Dict[str, Any]], marks: Optional[Dict[str, Any]] = None):
    """A matplotlib Figure: accuracy (%) of the forget / adjacent / remote train subsamples vs
    the global step (``records``: the curve records, every stage), a dotted line at each stage
    boundary, and ``marks`` = {split: [(global step, accuracy fraction), ...]} (the held-out
    evaluations at the stage ends and, with ``select``, at the kept step) as markers in the
    split's colour. Laid out by matplotlib's constrained layout (no layout warning whatever the
    accuracies); each boundary's label sits at the bottom of the axes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 4.0), layout="constrained")
    ax = fig.add_subplot()
    colors = {"forget": "tab:red", "adjacent": "tab:orange", "remote": "tab:blue"}
    steps = [r["global_step"] for r in records]
    for name in CURVE_SPLITS:
        if records and f"{name}_acc" in records[-1]:
            ax.plot(steps, [100 * r.get(f"{name}_acc", float("nan")) for r in records], color=colors[name],
                    marker=".", label=f"{name} train (subsample)")
        for x, acc in (marks or {}).get(name, []):
            ax.plot([x], [100 * acc], marker="D", ls="none", color=colors[name], markerfacecolor="none")
    ends = {}
    for r in records:
        if r["stage"] != "original":
            ends[r["stage"]] = r["global_step"]
    for stage, x in list(ends.items())[:-1]:
        ax.axvline(x, color="k", ls=":", lw=1)
        # x in data, y in axes fractions: inside the axes whatever the accuracies (at y = 1 % it lay
        # far below axes spanning e.g. 95-100 %, and tight_layout could not fit it)
        ax.text(x, 0.02, f" end of {stage if not isinstance(stage, int) else f'Stage {stage}'}", fontsize="small",
                transform=ax.get_xaxis_transform())
    ax.set_xlabel("global step")
    ax.set_ylabel("accuracy %")
    ax.set_title("curves (lines: train subsamples; open diamonds: held-out evaluations)", fontsize="medium")
    ax.legend(fontsize="small")
    return fig


def plot_curves(records: List[Dict[str, Any]], path: str, marks: Optional[Dict[str, Any]] = None) -> str:
    """Write `curves_figure` as a PNG to ``path`` (atomically; no pyplot state); returns the path."""
    fig = curves_figure(records, marks)
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"), what="curves plot")
    return path
