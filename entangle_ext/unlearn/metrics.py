"""The field's unlearning metrics (docs/algorithm.md §10), each with its direction and source.

`unlearning_metrics(model, splits, retrained=...)` returns one flat dict whose keys are described by
`METRICS` (label, direction "up"/"down" = higher/lower is better, unit, source). The building blocks:

* `per_sample` - per-sample CE, softmax probability of the true label and correctness (no grad);
* `mia_efficacy` - the SalUn / Unlearn-Sparse membership-inference efficacy, per split;
* `average_gap`, `forget_ks_test` (KS statistic and p-value), `forget_quality_ks` (the p-value) -
  distances to a model retrained without D_f;
* `relearn_time` - fine-tuning steps on a small forget subset until forget accuracy returns.

scikit-learn (MIA) and scipy (Kolmogorov-Smirnov) are optional: imported inside the functions that
need them, with an ImportError naming the ``metrics`` extra when missing.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Subset, TensorDataset

from .._optional import optional_import
from .data import BatchStream, Source, Splits, as_source, check_batch_size, loss_logits, require_graph, split_batch
from .distributed import SINGLE
from .evaluate import NonFiniteOutputError, evaluate, per_sample, per_sample_of_outputs
from .mia import (MIA_MIN_BALANCED_ACCURACY, MIAUndefinedWarning, mia_efficacy, mia_efficacy_from_features,
                  mia_undefined_scope, MIA_SPLITS)
from .inputs import model_device, training_grad_mode
from .model_copy import copy_model
from .precision import model_dtype

__all__ = ["METRICS", "MetricInfo", "per_sample", "mia_efficacy", "mia_efficacy_from_features",
           "MIAUndefinedWarning", "MIA_MIN_BALANCED_ACCURACY", "mia_undefined_scope", "MIA_SPLITS",
           "NonFiniteOutputError",
           "average_gap", "gap_metrics", "forget_quality_ks",
           "forget_ks_test", "relearn_time", "RELEARN_LR", "RELEARN_LR_GROWTH", "RELEARN_MAX_STEPS", "unlearning_metrics"]


@dataclass(frozen=True)
class MetricInfo:
    """What a metric means: ``direction`` "up" (higher is better) or "down"; ``unit``; ``source``."""
    label: str
    direction: str
    unit: str
    source: str

    @property
    def arrow(self) -> str:
        return "↑" if self.direction == "up" else "↓"


_ACC = "Cheng et al. (ICLR 2026) Table 1; docs/algorithm.md §10"
_SALUN = "Jia et al. 2023 (Unlearn-Sparse), Fan et al. 2024 (SalUn)"
METRICS: Dict[str, MetricInfo] = {
    **{f"acc_{s}{t}": MetricInfo(f"{s}{' test' if t else ''} acc", "down" if s == "forget" else "up", "%", _ACC)
       for t in ("", "_test") for s in ("forget", "adjacent", "remote")},
    "UA": MetricInfo("UA", "up", "%", f"unlearning accuracy = 100 - forget-train accuracy; {_SALUN}"),
    "RA": MetricInfo("RA", "up", "%", f"retain (adjacent + remote) train accuracy; {_SALUN}"),
    "TA": MetricInfo("TA", "up", "%", f"retain (adjacent + remote) held-out accuracy; {_SALUN}"),
    "mia_forget": MetricInfo("MIA forget", "up", "%", f"MIA-efficacy, % predicted non-member; NaN (undefined) "
                             f"when the attack has no signal on its own training data; {_SALUN}"),
    "mia_adjacent": MetricInfo("MIA adjacent", "down", "%", "MIA-efficacy on D_adj (high = damaged); NaN as "
                               "MIA forget; docs/algorithm.md §10"),
    "mia_remote": MetricInfo("MIA remote", "down", "%", "MIA-efficacy on D_rem (high = damaged); NaN as "
                             "MIA forget; docs/algorithm.md §10"),
    "avg_gap": MetricInfo("avg gap", "down", "points", f"mean |Δ| of UA, RA, TA, MIA vs Retrain (an undefined "
                          f"MIA left out); {_SALUN}"),
    "forget_quality": MetricInfo("forget quality", "up", "p-value", "KS test of per-sample forget losses vs "
                                 "Retrain; after Maini et al. 2024 (TOFU)"),
    "forget_ks": MetricInfo("forget KS D", "down", "[0, 1]", "two-sample KS statistic D in [0, 1] (largest "
                            "ECDF distance) of per-sample forget losses vs Retrain; after Maini et al. 2024 (TOFU)"),
    "relearn_steps": MetricInfo("relearn", "up", "steps", "relearn time: Adam steps of a geometric lr schedule "
                                "(docs/algorithm.md §10); after Golatkar et al. 2020"),
    "time_s": MetricInfo("time", "down", "s", f"wall clock of the unlearning call (RTE); {_SALUN}"),
}
"""Every key `unlearning_metrics` may return, with its meaning, direction and source."""

_GAP_KEYS = ("UA", "RA", "TA", "mia_forget")


def _optional(module: str, what: str):
    return optional_import(module, what, "metrics")


def require_metric_dependencies() -> None:
    """ImportError naming the extra (``entangle_ext[metrics]``) when an optional package the
    metrics need is missing (scikit-learn, for MIA-efficacy): checked before any run, so a
    comparison does not train every method and then fail."""
    _optional("sklearn.svm", "MIA-efficacy (a metric of every comparison)")


def forget_ks_test(losses: Union[Sequence[float], torch.Tensor],
                   retrained_losses: Union[Sequence[float], torch.Tensor]) -> Dict[str, float]:
    """Two-sample Kolmogorov-Smirnov test (``scipy.stats.ks_2samp``, two-sided) between the
    per-sample forget losses (nats; any 1-D-reshapeable sequence or tensor, cast to float64) of the
    unlearned and of the retrained model (docs/algorithm.md §10; after Maini et al. 2024, TOFU).
    Returns {"statistic": D in [0, 1], the largest distance between the two empirical CDFs (↓ better:
    0 = the same distribution as Retrain's), "pvalue": in [0, 1] ("forget quality", ↑ better)}. D
    keeps its resolution where the p-value underflows (1e-260 for every method on a large forget set).
    Raises: ValueError for empty or non-finite losses; ImportError without scipy."""
    stats = _optional("scipy.stats", "the forget-quality test")
    a, b = (np.asarray(torch.as_tensor(v, dtype=torch.float64).reshape(-1)) for v in (losses, retrained_losses))
    if a.size == 0 or b.size == 0 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("forget_ks_test / forget_quality_ks need non-empty, finite per-sample losses")
    r = stats.ks_2samp(a, b)
    return {"statistic": float(r.statistic), "pvalue": float(r.pvalue)}


def forget_quality_ks(losses: Union[Sequence[float], torch.Tensor],
                      retrained_losses: Union[Sequence[float], torch.Tensor]) -> float:
    """Forget quality: the p-value of `forget_ks_test` (per-sample forget losses in nats of the
    unlearned and of the retrained model; docs/algorithm.md §10). ↑ better: 1 = indistinguishable
    from Retrain. Raises: ValueError for empty or non-finite losses; ImportError without scipy."""
    return forget_ks_test(losses, retrained_losses)["pvalue"]


def average_gap(metrics: Mapping[str, Any], retrained: Mapping[str, Any], keys: Sequence[str] = _GAP_KEYS) -> float:
    """Average gap to Retrain (SalUn): mean over ``keys`` (default UA, RA, TA, MIA-efficacy on
    forget; percentage points) of |metrics[k] - retrained[k]|; keys missing, None or NaN in either
    dict (e.g. TA without held-out data; an undefined MIA-efficacy) are skipped. ↓ better. Raises ValueError when none is left."""
    def defined(v):
        return v is not None and not math.isnan(float(v))
    d = [abs(float(metrics[k]) - float(retrained[k])) for k in keys
         if defined(metrics.get(k)) and defined(retrained.get(k))]
    if not d:
        raise ValueError(f"average_gap: none of {list(keys)} is defined in both metric dicts")
    return sum(d) / len(d)


def gap_metrics(metrics: Mapping[str, Any], forget_losses: Union[Sequence[float], torch.Tensor],
                retrained: Mapping[str, Any]) -> Dict[str, float]:
    """The metrics of a run that compare it with Retrain (docs/algorithm.md §10): {"avg_gap":
    `average_gap` (percentage points, ↓), "forget_quality": the KS p-value (↑) and "forget_ks": the
    KS statistic D (↓) of `forget_ks_test`}, from the run's ``metrics`` (its UA/RA/TA/"mia_forget"),
    its per-sample forget-train losses (nats; ``(n_forget,)`` sequence or tensor) and Retrain's
    `unlearning_metrics(..., keep_losses=True)` dict (its "forget_losses" included). `unlearning_metrics`
    adds these when given ``retrained``; `compare` adds them to each cached record when it assembles the
    table, so no record depends on its seed's Retrain run.
    Raises: ValueError as `average_gap` and `forget_ks_test`; KeyError without ``retrained["forget_losses"]``;
    ImportError without scipy."""
    ks = forget_ks_test(forget_losses, retrained["forget_losses"])
    return {"avg_gap": average_gap(metrics, retrained), "forget_quality": ks["pvalue"], "forget_ks": ks["statistic"]}


def _subset(src: Source, idx: torch.Tensor) -> Source:
    """Items ``idx`` of a split, batched as the split is."""
    ds = src.dataset
    tensors = getattr(ds, "tensors", None)
    part = TensorDataset(*[t[idx.to(t.device)] for t in tensors]) if tensors is not None else Subset(ds, idx.tolist())
    return src._replace(dataset=part)


RELEARN_LR, RELEARN_LR_GROWTH, RELEARN_MAX_STEPS = 1e-5, 1.1, 100
"""The relearn schedule's defaults (docs/algorithm.md §10): Adam step k (from 0) has learning
rate ``RELEARN_LR * RELEARN_LR_GROWTH**k``, so the step count grows with the logarithm of the
distance to relearn (about 10 % more distance per step, from 1e-5 to about 1.4 per weight within
the 100 steps) instead of in steps of a fixed 1e-3 that most models relearn from in one."""


def check_relearn_args(*, subset: Union[int, float] = 0.1, lr: float = RELEARN_LR, max_steps: int = RELEARN_MAX_STEPS,
                       batch_size: int = 64, lr_growth: float = RELEARN_LR_GROWTH) -> None:
    """ValueError unless ``subset`` is an int >= 1 or a fraction in (0, 1], ``lr`` finite and > 0,
    ``lr_growth`` finite and >= 1, ``max_steps`` an int >= 0 and ``batch_size`` an int >= 1 (the
    `relearn_time` settings)."""
    def whole(v):
        return isinstance(v, numbers.Integral) and not isinstance(v, bool)
    sub_ok = (0 < subset <= 1) if isinstance(subset, float) else (whole(subset) and subset >= 1)
    if not sub_ok:
        raise ValueError(f"relearn_time: subset must be an int >= 1 or a fraction in (0, 1], got {subset!r}")
    if not (isinstance(lr, numbers.Real) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"relearn_time: lr must be finite and > 0, got {lr!r}")
    if not (isinstance(lr_growth, numbers.Real) and math.isfinite(lr_growth) and lr_growth >= 1):
        raise ValueError(f"relearn_time: lr_growth must be finite and >= 1 (1 = a constant lr), got {lr_growth!r}")
    if not (whole(max_steps) and max_steps >= 0):
        raise ValueError(f"relearn_time: max_steps must be an int >= 0, got {max_steps!r}")
    if not (whole(batch_size) and batch_size >= 1):
        raise ValueError(f"relearn_time: batch_size must be an int >= 1, got {batch_size!r}")


def relearn_time(model: torch.nn.Module, forget, *, threshold: float, subset: Union[int, float] = 0.1,
                 lr: float = RELEARN_LR, max_steps: int = RELEARN_MAX_STEPS, batch_size: int = 64, seed: int = 0,
                 device=None, eval_batch_size: int = 512, lr_growth: float = RELEARN_LR_GROWTH) -> Dict[str, Any]:
    """Relearn time (docs/algorithm.md §10; after Golatkar et al. 2020): Adam steps (CE with the true
    labels, eval mode) on a copy of ``model`` over a small seeded subset of the forget set until the
    accuracy on the whole forget set (measured after every step) reaches ``threshold``. Step k
    (from 0) has learning rate ``lr * lr_growth**k`` (default 1e-5 growing 10 % a step,
    `RELEARN_LR`: a geometric schedule, so the count resolves both a model one tiny step from
    relearning and one far from it; ``lr_growth=1`` is a constant lr). ``model`` itself is not
    changed. ↑ = deeper forgetting.

    Args: forget: D_f train (a Dataset, DataLoader or `Source`, e.g. ``splits.source("forget")``);
        threshold: accuracy fraction in (0, 1]; subset: sample count (int >= 1) or fraction of D_f
        (float in (0, 1]); batch_size: samples per step (cycling over the subset); max_steps: cap;
        lr, lr_growth: the schedule above.
        Floating inputs are cast to the model's dtype.
    Returns: {"steps": int (0 if already at threshold; ``max_steps`` if never), "reached": bool,
        "threshold": float, "subset": int, "final_acc": fraction}.
    Raises: ValueError for a bad threshold / subset / lr / lr_growth / max_steps / batch size, an empty forget set,
        or no ``device`` for a model without parameters or buffers.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"relearn_time: threshold must be an accuracy fraction in (0, 1], got {threshold}")
    check_relearn_args(subset=subset, lr=lr, max_steps=max_steps, batch_size=batch_size, lr_growth=lr_growth)
    check_batch_size(eval_batch_size, "relearn_time: eval_batch_size")
    forget = as_source(forget)
    N = len(forget.dataset)
    if N == 0:
        raise ValueError("relearn_time: the forget set is empty")
    k = min(N, max(1, math.ceil(subset * N)) if isinstance(subset, float) else int(subset))
    device = model_device(model, device)
    m = copy_model(model, "relearn_time fine-tunes a copy of the model").to(device).eval()
    g = torch.Generator().manual_seed(int(seed))
    # the whole batches on every rank (not split over the ranks of a distributed run): the loss is
    # the mean over the batch and the copy's steps are those of one process
    stream = BatchStream(_subset(forget, torch.randperm(N, generator=g)[:k]), batch_size, shuffle=True,
                         seed=seed, name="relearn", device=device, input_dtype=model_dtype(m), dist=SINGLE)
    opt = torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=lr)

    def acc() -> float:
        return float(per_sample(m, forget, device=device, batch_size=eval_batch_size, name="forget")["correct"]
                     .double().mean())

    a, steps = acc(), 0
    while a < threshold and steps < max_steps:
        with training_grad_mode():
            inputs, y = split_batch(stream.next())
            for group in opt.param_groups:
                group["lr"] = lr * lr_growth ** steps
            loss = F.cross_entropy(loss_logits(m, inputs), y)
            opt.zero_grad(set_to_none=True)
            require_graph(loss).backward()
            opt.step()
        steps += 1
        a = acc()
    return {"steps": steps, "reached": a >= threshold, "threshold": float(threshold), "subset": k, "final_acc": a}


def _accuracies(evals: Mapping[str, dict]) -> Dict[str, Optional[float]]:
    out = {f"acc_{n}": 100.0 * evals[n]["acc"] if n in evals else None for n in Splits.TRAIN + Splits.TEST}
    out["UA"] = 100.0 - out["acc_forget"]

    def pooled(names):
        present = [n for n in names if n in evals]
        if not present:
            return None
        return 100.0 * sum(evals[n]["acc"] * evals[n]["n"] for n in present) / sum(evals[n]["n"] for n in present)

    out["RA"], out["TA"] = pooled(("adjacent", "remote")), pooled(("adjacent_test", "remote_test"))
    return out


def unlearning_metrics(model: torch.nn.Module, splits: Splits, *,
                       retrained: Optional[Union[torch.nn.Module, Mapping[str, Any]]] = None,
                       evals: Optional[Mapping[str, dict]] = None, seconds: Optional[float] = None,
                       relearn: Optional[Mapping[str, Any]] = None, device=None, batch_size: int = 512,
                       seed: int = 0, mia_max_samples: Optional[int] = None,
                       keep_losses: bool = False,
                       features: Optional[Mapping[str, Mapping[str, torch.Tensor]]] = None) -> Dict[str, Any]:
    """All metrics of `METRICS` for one unlearned model (docs/algorithm.md §10).

    Args:
        model: the unlearned model ((B, C) logits). splits: `Splits` with the forget train split
            and held-out retain data; MIA scores the train splits present ("mia_<split>" None for
            an absent one).
        retrained: the model retrained on D \\ D_f, or its own `unlearning_metrics(...,
            keep_losses=True)` dict; gives "avg_gap", "forget_quality" (KS p-value) and "forget_ks"
            (KS statistic D) (None = all omitted).
        evals: ``{split: {"acc", "n", ...}}`` of ``model`` (e.g. ``report["evals"]["final"]``);
            None = computed by `evaluate`. seconds: wall clock of the unlearning call ("time_s").
        relearn: keyword arguments of `relearn_time` (``threshold`` required); None = skipped.
        seed: MIA member/non-member subsets and the relearn subset.
        keep_losses: add "forget_losses" (list of per-sample forget-train CE, nats).
        features: {split: `per_sample` dict} of ``model`` already computed with ``batch_size``
            (e.g. `FinalOutputs.features` of the run's last evaluation, which `compare` passes);
            the splits it lacks get their own `per_sample` pass. None = every split's pass.
    Returns: {metric key: float, or None where not computable}; percentages in [0, 100]; the
        "mia_<split>" values NaN where the attack has no signal (one `MIAUndefinedWarning` per
        attack; none inside `mia_undefined_scope`, where `compare` warns once for all its runs).
    Raises: ValueError without the forget train split; as `mia_efficacy`, `relearn_time`;
        ImportError without scikit-learn / scipy.
    """
    if splits.forget is None:
        raise ValueError("unlearning_metrics needs the forget train split (UA, MIA forget, forget quality)")
    device = model_device(model, device)
    feats: Dict[str, dict] = {k: dict(v) for k, v in (features or {}).items()}
    if evals is None:   # one pass gives the accuracies and the MIA's per-sample values (`per_sample`'s, to the bit)
        outputs: Dict[str, list] = {}
        evals = evaluate(model, splits, device=device, batch_size=batch_size, keep_forget_losses=False,
                         outputs=outputs)
        for name, batches in outputs.items():
            if name in MIA_SPLITS and name not in feats:
                feats[name] = per_sample_of_outputs(batches, name)
    out: Dict[str, Any] = _accuracies(evals)
    present = tuple(n for n in Splits.TRAIN if getattr(splits, n) is not None)
    mia = mia_efficacy(model, splits, targets=present, device=device, batch_size=batch_size, seed=seed,
                       max_samples=mia_max_samples, features=feats)
    out.update({f"mia_{k}": mia.get(k) for k in Splits.TRAIN})
    losses = feats["forget"]["loss"]
    if retrained is not None:
        ref = retrained if isinstance(retrained, Mapping) else unlearning_metrics(
            retrained, splits, device=device, batch_size=batch_size, seed=seed,
            mia_max_samples=mia_max_samples, keep_losses=True)
        out.update(gap_metrics(out, losses, ref))
    if relearn is not None:
        r = relearn_time(model, splits.source("forget"), device=device, eval_batch_size=batch_size,
                         **{"seed": seed, **relearn})
        out["relearn_steps"], out["relearn_reached"] = r["steps"], r["reached"]
    out["time_s"] = None if seconds is None else float(seconds)
    if keep_losses:
        out["forget_losses"] = losses.tolist()
    return out
