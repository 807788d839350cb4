"""Fused low-rank orthogonal gradient projection (custom operators + autograd).

Implements step 5 of Stage 2 (W-PGD) of Cheng, Liu, Li, Zhang, "Machine Unlearning under
Retain-Forget Entanglement", ICLR 2026 (Prop. 4.1; docs/method.md): with the k basis vectors
V = [v_1; ...; v_k] (e.g. V = [g_f; g_rem]) and the update direction g,

    out = g - V^T c,    c = (V V^T)^+ V g,

i.e. g minus its orthogonal projection onto span{v_1, ..., v_k}; a step along -out changes the
losses whose gradients span V only at second order.

How the pseudo-inverse is taken (identical in the CPU and CUDA kernels and in
`entangle_ext.reference.projection`): the Gram G = V V^T and V g are accumulated in float64; the
rows are normalised, C = S G S with S = diag(1/||v_i||) (S_ii = 0 for an all-zero row), C is
eigen-decomposed in float64 (cyclic Jacobi), eigenvalues w_m <= rcond * max(w) are discarded, and
c = S C^+ S V g. The result is the projection onto the span of the rows kept: all-zero rows,
duplicated rows and near-collinear rows (1 - |cos angle| below about rcond) are handled without
NaN/Inf and without amplifying the update, and the result does not depend on the scale of the rows.
This equals ``torch.linalg.pinv(C, rtol=rcond, hermitian=True)``.

Non-finite values in ``g`` or ``basis`` give unspecified (typically NaN) results; nothing is checked
on the data, because on CUDA that would cost a host synchronisation.
"""
from __future__ import annotations

from typing import Sequence, Tuple, Union

import torch

from . import _ext

__all__ = ["project_orthogonal", "project_orthogonal_", "MAX_BASIS", "DEFAULT_RCOND"]

#: Largest number of basis vectors k supported by the kernels.
MAX_BASIS = 8
#: Default relative eigenvalue cutoff of the row-normalised Gram.
DEFAULT_RCOND = 1e-7

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

BasisLike = Union[torch.Tensor, Sequence[torch.Tensor]]


def _check_tensor(op: str, name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")


def _check_rcond(op: str, rcond) -> float:
    if isinstance(rcond, bool) or not isinstance(rcond, (int, float)):
        raise TypeError(f"{op}: rcond must be a float, got {type(rcond).__name__}")
    rcond = float(rcond)
    if not (1e-15 <= rcond < 1.0):
        raise ValueError(f"{op}: rcond must be in [1e-15, 1), got {rcond}")
    return rcond


def _check_k(op: str, k: int) -> None:
    if k < 1 or k > MAX_BASIS:
        raise ValueError(f"{op}: the number of basis vectors k must be in [1, {MAX_BASIS}], got {k}")


def project_orthogonal(g: torch.Tensor, basis: BasisLike, *,
                       rcond: float = DEFAULT_RCOND) -> Tuple[torch.Tensor, torch.Tensor]:
    """Project ``g`` onto the orthogonal complement of the span of the rows of ``basis``.

    Computes ``out = g - V^T c`` with ``c = (V V^T)^+ V g`` (method.md Stage 2 step 5, Prop. 4.1),
    the pseudo-inverse taken in float64 with the relative cutoff ``rcond`` on the eigenvalues of
    the row-normalised Gram (see the module docstring).

    Args:
        g: ``(P,)`` vector (any units), float32/float64/float16/bfloat16, contiguous, CPU or CUDA.
        basis: V, either a ``(k, P)`` tensor or a sequence of k ``(P,)`` tensors (stacked into one
            ``(k, P)`` tensor, a copy), 1 <= k <= 8, same dtype and device as ``g``, contiguous.
        rcond: relative eigenvalue cutoff in [1e-15, 1) (dimensionless).

    Returns:
        ``(out, coeffs)``: ``out`` ``(P,)`` with the dtype, device and units of ``g``
        (computed in float64, rounded once); ``coeffs`` = c, ``(k,)`` float64 on the device of
        ``g``, in units of g per unit of V (``V^T coeffs`` is the removed component).

    Autograd: differentiable with respect to ``g``; the map is linear with a symmetric projector,
    so the gradient is the same projection of the incoming gradient of ``out``. ``basis`` is
    treated as a constant: no gradient flows to it (it is detached). ``coeffs`` is returned as
    non-differentiable.

    Raises:
        TypeError: non-tensor arguments, an unsupported dtype, ``basis`` with another dtype than
            ``g``, a non-float ``rcond``.
        ValueError: ``g`` not 1-D, ``basis`` not ``(k, P)``, k outside [1, 8], mismatched devices,
            non-contiguous tensors, ``rcond`` outside [1e-15, 1).
        RuntimeError: the native extension is not built/loaded, or a CUDA tensor with a CPU-only
            build.
    """
    op = "project_orthogonal"
    _check_tensor(op, "g", g)
    rcond = _check_rcond(op, rcond)
    if g.dim() != 1:
        raise ValueError(f"{op}: g must be 1-D (P,), got shape {tuple(g.shape)}")
    if not isinstance(basis, torch.Tensor):
        if not isinstance(basis, (list, tuple)):
            raise TypeError(f"{op}: basis must be a (k, P) tensor or a sequence of (P,) tensors, "
                            f"got {type(basis).__name__}")
        _check_k(op, len(basis))
        for i, v in enumerate(basis):
            _check_tensor(op, f"basis[{i}]", v)
            if tuple(v.shape) != tuple(g.shape):
                raise ValueError(f"{op}: basis[{i}] has shape {tuple(v.shape)}, expected "
                                 f"{tuple(g.shape)} like g")
            if v.dtype != g.dtype:
                raise TypeError(f"{op}: basis[{i}] is {v.dtype} but g is {g.dtype}")
            if v.device != g.device:
                raise ValueError(f"{op}: basis[{i}] is on {v.device} but g is on {g.device}")
        basis = torch.stack([v.detach() for v in basis])
    if basis.dim() != 2:
        raise ValueError(f"{op}: basis must be 2-D (k, P), got shape {tuple(basis.shape)}")
    _check_k(op, basis.shape[0])
    if g.dtype not in _DTYPES:
        raise TypeError(f"{op}: g must be float32, float64, float16 or bfloat16, got {g.dtype}")
    _ext.require(op, g, basis)
    return torch.ops.entangle_ext.project_orthogonal(g, basis.detach(), rcond)


def project_orthogonal_(grads: Sequence[torch.Tensor], basis: Sequence[Union[Sequence[torch.Tensor], torch.Tensor]],
                        *, rcond: float = DEFAULT_RCOND) -> torch.Tensor:
    """In place: project the concatenation of ``grads`` onto the orthogonal complement of the basis.

    The vectors are the concatenations over the list (e.g. every parameter's ``.grad``), but nothing
    is concatenated or copied: with g = cat(grads) and v_i = cat(basis[i]), every ``grads[t]`` is
    overwritten with its slice of ``g - V^T c``, ``c = (V V^T)^+ V g`` (method.md Stage 2 step 5,
    Prop. 4.1; same float64 solve and cutoff as `project_orthogonal`). Two passes over the data;
    on CUDA no host synchronisation (CUDA-graph capturable), deterministic (no atomics).

    Args:
        grads: non-empty sequence of T tensors of any shapes (empty tensors allowed), one dtype
            (float32/float64/float16/bfloat16), one device (CPU or CUDA), contiguous, modified in
            place. They must not require grad while grad mode is on (use ``p.grad`` or
            ``torch.no_grad()``).
        basis: k sequences (1 <= k <= 8), each of T tensors matching ``grads`` tensor by tensor in
            shape, dtype and device, contiguous, not aliasing ``grads``. When T == 1, ``basis[i]``
            may be a single tensor. Read only; treated as a constant.
        rcond: relative eigenvalue cutoff in [1e-15, 1) (dimensionless).

    Returns:
        coeffs = c, ``(k,)`` float64 on the device of ``grads`` (not synchronised to the host).

    Raises:
        TypeError: non-tensor entries, unsupported or mixed dtypes, a non-float ``rcond``.
        ValueError: empty ``grads``, k outside [1, 8], a basis list of the wrong length, mismatched
            shapes/devices, non-contiguous tensors, ``grads`` requiring grad in grad mode,
            ``rcond`` outside [1e-15, 1).
        RuntimeError: the native extension is not built/loaded, or a CUDA tensor with a CPU-only
            build.
    """
    op = "project_orthogonal_"
    rcond = _check_rcond(op, rcond)
    if isinstance(grads, torch.Tensor) or not isinstance(grads, (list, tuple)):
        raise TypeError(f"{op}: grads must be a list or tuple of tensors, got {type(grads).__name__}")
    grads = list(grads)
    if len(grads) == 0:
        raise ValueError(f"{op}: grads must be a non-empty list of tensors")
    for t, x in enumerate(grads):
        _check_tensor(op, f"grads[{t}]", x)
    if isinstance(basis, torch.Tensor) or not isinstance(basis, (list, tuple)):
        raise TypeError(f"{op}: basis must be a sequence of k lists of tensors, got {type(basis).__name__}")
    _check_k(op, len(basis))
    T = len(grads)
    flat = []
    for i, row in enumerate(basis):
        if isinstance(row, torch.Tensor) and T == 1:
            row = [row]
        if isinstance(row, torch.Tensor) or not isinstance(row, (list, tuple)):
            raise TypeError(f"{op}: basis[{i}] must be a list of {T} tensors matching grads")
        if len(row) != T:
            raise ValueError(f"{op}: basis[{i}] has {len(row)} tensors but grads has {T}")
        for t, v in enumerate(row):
            _check_tensor(op, f"basis[{i}][{t}]", v)
            flat.append(v.detach())
    if torch.is_grad_enabled() and any(x.requires_grad for x in grads):
        raise ValueError(f"{op}: grads must not require grad (it is modified in place without "
                         "autograd); pass the .grad tensors or call it under torch.no_grad()")
    _ext.require(op, *grads[:1], *flat[:1])
    return torch.ops.entangle_ext.project_orthogonal_(grads, flat, rcond)


# ---------------------------------------------------------------------------------------------
# torch.library registrations: fake (meta) kernels and autograd.
# ---------------------------------------------------------------------------------------------
def _fake_flat(g, basis, rcond):
    return torch.empty_like(g), g.new_empty((basis.shape[0],), dtype=torch.float64)


def _fake_inplace(grads, basis, rcond):
    k = len(basis) // max(len(grads), 1)
    return grads[0].new_empty((k,), dtype=torch.float64)


def _setup_context(ctx, inputs, output):
    _, basis, rcond = inputs
    ctx.save_for_backward(basis)
    ctx.rcond = rcond
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, grad_out, _grad_coeffs):
    (basis,) = ctx.saved_tensors
    grad_g = None
    if ctx.needs_input_grad[0]:
        # The projector I - V^T C^+ V is symmetric: the vector-Jacobian product is the projection.
        grad_g, _ = torch.ops.entangle_ext.project_orthogonal(grad_out.contiguous(), basis, ctx.rcond)
    return grad_g, None, None


if _ext.available():
    torch.library.register_fake("entangle_ext::project_orthogonal")(_fake_flat)
    torch.library.register_fake("entangle_ext::project_orthogonal_")(_fake_inplace)
    torch.library.register_autograd("entangle_ext::project_orthogonal", _backward,
                                    setup_context=_setup_context)
