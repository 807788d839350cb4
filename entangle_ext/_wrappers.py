"""The plain tensor under torch.func's wrapper tensors, for the host-side value checks of the
operators' arguments (mu > 0 and finite, a cast that would overflow, the longest segment).

Under ``torch.func.vmap`` an argument is a BatchedTensor: a check such as ``bool((mu <= 0).any())``
on it is data-dependent control flow, which vmap refuses with its own RuntimeError; under ``grad``
/ ``jvp`` it is a GradTrackingTensor. `plain_of` unwraps every such layer, so the check reads the
values of every batch entry at once (what the per-entry calls would each check).
"""
from __future__ import annotations

import torch

__all__ = ["plain_of", "is_batched", "check_vmap_batch"]


def plain_of(t: torch.Tensor) -> torch.Tensor:
    """``t`` without its torch.func ``grad`` / ``jvp`` / ``vmap`` wrappers (itself when it has none):
    a tensor holding the values of every batch entry (a vmapped one keeps its batch dimensions).
    Not for functionalize's wrappers (left as they are)."""
    f = torch._C._functorch
    while f.is_batchedtensor(t) or f.is_gradtrackingtensor(t):
        t = f.get_unwrapped(t)
    return t


def is_batched(t: torch.Tensor) -> bool:
    """Whether a ``torch.func.vmap`` wrapper is among ``t``'s wrappers."""
    f = torch._C._functorch
    while f.is_batchedtensor(t) or f.is_gradtrackingtensor(t):
        if f.is_batchedtensor(t):
            return True
        t = f.get_unwrapped(t)
    return False


def check_vmap_batch(batch_size: int, op: str) -> None:
    """ValueError for ``torch.func.vmap`` over zero entries: the operators' vmap rules make one
    operator call per entry and stack the results, so an empty batch has no result to take the
    shape from (jacrev / jacfwd of an input with no elements vmap over zero basis vectors)."""
    if batch_size == 0:
        raise ValueError(f"entangle_ext.{op}: torch.func.vmap over a batch of size 0 is not supported (the "
                         "operator runs once per batch entry); call it on the non-empty entries, or skip an "
                         "empty batch (a Jacobian with respect to an input of 0 elements is empty)")
