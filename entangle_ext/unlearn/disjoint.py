"""The train splits of a run must be disjoint (docs/algorithm.md §1): forget, adjacent and remote
are three sub-populations, and a sample in two of them is pushed two ways at once (forgotten and
kept). `check_disjoint` refuses what it can decide exactly and cheaply, before any training, and
warns on the rest it can see:

* the same object passed as two splits (also ``forget=R, remote=R``), or two DataLoaders over one
  dataset: ValueError;
* `torch.utils.data.Subset`s (nested ones too) of one dataset that share indices: ValueError
  naming the two splits and a few shared indices of that dataset;
* two `TensorDataset`s with identical input rows: `OverlappingSplitsWarning` (copies of one
  sample may be legitimate data, so this is not an error), naming the count and a few rows. One run
  checks its splits several times (the method, then each evaluation); the row scan of a pair of
  datasets is remembered while neither input tensor changes (same tensor objects, same in-place
  version counters), so the warning is given once per pair, not once per check.
"""
from __future__ import annotations

import itertools
import warnings
import weakref
from typing import Any, Dict, Optional, Tuple

import torch
from torch.utils.data import DataLoader, Subset

__all__ = ["check_disjoint", "OverlappingSplitsWarning"]


class OverlappingSplitsWarning(UserWarning):
    """Two train splits hold identical samples (the same input rows of two tensor datasets).
    Silence it with ``warnings.filterwarnings("ignore", category=OverlappingSplitsWarning)``."""


def _base(split) -> Tuple[Any, Optional[torch.Tensor]]:
    """(underlying dataset, its int64 indices or None for all of it) of a split: DataLoaders are
    unwrapped to their dataset, nested Subsets to the dataset they index."""
    ds = split.dataset if isinstance(split, DataLoader) else split
    idx = None
    while isinstance(ds, Subset):
        own = torch.as_tensor(list(ds.indices) if not torch.is_tensor(ds.indices) else ds.indices,
                              dtype=torch.int64).reshape(-1)
        idx = own if idx is None else own[idx]
        ds = ds.dataset
    return ds, idx


def _shared_indices(a: Optional[torch.Tensor], b: Optional[torch.Tensor], n: int) -> torch.Tensor:
    """Indices of the underlying dataset (of length ``n``) present in both index sets."""
    full = torch.arange(n)
    a = full if a is None else a
    b = full if b is None else b
    return a[torch.isin(a, b)].unique()


def _row_keys(x: torch.Tensor) -> torch.Tensor:
    """A float64 key per row of ``x`` (a fixed random projection of its values): equal rows have equal
    keys; unequal ones almost never do (candidates are compared exactly afterwards)."""
    flat = x.detach().reshape(x.shape[0], -1).cpu().double()
    w = torch.rand(flat.shape[1], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return flat @ w


def _duplicate_rows(a, b) -> Tuple[int, list]:
    """(count, a few (row in a, row in b)) of identical input rows of two TensorDatasets."""
    xa, xb = a.tensors[0], b.tensors[0]
    if xa.shape[1:] != xb.shape[1:] or xa.dtype != xb.dtype or len(xa) == 0 or len(xb) == 0:
        return 0, []
    ka, kb = _row_keys(xa), _row_keys(xb)
    cand = torch.nonzero(torch.isin(ka, kb)).reshape(-1)
    pairs = []
    for i in cand.tolist():
        for j in torch.nonzero(kb == ka[i]).reshape(-1).tolist():
            if torch.equal(xa[i], xb[j]):
                pairs.append((i, j))
                break
    return len(pairs), pairs[:5]


#: {dataset a: {(id(b), id(a's inputs), their version, id(b's inputs), their version):
#: ((weak references to b, a's inputs, b's inputs), (count, pairs))}}: the row scans already done (see `_duplicate_rows_once`)
_SCANNED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _duplicate_rows_once(a, b) -> Tuple[int, list, bool]:
    """`_duplicate_rows` of ``a`` and ``b`` plus whether this is the first scan of the pair in its
    present state (same dataset objects, same input tensors, no in-place change since: their
    version counters). Datasets that cannot be weakly referenced, and inference-mode tensors (which
    keep no version counter), are scanned every time."""
    xa, xb = a.tensors[0], b.tensors[0]
    try:
        key = (id(b), id(xa), xa._version, id(xb), xb._version)
        seen = _SCANNED.setdefault(a, {})
    except (TypeError, RuntimeError):   # not weakly referenceable; inference tensors (no version)
        return (*_duplicate_rows(a, b), True)
    hit = seen.get(key)   # ids can be reused once freed: the weak references confirm them
    if hit is not None and all(r() is o for r, o in zip(hit[0], (b, xa, xb))):
        return (*hit[1], False)
    result = _duplicate_rows(a, b)
    try:
        seen[key] = (tuple(weakref.ref(o) for o in (b, xa, xb)), result)
    except TypeError:
        pass
    return (*result, True)


def check_disjoint(named: Dict[str, Any]) -> None:
    """Refuse train splits that share samples (see the module docstring).

    Args:
        named: {split name: Dataset or DataLoader}, e.g. ``{"forget": ..., "adjacent": ...,
            "remote": ...}`` (absent splits left out).
    Raises:
        ValueError: one object in two splits, or Subsets of one dataset with shared indices (the
            message names both splits and up to 5 shared indices of that dataset).
    Warns:
        OverlappingSplitsWarning: two TensorDatasets with identical input rows; once per pair of
            datasets while their input tensors are unchanged (a later check of the same pair,
            e.g. by the run's evaluations, is silent).
    """
    bases = {n: _base(s) for n, s in named.items()}
    for (na, sa), (nb, sb) in itertools.combinations(named.items(), 2):
        if sa is sb:
            raise ValueError(f"splits {na!r} and {nb!r} are the same object: the train splits must be "
                             "disjoint sub-populations (docs/algorithm.md §1)")
        (da, ia), (db, ib) = bases[na], bases[nb]
        if da is db:
            try:
                n = len(da)
            except TypeError:
                continue
            shared = _shared_indices(ia, ib, n)
            if len(shared):
                raise ValueError(f"splits {na!r} and {nb!r} share {len(shared)} sample(s) of one dataset "
                                 f"(indices {shared[:5].tolist()}{' ...' if len(shared) > 5 else ''}): "
                                 "the train splits must be disjoint (docs/algorithm.md §1)")
            continue
        if ia is None and ib is None and getattr(da, "tensors", None) and getattr(db, "tensors", None):
            count, pairs, first = _duplicate_rows_once(da, db)
            if count and first:
                warnings.warn(f"splits {na!r} and {nb!r} hold {count} identical input row(s) (e.g. "
                              f"rows {pairs[:3]} as ({na}, {nb})): one sample in two splits is trained "
                              "two ways at once", OverlappingSplitsWarning, stacklevel=4)
