"""torch.func's wrapper tensors as the operators meet them: whether a transform is running
(`transforms_active`), the plain tensor under the wrappers for the host-side value checks of the
operators' arguments (mu > 0 and finite, a cast that would overflow, the longest segment:
`plain_of`, `is_batched`), and the one per-entry vmap rule of the operators' autograd.Functions
(`loop_vmap`).

Under ``torch.func.vmap`` an argument is a BatchedTensor: a check such as ``bool((mu <= 0).any())``
on it is data-dependent control flow, which vmap refuses with its own RuntimeError; under ``grad``
/ ``jvp`` it is a GradTrackingTensor. `plain_of` unwraps every such layer, so the check reads the
values of every batch entry at once (what the per-entry calls would each check).
"""
from __future__ import annotations

import torch

__all__ = ["transforms_active", "plain_of", "is_batched", "check_vmap_batch", "loop_vmap"]

_ACTIVE = getattr(torch._C, "_are_functorch_transforms_active", None)   # looked up once, not per call


def transforms_active() -> bool:
    """Whether a torch.func transform (vmap, grad, jvp, functionalize, ...) is running: only then
    can a tensor be one of its wrappers, or a tensor made now be one. True when this torch cannot
    say (the callers then look at the tensors)."""
    return True if _ACTIVE is None else bool(_ACTIVE())


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


def loop_vmap(apply, info, in_dims, args, op: str):
    """A ``torch.autograd.Function.vmap`` rule that calls ``apply(*args)`` once per batch entry
    (each batched argument's entry ``i``, contiguous; the others as given) and stacks the outputs
    (a tensor or a tuple of tensors) along dim 0. torch's generated rule
    (``generate_vmap_rule = True``) fails with an internal AssertionError under forward mode around
    vmap, ``jvp(vmap(f))``, because these Functions take non-tensor arguments. ValueError for an
    empty batch (`check_vmap_batch`, naming ``op``)."""
    check_vmap_batch(info.batch_size, op)
    moved = [a.movedim(d, 0) if d is not None else None for a, d in zip(args, in_dims)]
    outs = []
    for i in range(info.batch_size):
        call = [a if m is None else m[i] for a, m in zip(args, moved)]
        outs.append(apply(*[c.contiguous() if isinstance(c, torch.Tensor) else c for c in call]))
    if isinstance(outs[0], torch.Tensor):
        return torch.stack(outs), 0
    return tuple(torch.stack(col) for col in zip(*outs)), (0,) * len(outs[0])
