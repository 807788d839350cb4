"""Where a split's items come from: `Source` (a map-style dataset, its collate function and
DataLoader options) made from a Dataset, a DataLoader or a Source (`as_source`), the union of
several splits (`union_source`), and the checks of the batch size and loader options that every
entry point shares. The streams of entangle_ext/unlearn/data.py are built on these (and it re-exports them)."""
from __future__ import annotations

import functools
import numbers
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Tuple

import torch
from torch.utils.data import (BatchSampler, ConcatDataset, DataLoader, IterableDataset, RandomSampler,
                              SequentialSampler, Subset, SubsetRandomSampler, TensorDataset, default_collate)

__all__ = ["Source", "as_source", "batch_items", "named_collate", "loader_dataset", "union_source", "indexed_tensors",
           "check_batch_size", "check_loader_options"]


def batch_items(items: list, where: str = "") -> Any:
    """torch's `default_collate` of a list of split items (the collate function of every split
    given none of its own), with its refusals of items it cannot batch (tensors of unequal shapes,
    e.g. variable-length sequences or images of several sizes; types it does not know, e.g. PIL
    images) raised as a ValueError that says what to pass. ``where`` (e.g. "split 'forget'")
    prefixes the message."""
    try:
        return default_collate(items)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"{where + ': ' if where else ''}torch's default_collate cannot batch these items ({e}); "
                         "items of unequal shapes (e.g. variable-length sequences, images of several sizes) or of "
                         "other types need a collate function of one's own: Splits(collate_fn=...), e.g. one that "
                         "pads, or the DataLoader's collate_fn (or a transform that makes the items tensors of "
                         "one shape)") from None


def named_collate(collate_fn: Callable, where: str) -> Callable:
    """``collate_fn`` with ``where`` (e.g. "split 'forget'") in its error messages when it is
    `batch_items`; a collate function of one's own is returned as it is. Picklable (DataLoader
    workers)."""
    return functools.partial(batch_items, where=where) if collate_fn is batch_items else collate_fn


class Source(NamedTuple):
    """How to load one split: a map-style dataset, its collate function and DataLoader options
    (`batch_items`, torch's default_collate with clear errors, when none of one's own is given)."""
    dataset: Any
    collate_fn: Callable = batch_items
    loader_kwargs: Dict[str, Any] = {}


def check_loader_options(collate_fn, num_workers, where: str = "Splits") -> None:
    """TypeError unless ``collate_fn`` is None or callable and ``num_workers`` an integer (not a
    bool); ValueError for ``num_workers`` < 0. ``where`` names the caller in the message."""
    if collate_fn is not None and not callable(collate_fn):
        raise TypeError(f"{where}: collate_fn must be a function building a batch from a list of items (or None "
                        f"for torch's default_collate), got {type(collate_fn).__name__} {collate_fn!r}")
    if isinstance(num_workers, bool) or not isinstance(num_workers, numbers.Integral):
        raise TypeError(f"{where}: num_workers must be an int (DataLoader worker processes; 0 = load in this "
                        f"process), got {type(num_workers).__name__} {num_workers!r}")
    if num_workers < 0:
        raise ValueError(f"{where}: num_workers must be >= 0 (DataLoader worker processes; 0 = load in this "
                         f"process), got {num_workers}")


def as_source(data, collate_fn: Optional[Callable] = None, num_workers: int = 0) -> Source:
    """`Source` of a Dataset (with ``collate_fn``/``num_workers``), a DataLoader or a Source.

    Raises ValueError for an iterable-style dataset (the streams need indexing and a length), and
    as `check_loader_options` for ``collate_fn`` / ``num_workers``.
    """
    check_loader_options(collate_fn, num_workers, "as_source")
    if isinstance(data, Source):
        return data
    if isinstance(data, DataLoader):
        dataset = loader_dataset(data)
        kw = {"num_workers": data.num_workers, "pin_memory": data.pin_memory,
              "worker_init_fn": data.worker_init_fn, "timeout": data.timeout,
              "multiprocessing_context": data.multiprocessing_context}
        if data.num_workers > 0:
            kw["prefetch_factor"] = data.prefetch_factor
        own = data.collate_fn if data.collate_fn not in (None, default_collate) else None
        src = Source(dataset, own or batch_items, kw)
    else:
        own = collate_fn if collate_fn not in (None, default_collate) else None
        src = Source(data, own or batch_items, {"num_workers": int(num_workers)})
    if isinstance(src.dataset, IterableDataset) or not hasattr(src.dataset, "__getitem__"):
        raise ValueError(f"a split must be a map-style Dataset (indexable, with a length) or a "
                         f"DataLoader over one; got {type(src.dataset).__name__}")
    return src


def loader_dataset(loader: DataLoader):
    """The items a DataLoader split stands for: its whole dataset when its sampler is torch's
    default (``shuffle=False`` / ``True``), or the `torch.utils.data.Subset` of the indices a
    `SubsetRandomSampler` draws from (also inside a `BatchSampler` given as ``batch_sampler``).
    The loader's batch size, order, ``drop_last`` and generator are not used: every stage draws its
    own batches and seeded orders of these items.

    Raises ValueError for a loader without automatic batching (``batch_size=None`` and no
    batch_sampler) and for any other sampler or batch_sampler (weighted, with replacement, a
    DistributedSampler, one of one's own), whose choice of items the stages would otherwise
    silently replace by the whole dataset: pass a `Subset` of the items to use instead.
    """
    if isinstance(loader.dataset, IterableDataset):   # refused by `as_source`, with its own reason
        return loader.dataset
    sampler, where = loader.sampler, "sampler"
    if loader.batch_size is None:
        if loader.batch_sampler is None:
            raise ValueError("a DataLoader split needs automatic batching (batch_size not None): "
                             "the stages draw their own batches of its dataset's items")
        sampler, where = getattr(loader.batch_sampler, "sampler", None), "batch_sampler"
        if type(loader.batch_sampler) is not BatchSampler:
            sampler = None
    if isinstance(sampler, SubsetRandomSampler):
        return Subset(loader.dataset, sampler.indices)
    default = type(sampler) is SequentialSampler or (
        type(sampler) is RandomSampler and not sampler.replacement and sampler.num_samples == len(loader.dataset))
    if default and sampler.data_source is loader.dataset:
        return loader.dataset
    what = type(loader.batch_sampler if where == "batch_sampler" else sampler).__name__
    if type(sampler) is RandomSampler and where == "sampler":
        what += f" (replacement={sampler.replacement}, num_samples={sampler.num_samples} of {len(loader.dataset)})"
    raise ValueError(f"a DataLoader split with a {where} of type {what} is not supported: the stages draw "
                     "their own batches and seeded orders of the loader's items, so which items it draws "
                     "(and how often) would be ignored; pass the dataset, a torch.utils.data.Subset of the "
                     "items to use, or a DataLoader with shuffle=True/False or a SubsetRandomSampler")


def union_source(parts: Sequence[Any]) -> Source:
    """One `Source` over several splits (Datasets, DataLoaders or Sources, `as_source`), in order:
    item i of part k is item ``len(part 0) + ... + len(part k-1) + i`` of the union. When every
    dataset exposes ``.tensors``: a `TensorDataset` of the concatenated tensors (batched by
    indexing); otherwise a `ConcatDataset`. The union is batched with the collate function and
    DataLoader options of the first part (its batches mix items of every part, so the parts must
    collate alike, as the splits of one `Splits` do).

    Raises ValueError for no parts or an iterable-style part (as `as_source`).
    """
    if not parts:
        raise ValueError("union_source needs at least one split")
    srcs = [as_source(p) for p in parts]
    data = [s.dataset for s in srcs]
    if all(getattr(d, "tensors", None) is not None for d in data):
        union = TensorDataset(*[torch.cat([d.tensors[i] for d in data]) for i in range(len(data[0].tensors))])
    else:
        union = ConcatDataset(data)
    return Source(union, srcs[0].collate_fn, srcs[0].loader_kwargs)


def check_batch_size(value, what: str) -> int:
    """``value`` as an int when it is an integer >= 1 (not a bool); else ValueError naming ``what``
    (e.g. "evaluate: batch_size")."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{what} must be an integer >= 1 (samples per batch), got {value!r}")
    return int(value)


def indexed_tensors(src: Source) -> Optional[Tuple[torch.Tensor, ...]]:
    """The tensors of ``src``'s dataset when its batches are made by indexing them directly (a
    dataset exposing ``.tensors``, e.g. `TensorDataset`, with torch's `default_collate`), else None:
    a collate function of one's own (``Splits(collate_fn=...)``, a DataLoader's) builds the batches
    of a tensor dataset too, from its ``(x, y)`` items, so it is never skipped."""
    tensors = getattr(src.dataset, "tensors", None)
    return tuple(tensors) if tensors is not None and src.collate_fn is batch_items else None
