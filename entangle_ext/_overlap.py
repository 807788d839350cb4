"""Host-side check that the tensors an in-place operator writes do not share memory with each
other or with the tensors it reads (`project_orthogonal_`, `projection_apply_`, `dual_update_`).

Metadata only (data pointer, byte size, strides): no kernel launch, no device synchronisation,
O(n log n) in the number of tensors. A dense non-overlapping tensor (what the operators require)
occupies exactly the bytes [data_ptr, data_ptr + nbytes). Empty tensors, views that are not dense
(the operators' own checks refuse them with a message that names the real problem) and tensors
without real memory (meta/fake tensors, torch.func wrapper tensors, `torch.compile` tracing: the
check is skipped) are left out; the in-place operators refuse torch.func wrappers up front
(`refuse_transforms`).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from ._wrappers import transforms_active

try:  # private, but the only way to tell a FakeTensor without touching its (fake) data pointer
    from torch._subclasses.fake_tensor import is_fake as _is_fake
except ImportError:  # pragma: no cover - older/newer torch without it
    def _is_fake(x: torch.Tensor) -> bool:
        return False


def transform_of(x: torch.Tensor) -> Optional[str]:
    """The torch.func transform whose wrapper tensor x is (``"torch.func.vmap"``, ...), or None for
    a tensor with memory of its own (also a meta or fake tensor). Such wrappers (functorch's
    BatchedTensor and GradTrackingTensor, the FunctionalTensorWrapper of
    ``torch.func.functionalize``) have no data pointer of their own."""
    f = torch._C._functorch
    if f.is_batchedtensor(x):
        return "torch.func.vmap"
    if f.is_gradtrackingtensor(x):
        return "torch.func.grad / vjp / jacrev / jvp / jacfwd"
    if torch._is_functional_tensor(x):
        return "torch.func.functionalize"
    return None


def refuse_transforms(op: str, *tensors) -> None:
    """RuntimeError when a tensor argument of the in-place operator ``op`` (``None`` entries and
    nested lists allowed) is a torch.func wrapper tensor (`transform_of`): these operators write
    their arguments in place and have no autograd, batching or functionalization rule, so under
    ``vmap`` / ``grad`` / ``functionalize`` they would fail deep inside (or write a temporary) .
    Nothing is checked while torch.compile traces, nor outside every torch.func transform (one
    query, so the operators' every call does not pay a per-tensor check)."""
    if torch.compiler.is_compiling() or not transforms_active():
        return
    stack = list(tensors)
    while stack:
        x = stack.pop()
        if isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, torch.Tensor):
            how = transform_of(x)
            if how is not None:
                raise RuntimeError(
                    f"entangle_ext.{op} is an in-place operator without autograd, batching or "
                    f"functionalization rule: it is not supported under {how}; call it outside the "
                    "transform (e.g. on the .grad tensors after backward), or use "
                    "entangle_ext.project_orthogonal / augmented_lagrangian_term, which support the "
                    "torch.func transforms")


def has_memory(x: torch.Tensor) -> bool:
    """False for meta and fake tensors, torch.func wrapper tensors (`transform_of`) and while
    `torch.compile` traces (no data pointers of their own)."""
    if x.device.type == "meta" or torch.compiler.is_compiling():
        return False
    wrapped = transforms_active() and transform_of(x) is not None
    if type(x) is torch.Tensor:
        return not wrapped
    return not _is_fake(x) and not wrapped


def _dense(x: torch.Tensor) -> bool:
    """True when x covers exactly [data_ptr, data_ptr + nbytes) (dense and non-overlapping, in
    any order of its strides), so that this interval is its memory."""
    if x.is_contiguous():
        return True
    extent = 1
    for size, stride in zip(x.shape, x.stride()):
        if stride < 0:
            return False
        extent += (size - 1) * stride
    return extent == x.numel()


def _any_overlap(starts: np.ndarray, ends: np.ndarray, nw: int) -> bool:
    """Vectorised screen: does any non-empty interval intersect an earlier one (by start) of the
    kind it may not meet (a written one meets nothing, a read one no written one)?"""
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    written = order < nw
    nonempty = e > s
    e = np.where(nonempty, e, -1)
    end_any = np.maximum.accumulate(e)[:-1]
    end_written = np.maximum.accumulate(np.where(written, e, -1))[:-1]
    before = np.where(written[1:], end_any, end_written)
    return bool((nonempty[1:] & (before > s[1:])).any())


def first_overlap(written: Sequence[torch.Tensor], read: Sequence[torch.Tensor] = ()
                  ) -> Optional[Tuple[int, int]]:
    """Indices into ``list(written) + list(read)`` of the first pair of non-empty tensors that
    share memory, among written x written and written x read (two read tensors may share memory),
    or None.

    Each tensor is the interval [data_ptr, data_ptr + nbytes). Sorted by start, a tensor overlaps
    an earlier one iff the largest end seen so far (of all tensors, or of the written ones for a
    read tensor) exceeds its start: a vectorised screen (`_any_overlap`), then, only when it
    finds something, the same sweep in Python over the dense tensors to name the pair. Exact for
    dense tensors; tensors that are not dense are left out (the operators refuse such a view
    anyway, with a message that names the real problem).
    """
    ts = list(written) + list(read)
    if len(ts) < 2:
        return None
    nw = len(written)
    starts = [x.data_ptr() for x in ts]
    ends = [s + x.nbytes for s, x in zip(starts, ts)]
    try:   # the screen pays off from a few dozen tensors on (a run passes hundreds)
        if len(ts) > 32 and not _any_overlap(np.array(starts, dtype=np.int64),
                                             np.array(ends, dtype=np.int64), nw):
            return None
    except OverflowError:   # an address beyond int64: skip the screen, the sweep below decides
        pass
    # non-empty dense tensors with memory of their own (a meta tensor's data_ptr is 0: two of
    # them "overlapped"), swept device by device (addresses of two devices never alias)
    order = sorted((i for i in range(len(ts)) if ends[i] > starts[i] and _dense(ts[i]) and has_memory(ts[i])),
                   key=lambda i: (str(ts[i].device), starts[i]))
    device = None
    for i in order:
        if ts[i].device != device:   # a new address space
            device = ts[i].device
            far_any = far_w = -1     # index of the largest end so far (all / written), -1: none
            end_any = end_w = -1
        s, e = starts[i], ends[i]
        j, end = (far_any, end_any) if i < nw else (far_w, end_w)
        if end > s:
            return j, i
        if e > end_any:
            far_any, end_any = i, e
        if i < nw and e > end_w:
            far_w, end_w = i, e
    return None


def check_disjoint(op: str, written: Sequence[torch.Tensor], read: Sequence[torch.Tensor],
                   written_name, read_name) -> None:
    """Raise ValueError naming the first overlapping pair (see `first_overlap`).

    ``written_name(i)`` / ``read_name(i)`` give the caller's name of entry i (built only on error).
    """
    if not written or not has_memory(written[0]):
        return
    hit = first_overlap(written, read)
    if hit is None:
        return
    nw = len(written)
    a, b = sorted(hit, key=lambda i: (i >= nw, i))   # written first, then by index
    if b < nw:
        raise ValueError(f"{op}: {written_name(a)} and {written_name(b)} overlap in memory; "
                         "every tensor updated in place needs memory of its own (pass a clone)")
    raise ValueError(f"{op}: {read_name(b - nw)} shares memory with {written_name(a)}, which is "
                     "updated in place; pass a clone")
