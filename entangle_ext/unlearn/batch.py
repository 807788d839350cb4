"""Batch helpers below both the data streams (`unlearn/data.py`) and the ranks
(`unlearn/distributed.py`): concatenating and slicing tuple/list or dict batches along dim 0."""
from __future__ import annotations

from typing import Any, List

import torch

__all__ = ["concat_batches", "slice_batch"]


def concat_batches(batches: List[Any]):
    """Concatenate batches along dim 0, or return None when shapes do not allow it (e.g. padded
    text of different lengths)."""
    first = batches[0]
    try:
        if isinstance(first, dict):
            return {k: torch.cat([b[k] for b in batches]) for k in first}
        return tuple(torch.cat([b[i] for b in batches]) for i in range(len(first)))
    except (RuntimeError, TypeError):
        return None


def slice_batch(batch, start: int, stop: int):
    """Samples [start, stop) of a tuple/list or dict batch."""
    if isinstance(batch, dict):
        return {k: v[start:stop] for k, v in batch.items()}
    return tuple(v[start:stop] for v in batch)
