"""Pure-PyTorch reference of `entangle_ext.wasserstein2_1d` (test oracle and documented fallback).

Exact 1-D Wasserstein-2 for uniform weights and unequal sizes, docs/algorithm.md §4.

Differentiable through `torch.sort` (autograd), any device, no compiled code. Same argument forms
and result as the operator (see `entangle_ext.wasserstein2_1d`); it does not validate values.
"""
from __future__ import annotations

from typing import Optional

import torch

from .._wasserstein_args import OffsetsLike, normalize, reduce

__all__ = ["wasserstein2_1d", "wasserstein2_1d_sorted"]


def wasserstein2_1d_sorted(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact W2^2 between two **sorted** 1-D samples a ``(n_a,)`` and b ``(n_b,)``, uniform weights.

    Enumerates the n_a + n_b - gcd pieces of [0, 1) on which both quantile functions are constant
    (breakpoints i/n_a and j/n_b, in exact integer units of 1/(n_a n_b)) and sums
    length * (a_i - b_j)^2. Differentiable in a and b. Returns a 0-d tensor (NaN if either is empty).
    """
    na, nb = a.numel(), b.numel()
    if na == 0 or nb == 0:
        return a.new_tensor(float("nan"))
    if na == nb:
        return ((a - b) ** 2).mean()
    dev = a.device
    bps = torch.cat([torch.arange(na + 1, device=dev) * nb, torch.arange(nb + 1, device=dev) * na])
    bps = torch.unique(bps)  # sorted, integer units of 1/(na*nb)
    start, width = bps[:-1], bps[1:] - bps[:-1]
    i, j = start // nb, start // na
    d = a[i] - b[j]
    return (width.to(a.dtype) * d * d).sum() / (na * nb)


def wasserstein2_1d(u: torch.Tensor, v: torch.Tensor, u_offsets: Optional[OffsetsLike] = None,
                    v_offsets: Optional[OffsetsLike] = None, *,
                    reduction: str = "none", max_seqlen: Optional[int] = None,
                    validate: bool = True) -> torch.Tensor:
    """W2^2 per segment, by `torch.sort` and the exact quantile-overlap sum (see module doc).

    Shapes, dtypes and return value as `entangle_ext.wasserstein2_1d`; ``max_seqlen`` and
    ``validate`` (the kernels' launch hint and data check) are taken and ignored, so a call of the
    operator runs here unchanged (NaN / empty segments give NaN, as the operator with
    ``validate=False``). Equal-length dense batches
    use the vectorised composite ``((sort(u) - sort(v))**2).mean(-1)`` (the plain-PyTorch baseline
    of the benchmarks); other cases loop over segments in Python.

    Raises:
        TypeError, ValueError: as `entangle_ext.wasserstein2_1d` for malformed arguments.
    """
    op = "reference.wasserstein2_1d"
    if u_offsets is None and isinstance(u, torch.Tensor) and isinstance(v, torch.Tensor) \
            and u.shape == v.shape and u.dim() in (1, 2) and u.shape[-1] > 0 and u.dtype == v.dtype:
        w2 = ((torch.sort(u, dim=-1, stable=True).values - torch.sort(v, dim=-1, stable=True).values) ** 2).mean(-1)
        return reduce(op, w2, reduction)
    seg = normalize(op, u, v, u_offsets, v_offsets)
    uo, vo = seg.u_offsets.tolist(), seg.v_offsets.tolist()
    vals = []
    for s in range(seg.num_segments):
        a = torch.sort(seg.u[uo[s]:uo[s + 1]], stable=True).values
        b = torch.sort(seg.v[vo[s]:vo[s + 1]], stable=True).values
        vals.append(wasserstein2_1d_sorted(a, b))
    w2 = torch.stack(vals) if vals else seg.u.new_zeros((0,))
    return reduce(op, w2.reshape(seg.out_shape).to(seg.input_dtype), reduction)
