"""Closed-form 1-D Wasserstein-2 between empirical distributions (custom operator + autograd).

Implements the W2 term of Stage 2 (W-PGD) of Cheng, Liu, Li, Zhang, "Machine Unlearning under
Retain-Forget Entanglement", ICLR 2026: for two empirical distributions on the real line with
uniform weights, W2 is exact by sorting. Sample i of sorted ``a`` (n_a values) covers quantiles
[i/n_a, (i+1)/n_a), sample j of sorted ``b`` (n_b values) covers [j/n_b, (j+1)/n_b); with their overlap
w_ij in integer units of 1/(n_a n_b),

    W2^2(a, b) = integral_0^1 (F_a^{-1}(t) - F_b^{-1}(t))^2 dt = sum_ij w_ij (a_(i) - b_(j))^2 / (n_a n_b),

which for n_a = n_b = n is (1/n) sum_i (a_(i) - b_(i))^2. The gradient, d/da_(i) = 2 sum_j w_ij
(a_(i) - b_(j)) / (n_a n_b), is scattered back through the stable sort permutation (ties keep their
input order, so the subgradient chosen at ties is deterministic). See docs/algorithm.md §4.

The forward kernel returns this local gradient dW2^2_s/dx for every input that requires grad, so
the backward is one elementwise product with the incoming gradient (no second sort, no gather).
"""
from __future__ import annotations

from typing import Optional

import torch

from . import _ext, _fwad
from ._augmented_lagrangian_args import check_flag
from ._wasserstein_args import OffsetsLike, normalize, reduce

__all__ = ["wasserstein2_1d"]

_OP = "wasserstein2_1d"


def wasserstein2_1d(u: torch.Tensor, v: torch.Tensor, u_offsets: Optional[OffsetsLike] = None,
                    v_offsets: Optional[OffsetsLike] = None, *, reduction: str = "none",
                    max_seqlen: Optional[int] = None, validate: bool = True) -> torch.Tensor:
    """Squared 1-D Wasserstein-2 distance W2^2 per segment, exact for unequal sizes.

    Implements the W2 term of Stage 2 (docs/algorithm.md §4, Exact 1-D Wasserstein-2).

    Args:
        u, v: values of the two distributions, on the same device (CPU or CUDA), same dtype
            (float32/float64; float16/bfloat16 are computed in float32 and the result cast back).
            Dense form: both ``(n,)`` or both ``(S, n)`` / ``(S, m)`` (row s of u against row s of v;
            n and m may differ). Ragged form: flat ``(N_u,)`` and ``(N_v,)``. Non-contiguous
            inputs are copied to contiguous memory.
        u_offsets, v_offsets: ragged form only: ``(S+1,)`` int32/int64 prefix sums (``cu_seqlens``),
            first 0, last N_u (resp. N_v). Segment s of u and of v may have different lengths.
            CPU offsets with CUDA values are copied to the device (meta offsets with real values
            are a ValueError).
        reduction: ``"none"`` (per segment), ``"mean"`` or ``"sum"`` over segments.
        max_seqlen: optional upper bound (an int in [0, 2**63 - 1]) on every segment length, as in
            variable-length attention APIs; on CUDA it selects the shared-memory kernel without a
            host read of the offsets. Known automatically in the dense form, from offsets given
            as a list or CPU tensor, and when validating; while torch.compile traces, only the
            value given here is used (the dense sizes are symbolic, and the operator's int
            argument would specialise the graph on them: one graph per size), so pass a constant
            bound to keep the shared-memory CUDA kernel in a compiled unvalidated call. A bound below the longest segment
            raises ValueError whenever it can be checked without a device sync (dense form,
            host offsets, or ``validate=True``); with CUDA offsets and ``validate=False`` such a
            segment gets NaN and a zero gradient (never an out-of-range access). The CPU kernels
            do not need it.
        validate: check the data (finite values, offsets start at 0 / end at N / no empty
            segment). On CPU this is folded into the kernel (nearly free); on CUDA it reads values
            back to the host (one sync), so pass False inside CUDA-graph capture,
            ``torch.compile(fullgraph=True)`` or hot loops. Without validation, a segment with NaN
            gives NaN (NaN sorts last), Inf gives Inf/NaN, an empty ragged segment gives NaN with
            zero gradient, and malformed offsets are clamped to [0, N] (memory-safe, result
            unspecified). Dense inputs with zero values per row always raise (the shape is known
            without reading data).

    Returns:
        W2^2 in squared units of the inputs: shape ``()`` for 1-D dense input, ``(S,)`` otherwise
        (or ``()`` with reduction mean/sum), dtype of the inputs, on their device. Differentiable
        with respect to ``u`` and ``v``; zero segments give an empty (or reduced) result that
        stays connected to the autograd graph. The autograd is a C++ function; under the
        ``torch.func`` transforms (``grad``, ``vjp``, ``jacrev``, ``functional_call`` + ``grad``,
        ``vmap``; per-sample gradients: ``vmap(grad(...))``) an autograd.Function with the same
        kernels runs instead (in eager mode: transforms inside ``torch.compile`` are not supported). Forward mode (``torch.func.jvp``, ``jacfwd``,
        ``torch.autograd.forward_ad`` dual tensors) works: the tangent of segment s is the sum
        over s of the local gradients times the input tangents. Second derivatives (double
        backward, ``hessian``, any nesting of ``jacfwd`` / ``jacrev``) raise
        NotImplementedError.

    Raises:
        TypeError: non-tensor or non-floating inputs, mismatched dtypes, non-integer offsets, a
            max_seqlen that is not an int (a float, str or bool is not truncated), a validate
            that is not a bool.
        ValueError: mismatched devices/shapes, empty distributions, empty or malformed offsets,
            a max_seqlen below 0, above 2**63 - 1 or below the longest segment, NaN/Inf values (when
            ``validate``), unknown reduction (checked before anything is computed).
        RuntimeError: the native extension is not built/loaded, a CUDA tensor with a CPU-only
            build, or ``validate=True`` during CUDA-graph capture.
        NotImplementedError: (when differentiated) a second derivative.
    """
    if not isinstance(reduction, str) or reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{_OP}: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    validate = check_flag(_OP, "validate", validate)
    seg = normalize(_OP, u, v, u_offsets, v_offsets, max_seqlen)
    cu, cv = seg.u, seg.v
    _ext.require(_OP, cu)
    if validate and cu.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{_OP}: validate=True reads values back to the host, which is not "
                           "allowed during CUDA-graph capture; pass validate=False")
    max_seqlen = -1 if seg.max_seqlen is None else seg.max_seqlen
    if _fwad.has_tangent(cu, cv) or _fwad.under_transform(cu, cv):
        # forward mode (jvp/jacfwd/dual) or torch.func (grad/vjp/jacrev/vmap): the C++ autograd runs under neither
        w2, _, _ = _fwad.W2Forward.apply(cu, cv, seg.u_offsets, seg.v_offsets, max_seqlen, validate)
    else:
        w2, _, _ = torch.ops.entangle_ext.wasserstein2_1d(  # autograd sets grad_u/grad_v as needed
            cu, cv, seg.u_offsets, seg.v_offsets, max_seqlen, False, False, validate)
    if seg.out_shape != (seg.num_segments,):
        w2 = w2.reshape(seg.out_shape)
    if w2.dtype != seg.input_dtype:
        w2 = w2.to(seg.input_dtype)
    return w2 if reduction == "none" else reduce(_OP, w2, reduction)


# ---------------------------------------------------------------------------------------------
# Fake (meta) kernels for torch.compile / FakeTensor. The autograd of both operators is registered
# in C++ (csrc/wasserstein_autograd.h): it raises grad_u/grad_v for inputs that require grad, and
# the double backward raises NotImplementedError.
# ---------------------------------------------------------------------------------------------
def _same_device(op, first, name, **others):
    """The device checks of the C++ kernels (csrc/wasserstein.h), with their messages: the fake
    kernels also run when any argument is a meta tensor."""
    for other, t in others.items():
        if t.device != first.device:
            raise ValueError(f"{op}: {name} is on {first.device} but {other} is on {t.device}")


def _fake_forward(u, v, u_offsets, v_offsets, max_seqlen, grad_u=False, grad_v=False, validate=False):
    _same_device(_OP, u, "u", v=v, u_offsets=u_offsets, v_offsets=v_offsets)
    S = u_offsets.shape[0] - 1
    return (u.new_empty((S,)), u.new_empty((u.shape[0] if grad_u else 0,)),
            v.new_empty((v.shape[0] if grad_v else 0,)))


def _fake_backward(grad, du, dv, u_offsets, v_offsets):
    for t in (du, dv, u_offsets, v_offsets):
        _same_device(f"{_OP}_backward", grad, "grad", **{"a saved tensor": t})
    return torch.empty_like(du), torch.empty_like(dv)


if _ext.available():
    torch.library.register_fake("entangle_ext::wasserstein2_1d")(_fake_forward)
    torch.library.register_fake("entangle_ext::wasserstein2_1d_backward")(_fake_backward)
