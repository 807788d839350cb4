"""The train splits of a run must be disjoint (docs/algorithm.md §1): forget, adjacent and remote
are three sub-populations, and a sample in two of them is pushed two ways at once (forgotten and
kept). `check_disjoint` refuses what it can decide exactly and cheaply, before any training, and
warns on the rest it can see:

* the same object passed as two splits (also ``forget=R, remote=R``), or two DataLoaders over one
  dataset: ValueError;
* `torch.utils.data.Subset`s (nested ones too, negative indices counted from the end, Subsets
  inside a `ConcatDataset`, DataLoaders with a `SubsetRandomSampler`) of one dataset that share
  indices: ValueError naming the two splits and a few shared indices of that dataset;
* two `TensorDataset`s with identical input rows: `OverlappingSplitsWarning` (copies of one
  sample may be legitimate data, so this is not an error), naming the count and a few rows.

One run checks its splits several times (the method, then each evaluation). Inside
`disjoint_scope` (every `unlearn` call, CLI run and `compare` call opens one) each pair of tensor
datasets is row-scanned and warned about once; outside one (e.g. a bare `Splits.check()`), every
check scans and warns, so each run warns anew, under the warning filters in force at that run.
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch.utils.data import ConcatDataset, DataLoader, Subset

from .scopes import joined_scope
from .source import loader_dataset

__all__ = ["check_disjoint", "check_held_out", "disjoint_scope", "OverlappingSplitsWarning"]


class OverlappingSplitsWarning(UserWarning):
    """Two splits hold the same samples: two train splits with identical input rows (two tensor
    datasets), or a held-out split that is a train split or shares its samples (`check_held_out`).
    Silence it with ``warnings.filterwarnings("ignore", category=OverlappingSplitsWarning)``."""


def _bases(split) -> List[Tuple[Any, Optional[torch.Tensor]]]:
    """The (underlying dataset, its int64 indices or None for all of it) pairs a split draws its
    items from: DataLoaders are read as the items they stand for (`loader_dataset`), nested Subsets
    down to the dataset they index (negative indices counted from the end, as Subset reads them),
    and a ConcatDataset as its parts."""
    return _parts(loader_dataset(split) if isinstance(split, DataLoader) else split, None)


def _parts(ds, idx: Optional[torch.Tensor]) -> List[Tuple[Any, Optional[torch.Tensor]]]:
    if isinstance(ds, Subset):
        own = torch.as_tensor(list(ds.indices) if not torch.is_tensor(ds.indices) else ds.indices,
                              dtype=torch.int64).reshape(-1)
        try:
            own = torch.where(own < 0, own + len(ds.dataset), own)
        except TypeError:   # an unsized dataset: its indices as given
            pass
        return _parts(ds.dataset, own if idx is None else own[idx])
    if isinstance(ds, ConcatDataset):
        out, start = [], 0
        for part, end in zip(ds.datasets, ds.cumulative_sizes):
            if idx is None:
                out += _parts(part, None)
            else:
                mine = idx[(idx >= start) & (idx < end)] - start
                if len(mine):
                    out += _parts(part, mine)
            start = end
        return out
    return [(ds, idx)]


def _shared_indices(a: Optional[torch.Tensor], b: Optional[torch.Tensor], n: int) -> torch.Tensor:
    """Indices of the underlying dataset (of length ``n``) present in both index sets."""
    full = torch.arange(n)
    a = full if a is None else a
    b = full if b is None else b
    return a[torch.isin(a, b)].unique()


def _row_keys(x: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """An int64 key per row of ``x``: a fixed random integer combination, modulo 2**64, of the
    bits of its values read as integers (-0.0 read as 0.0). Integer arithmetic is exact, so a row's key does not
    depend on the other rows or their number (a float projection did: BLAS rounded one row
    differently in matrices of other sizes, and duplicates went unseen); equal rows have equal
    keys, unequal ones almost never do (candidates are compared exactly afterwards)."""
    flat = x.detach().reshape(x.shape[0], -1).cpu()
    floating = flat.is_floating_point() or flat.is_complex()
    size = flat.element_size()   # the values' bits as integers of their width (complex: two per value)
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(size, torch.int64)
    w = None
    keys = torch.empty(flat.shape[0], dtype=torch.int64)
    for s in range(0, flat.shape[0], chunk):   # int64 products wrap modulo 2**64, in any order
        part = flat[s:s + chunk]
        part = part + 0 if floating else part.contiguous()   # -0.0 + 0 = 0.0: equal values, equal bits
        raw = part.view(ints).reshape(part.shape[0], -1)
        if w is None:
            w = torch.randint(1, 2 ** 62, (raw.shape[1],), generator=torch.Generator().manual_seed(0),
                              dtype=torch.int64)
        keys[s:s + chunk] = (raw.long() * w).sum(1)
    return keys


def _duplicate_rows(a, b) -> Tuple[int, list]:
    """(count, a few (row in a, row in b)) of identical input rows of two TensorDatasets. Inputs
    of two floating (or two integer) dtypes are compared in the wider one (a float64 copy of
    float32 rows is the same samples: the run casts both to the model's dtype)."""
    xa, xb = a.tensors[0], b.tensors[0]
    if xa.shape[1:] != xb.shape[1:] or len(xa) == 0 or len(xb) == 0:
        return 0, []
    if xa.dtype != xb.dtype:
        kinds = {(t.is_floating_point(), t.is_complex(), t.dtype == torch.bool) for t in (xa, xb)}
        if len(kinds) != 1:   # e.g. token ids against pixels: not the same kind of input
            return 0, []
        common = torch.promote_types(xa.dtype, xb.dtype)
        xa, xb = xa.to(common), xb.to(common)
    ka, kb = _row_keys(xa), _row_keys(xb)
    cand = torch.nonzero(torch.isin(ka, kb)).reshape(-1)
    pairs = []
    for i in cand.tolist():
        for j in torch.nonzero(kb == ka[i]).reshape(-1).tolist():
            if torch.equal(xa[i], xb[j]):
                pairs.append((i, j))
                break
    return len(pairs), pairs[:5]


#: The open `disjoint_scope`'s {(id(a), id(b)): (a, b)} of tensor-dataset pairs already scanned
#: (the datasets are held, so their ids stay theirs while the scope is open); None outside one.
_SCANNED: contextvars.ContextVar[Optional[Dict[Tuple[int, int], Tuple[Any, Any]]]] = \
    contextvars.ContextVar("entangle_ext_disjoint_scanned", default=None)


@contextlib.contextmanager
def disjoint_scope() -> Iterator[None]:
    """Within this context (one run), `check_disjoint` row-scans each pair of tensor datasets and
    warns about it once, however often the run checks its splits; a scope opened inside another
    joins the outer one. Leaving it forgets the pairs, so the next run scans and warns again."""
    with joined_scope(_SCANNED, dict):
        yield


def check_disjoint(named: Dict[str, Any]) -> None:
    """Refuse train splits that share samples (see the module docstring).

    Args:
        named: {split name: Dataset or DataLoader}, e.g. ``{"forget": ..., "adjacent": ...,
            "remote": ...}`` (absent splits left out).
    Raises:
        ValueError: one object in two splits, or Subsets of one dataset with shared indices (the
            message names both splits and up to 5 shared indices of that dataset).
    Warns:
        OverlappingSplitsWarning: two TensorDatasets with identical input rows; inside a
            `disjoint_scope`, only at the first check of that pair of datasets.
    """
    bases = {n: _bases(s) for n, s in named.items()}
    for (na, sa), (nb, sb) in itertools.combinations(named.items(), 2):
        if sa is sb:
            raise ValueError(f"splits {na!r} and {nb!r} are the same object: the train splits must be "
                             "disjoint sub-populations (docs/algorithm.md §1)")
        common = False
        for (da, ia), (db, ib) in itertools.product(bases[na], bases[nb]):
            if da is not db:
                continue
            common = True
            try:
                n = len(da)
            except TypeError:
                continue
            shared = _shared_indices(ia, ib, n)
            if len(shared):
                raise ValueError(f"splits {na!r} and {nb!r} share {len(shared)} sample(s) of one dataset "
                                 f"(indices {shared[:5].tolist()}{' ...' if len(shared) > 5 else ''}): "
                                 "the train splits must be disjoint (docs/algorithm.md §1)")
        if common or len(bases[na]) != 1 or len(bases[nb]) != 1:
            continue
        (da, ia), (db, ib) = bases[na][0], bases[nb][0]
        if ia is None and ib is None and getattr(da, "tensors", None) and getattr(db, "tensors", None):
            scanned = _SCANNED.get()
            if scanned is not None:
                key = (id(da), id(db))
                if key in scanned:   # this run scanned (and warned about) the pair already
                    continue
                scanned[key] = (da, db)
            count, pairs = _duplicate_rows(da, db)
            if count:
                warnings.warn(f"splits {na!r} and {nb!r} hold {count} identical input row(s) (e.g. "
                              f"rows {pairs[:3]} as ({na}, {nb})): one sample in two splits is trained "
                              "two ways at once", OverlappingSplitsWarning, stacklevel=4)


def check_held_out(train: Dict[str, Any], held_out: Dict[str, Any]) -> None:
    """Warn (`OverlappingSplitsWarning`) when a held-out split is a train split (the same object,
    or a DataLoader / Subset over the same dataset sharing samples with it): its "held-out"
    accuracy is then an accuracy on trained samples. Cheap checks only (no row scan); inside a
    `disjoint_scope`, once per pair and run.

    Args:
        train, held_out: {split name: Dataset or DataLoader} (absent splits left out).
    """
    scanned = _SCANNED.get()
    for (nt, st), (nh, sh) in itertools.product(train.items(), held_out.items()):
        shared = 0
        for (dt, it), (dh, ih) in itertools.product(_bases(st), _bases(sh)):
            if dt is not dh:
                continue
            try:
                shared += len(_shared_indices(it, ih, len(dt)))
            except TypeError:   # an unsized dataset: only the same object is decided
                shared = max(shared, int(st is sh))
        if not shared:
            continue
        if scanned is not None:
            key = ("held_out", id(st), id(sh))
            if key in scanned:
                continue
            scanned[key] = (st, sh)
        what = "is the train split" if st is sh else f"shares {shared} sample(s) with the train split"
        warnings.warn(f"held-out split {nh!r} {what} {nt!r}: its held-out accuracy is measured on samples the "
                      "run trains on; pass samples the model was not trained on", OverlappingSplitsWarning,
                      stacklevel=4)
