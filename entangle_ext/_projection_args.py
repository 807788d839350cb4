"""Argument handling shared by the projection wrappers (entangle_ext.projection): the limits read
from the compiled extension, scalar checks, and the normalisation of gradient / basis lists."""
from __future__ import annotations

import math
import numbers
from typing import List, Optional, Sequence, Tuple

import torch

from . import _ext, _fwad
from ._dense import check_dense
from ._overlap import check_disjoint


def _limits() -> Tuple[int, float]:
    """(MAX_BASIS, DEFAULT_RCOND) as compiled into the extension (csrc/projection.h). Without a
    loaded extension (reference-only use) the same values, which a test checks against the build."""
    C = _ext._C if _ext.available() else None
    if C is not None and hasattr(C, "projection_max_basis"):
        return int(C.projection_max_basis()), float(C.projection_default_rcond())
    return 8, 1e-7


#: Largest number of basis vectors k of the projection operators.
#: Default relative eigenvalue cutoff of the row-normalised Gram (``rcond=None`` means this value).
MAX_BASIS, DEFAULT_RCOND = _limits()


def refuse_tangent(op: str, *tensors) -> None:
    """`_fwad.refuse` for the non-differentiable projection operators, pointing to
    `entangle_ext.project_orthogonal`, the differentiable projection."""
    _fwad.refuse(op, *tensors, hint=", or use entangle_ext.project_orthogonal, which is differentiable in g "
                                    "in both modes")


def refuse_grad(op: str, named) -> None:
    """NotImplementedError when, with grad mode on, a tensor argument of the non-differentiable
    ``op`` (`projection_gram`, `projection_solve`) requires grad (also under ``torch.func.grad`` /
    ``vjp`` / ``jacrev``): its result is detached, so a gradient through it would silently be
    zero. ``named``: ``(name, tensor or None)`` pairs."""
    if not torch.is_grad_enabled():
        return
    for name, x in named:
        if isinstance(x, torch.Tensor) and x.requires_grad:
            raise NotImplementedError(
                f"reverse-mode AD (backward, torch.autograd.grad, torch.func.grad/vjp/jacrev) is not "
                f"supported by entangle_ext.{op}: {name} requires grad, but the result has no autograd "
                "and would give a zero gradient; pass detached tensors (e.g. x.detach()) or call it "
                "under torch.no_grad(), or use entangle_ext.project_orthogonal, which is "
                "differentiable in g")


def check_tensor(op: str, name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    check_dense(op, name, t)


def check_k(op: str, k: int) -> None:
    if k < 1 or k > MAX_BASIS:
        raise ValueError(f"{op}: the number of basis vectors k must be in [1, {MAX_BASIS}], got {k}")


def _is_real(x) -> bool:
    """A Python int/float or a numpy real scalar (np.float32, np.int64, ...), not a bool. The
    plain isinstance test comes first: under torch.compile a symbolic float takes that branch."""
    if isinstance(x, bool):
        return False
    return isinstance(x, (int, float)) or isinstance(x, numbers.Real)


def _as_float(op: str, name: str, x) -> float:
    """float(x), with a ValueError (not OverflowError) for an integer beyond the float range."""
    try:
        return float(x)
    except OverflowError:
        raise ValueError(f"{op}: {name} must be finite, got an integer beyond the float range "
                         f"({x!r:.40}...)") from None


def check_rcond(op: str, rcond) -> Optional[float]:
    """None (the operators' DEFAULT_RCOND) or a float in [1e-15, 1)."""
    if rcond is None:
        return None
    if not _is_real(rcond):
        raise TypeError(f"{op}: rcond must be a float or None, got {type(rcond).__name__}")
    rcond = _as_float(op, "rcond", rcond)
    if not (1e-15 <= rcond < 1.0):
        raise ValueError(f"{op}: rcond must be in [1e-15, 1), got {rcond}")
    return rcond


def check_ridge(op: str, name: str, x) -> float:
    """A float in [0, inf). The test is two comparisons, not ``math.isfinite``: under
    ``torch.compile(dynamic=True)`` a ridge from an argument, a default or a closure is a symbolic
    float, and ``math.isfinite`` of one is a graph break (an error with ``fullgraph=True``);
    comparisons are guards (NaN fails both)."""
    if not _is_real(x):
        raise TypeError(f"{op}: {name} must be a float, got {type(x).__name__}")
    x = _as_float(op, name, x)
    if not (0.0 <= x < math.inf):
        raise ValueError(f"{op}: {name} must be finite and >= 0, got {x}")
    return x


def gather_lists(op: str, grads, basis, *, inplace: bool,
                 also_read: Sequence[Tuple[str, torch.Tensor]] = ()
                 ) -> Tuple[List[torch.Tensor], List[torch.Tensor], int, Optional[torch.Tensor]]:
    """Validate the list arguments; drop ``None`` gradients with their basis entries.

    Returns ``(gs, flat, k, probe)``: the kept gradients, their basis tensors row-major by basis
    vector (``flat[i * len(gs) + t]``, detached), k, and a tensor that tells the device and dtype
    (the first kept gradient, else the first basis tensor, else None). With ``inplace`` (the
    operators that write ``grads``) the gradients must not overlap one another in memory nor
    share memory with a basis tensor or an ``also_read`` tensor (``(name, tensor)`` pairs), else
    ValueError naming the two entries (metadata only: no device synchronisation).
    """
    if isinstance(grads, torch.Tensor) or not isinstance(grads, (list, tuple)):
        raise TypeError(f"{op}: grads must be a list or tuple of tensors, got {type(grads).__name__}")
    grads = list(grads)
    if len(grads) == 0:
        raise ValueError(f"{op}: grads must be a non-empty list of tensors")
    for t, x in enumerate(grads):
        if x is not None:
            check_tensor(op, f"grads[{t}]", x)
    if isinstance(basis, torch.Tensor) or not isinstance(basis, (list, tuple)):
        raise TypeError(f"{op}: basis must be a sequence of k lists of tensors, got {type(basis).__name__}")
    check_k(op, len(basis))
    T = len(grads)
    keep = [t for t, x in enumerate(grads) if x is not None]
    rows, probe = [], None
    for i, row in enumerate(basis):
        if isinstance(row, torch.Tensor) and T == 1:
            row = [row]
        if isinstance(row, torch.Tensor) or not isinstance(row, (list, tuple)):
            raise TypeError(f"{op}: basis[{i}] must be a list of {T} tensors matching grads")
        if len(row) != T:
            raise ValueError(f"{op}: basis[{i}] has {len(row)} tensors but grads has {T}")
        for t in keep:
            if row[t] is None:
                raise ValueError(f"{op}: basis[{i}][{t}] is None but grads[{t}] is a tensor (for a "
                                 "parameter this basis loss does not use, pass zeros, e.g. "
                                 "torch.zeros_like(grads[t]))")
            check_tensor(op, f"basis[{i}][{t}]", row[t])
        if probe is None:
            probe = next((v for v in row if isinstance(v, torch.Tensor)), None)
        rows.append(row)
    gs = [grads[t] for t in keep]
    flat = [rows[i][t].detach() for i in range(len(rows)) for t in keep]
    if inplace:
        if torch.is_grad_enabled() and any(x.requires_grad for x in gs):
            raise ValueError(f"{op}: grads must not require grad (it is modified in place without "
                             "autograd); pass the .grad tensors or call it under torch.no_grad()")
        n, nb = len(gs), len(flat)

        def read_name(r: int) -> str:
            return f"basis[{r // n}][{keep[r % n]}]" if r < nb else also_read[r - nb][0]

        check_disjoint(op, gs, flat + [t for _, t in also_read], lambda j: f"grads[{keep[j]}]",
                       read_name)
    return gs, flat, len(rows), gs[0] if gs else probe
