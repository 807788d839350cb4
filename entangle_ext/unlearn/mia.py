"""Membership-inference efficacy (MIA-efficacy, docs/algorithm.md §10; Jia et al. 2023
(Unlearn-Sparse) and Fan et al. 2024 (SalUn)): an RBF SVC fit on retain-train (members) vs held-out
(non-members) features, then scored on each target split. An attack without signal gives NaN
(undefined) and one `MIAUndefinedWarning` (none inside `mia_undefined_scope`: `compare` opens
one and warns once for all its runs). scikit-learn is optional (ImportError naming the
``metrics`` extra). ``entangle_ext/unlearn/metrics.py`` re-exports every name here."""
from __future__ import annotations

import contextlib
import contextvars
import math
import warnings
from typing import Dict, Iterator, Mapping, Optional, Sequence

import numpy as np
import torch

from .._optional import optional_import
from .data import Splits
from .evaluate import per_sample
from .inputs import model_device

__all__ = ["mia_efficacy", "mia_efficacy_from_features", "MIAUndefinedWarning", "MIA_MIN_BALANCED_ACCURACY",
           "mia_undefined_scope", "MIA_SPLITS"]


def _optional(module: str, what: str):
    return optional_import(module, what, "metrics")


MIA_MIN_BALANCED_ACCURACY = 0.55
"""The MIA attack must beat this balanced accuracy on its own training data (members vs
non-members), else its MIA-efficacy is undefined (NaN, `MIAUndefinedWarning`): at or below it the
SVC has no signal and its verdict on a target split only says on which side of an arbitrary
boundary the split's features lie (100 or 0 % from one member subset to the next)."""


class MIAUndefinedWarning(UserWarning):
    """MIA-efficacy is undefined (NaN) for the named splits: the attack's balanced accuracy on its
    own members vs non-members is <= `MIA_MIN_BALANCED_ACCURACY` (e.g. identical features, or an
    SVC that predicts one class for all)."""


#: True inside a `mia_undefined_scope` (its caller reports undefined attacks itself).
_DEFERRED: contextvars.ContextVar[bool] = contextvars.ContextVar("entangle_ext_mia_undefined_deferred", default=False)


@contextlib.contextmanager
def mia_undefined_scope() -> Iterator[None]:
    """Within this context (one `compare` call) an attack without signal emits no
    `MIAUndefinedWarning` (its scores are NaN as ever): the caller warns once for all its runs,
    which it reads off their NaN scores. A scope opened inside another joins it; outside one, every
    undefined attack warns."""
    token = _DEFERRED.set(True)
    try:
        yield
    finally:
        _DEFERRED.reset(token)


def mia_efficacy_from_features(members: torch.Tensor, nonmembers: torch.Tensor,
                               targets: Mapping[str, torch.Tensor], *,
                               min_balanced_accuracy: float = MIA_MIN_BALANCED_ACCURACY) -> Dict[str, float]:
    """MIA-efficacy from 1-D features (docs/algorithm.md §10; SalUn ``evaluation/SVC_MIA.py``).

    An RBF SVC (``sklearn.svm.SVC(C=3, gamma="auto")``) is fit on ``members`` (label 1) vs
    ``nonmembers`` (label 0); each target's score is the percentage of its samples predicted
    non-member (higher = more forgotten). When the attack has no signal - its balanced accuracy
    on the members and non-members it was fit on is <= ``min_balanced_accuracy`` (default
    `MIA_MIN_BALANCED_ACCURACY` = 0.55; e.g. every feature identical, or one class predicted for
    all) - every target's score is NaN (undefined) and one `MIAUndefinedWarning` names the targets
    and the balanced accuracy (none inside `mia_undefined_scope`).
    Args: (N,) real tensors (any float dtype/device); targets: {name: (M,) tensor}.
    Returns: {name: percentage in [0, 100], or NaN}.
    Raises: ValueError for empty or non-finite inputs; ImportError without scikit-learn.
    """
    svm = _optional("sklearn.svm", "MIA-efficacy")
    arrays = {"members": members, "non-members": nonmembers, **targets}
    for k, v in arrays.items():
        if v.numel() == 0:
            raise ValueError(f"MIA-efficacy: the {k!r} features are empty")
        if not bool(torch.isfinite(v).all()):
            raise ValueError(f"MIA-efficacy: the {k!r} features are not finite")
    x = torch.cat([members.reshape(-1), nonmembers.reshape(-1)]).double().cpu().numpy()[:, None]
    y = np.concatenate([np.ones(members.numel()), np.zeros(nonmembers.numel())])
    clf = svm.SVC(C=3, gamma="auto", kernel="rbf").fit(x, y)
    pred = clf.predict(x)
    bacc = 0.5 * (float((pred[y == 1] == 1).mean()) + float((pred[y == 0] == 0).mean()))
    if bacc <= min_balanced_accuracy:
        if _DEFERRED.get():   # the open scope's caller (compare) warns once for all its runs
            return {k: math.nan for k in targets}
        why = ("every member and non-member feature is the same" if np.ptp(x) == 0 else
               "it predicts one class for all" if np.unique(pred).size == 1 else "no better than chance")
        warnings.warn(f"MIA-efficacy undefined (NaN) for {sorted(targets)}: the attack's balanced accuracy on "
                      f"its own members vs non-members is {bacc:.3f} <= {min_balanced_accuracy} ({why}); its "
                      "verdict on a split would only say on which side of an arbitrary boundary it lies",
                      MIAUndefinedWarning, stacklevel=2)
        return {k: math.nan for k in targets}
    return {k: 100.0 * float((clf.predict(v.reshape(-1, 1).double().cpu().numpy()) == 0).mean())
            for k, v in targets.items()}


_MIA_SIDES = {"members": (("adjacent", "remote"), "retain-train samples (adjacent and/or remote)"),
              "non-members": (("adjacent_test", "remote_test"),
                              "held-out retain samples (adjacent_test and/or remote_test)")}
#: the splits whose `per_sample` values `mia_efficacy` may read (members, non-members, targets)
MIA_SPLITS = ("forget", "adjacent", "remote", "adjacent_test", "remote_test")


def _retain_features(model, splits: Splits, feats: Dict[str, dict], device, batch_size):
    """(members, non-members): the `per_sample` p_true of the present retain-train / held-out
    retain splits (``feats`` caches each split's `per_sample` dict)."""
    out = []
    for side, (names, what) in _MIA_SIDES.items():
        present = [n for n in names if getattr(splits, n) is not None]
        if not present:
            raise ValueError(f"MIA-efficacy needs {what} as {side}; the Splits has none")
        for n in present:
            if n not in feats:
                feats[n] = per_sample(model, splits.source(n), device=device, batch_size=batch_size, name=n)
        out.append(torch.cat([feats[n]["p_true"] for n in present]))
    return tuple(out)


def mia_efficacy(model: torch.nn.Module, splits: Splits, *, targets: Sequence[str] = ("forget", "adjacent", "remote"),
                 device=None, batch_size: int = 512, seed: int = 0, max_samples: Optional[int] = None,
                 features: Optional[Dict[str, dict]] = None) -> Dict[str, float]:
    """MIA-efficacy per split, the SalUn / Unlearn-Sparse protocol (docs/algorithm.md §10).

    Feature = softmax probability of the true label. Members = retain-train samples (adjacent +
    remote), non-members = held-out retain samples (adjacent_test + remote_test, evaluated as
    given, i.e. with the held-out transforms of the splits), equal counts n = min of the two (and
    ``max_samples``): a random subset (seeded by ``seed``) of the larger side, as SalUn takes the
    first |test| samples of its class-mixed retain set. Score of a split = % of its train samples
    predicted non-member: ↑ on forget = more forgotten; on adjacent / remote ↑ = damaged.

    Members and non-members come from the retain splits present (e.g. remote / remote_test alone
    when ``splits.adjacent`` and ``splits.adjacent_test`` are None).

    Args: model returning (B, C) logits; splits; targets: train split names scored, each present
        in ``splits``; features: optional cache {split: `per_sample` dict}, filled in place.
    Returns: {split: percentage in [0, 100]}; NaN for every split, with an `MIAUndefinedWarning`,
        when the attack has no signal on its own members vs non-members (`mia_efficacy_from_features`).
    Raises: ValueError (no retain-train split, no held-out retain split, a target that is unknown or
        absent from ``splits``, non-finite logits, max_samples < 1), all before any forward pass
        but the last; ImportError without scikit-learn.
    """
    if max_samples is not None and int(max_samples) < 1:
        raise ValueError(f"MIA-efficacy: max_samples must be >= 1 (or None), got {max_samples}")
    for t in targets:
        if t not in Splits.TRAIN:
            raise ValueError(f"MIA-efficacy target must be one of {Splits.TRAIN}, got {t!r}")
        if getattr(splits, t) is None:
            present = tuple(n for n in Splits.TRAIN if getattr(splits, n) is not None)
            raise ValueError(f"MIA-efficacy target {t!r} is absent from the Splits (None): score only "
                             f"present train splits, e.g. targets={present}")
    device = model_device(model, device)
    feats = features if features is not None else {}
    members, nonmembers = _retain_features(model, splits, feats, device, batch_size)
    n = min(len(members), len(nonmembers), max_samples or len(members))
    g = torch.Generator().manual_seed(int(seed))
    members = members[torch.randperm(len(members), generator=g)[:n]]
    nonmembers = nonmembers[torch.randperm(len(nonmembers), generator=g)[:n]]
    tgt = {}
    for t in targets:
        if t not in feats:
            feats[t] = per_sample(model, splits.source(t), device=device, batch_size=batch_size, name=t)
        tgt[t] = feats[t]["p_true"]
    return mia_efficacy_from_features(members, nonmembers, tgt)
