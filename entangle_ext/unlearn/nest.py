"""The nests of tensors a batch's inputs may be (dicts / tuples / lists / namedtuples, at any depth,
as torch's ``default_collate`` builds them: it turns an item's tuples into lists, keeps namedtuples
and dicts, and turns str fields into tuples of str). One home for two rules:

* maps (moving to a device, casting floating tensors, channels-last) go through every dict, tuple
  and list and leave other leaves as they are (`rebuild` puts the mapped items back);
* slicing and concatenating along the sample dimension need certainty about what is a sample:
  they go through a nest only when it is a `sample_nest` of the batch size n (every leaf a tensor
  whose dim 0 is n). Anything else (a tuple of str, None, a ragged list of per-sample tensors from
  a custom collate function) is not cut: a batch holding one is not concatenated with others and
  not split into micro-batches; each batch is one forward pass as it is.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, List, Optional

import torch

__all__ = ["sample_nest", "rebuild", "tensors", "first_tensor", "map_tensors"]


def sample_nest(v, n: int) -> bool:
    """Whether ``v`` is a tensor with dim 0 = ``n`` (samples), or a non-empty dict / tuple / list
    of such nests: every leaf one per-sample tensor of the same batch."""
    if isinstance(v, torch.Tensor):
        return v.dim() >= 1 and v.shape[0] == n
    values = list(v.values()) if isinstance(v, dict) else v if isinstance(v, (tuple, list)) else None
    return bool(values) and all(sample_nest(x, n) for x in values)


def rebuild(like, items: List[Any]):
    """``items`` in the container type of the tuple / list ``like`` (a namedtuple takes them as
    fields; ``type(t)(generator)`` fails for one)."""
    if isinstance(like, list):
        return list(items)
    return type(like)(*items) if hasattr(like, "_fields") else type(like)(items)


def tensors(v) -> Iterator[torch.Tensor]:
    """The tensors of ``v``, depth first through dicts / tuples / lists (other leaves skipped)."""
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, (dict, tuple, list)):
        for x in (v.values() if isinstance(v, dict) else v):
            yield from tensors(x)


def first_tensor(v) -> Optional[torch.Tensor]:
    """The first tensor of ``v``, depth first through dicts / tuples / lists; None without one."""
    return next(tensors(v), None)


def map_tensors(fn: Callable[[torch.Tensor], Any], v):
    """``v`` with ``fn`` applied to every tensor, through every dict / tuple / list (containers
    rebuilt in their own type, `rebuild`); other leaves as they are."""
    if isinstance(v, torch.Tensor):
        return fn(v)
    if isinstance(v, dict):
        return {k: map_tensors(fn, x) for k, x in v.items()}
    if isinstance(v, (tuple, list)):
        return rebuild(v, [map_tensors(fn, x) for x in v])
    return v
