"""Projection of gradients sharded across the ranks of a torch.distributed group: the
``process_group`` path of `entangle_ext.project_orthogonal_` (docs/algorithm.md §5).

Each rank holds a disjoint part of g and V. The partial Gram and V g of every shard
(``projection_gram``) add up to those of the whole, so one all-reduce (sum) of k*k + k float64
numbers gives every rank the same system; every rank then runs the same solve (the ``projection_solve`` operator)
and projects its own shard (``projection_apply_``). For float64 tensors the rows are first rescaled
by powers of two from their global max |.| (a max all-reduce), which the single-process kernels do
only when squares under- or overflow; without data-dependent branches here, no rank ever waits for
the host.
"""
from __future__ import annotations

import math
from typing import List, Optional

import torch


def pow2_scales(amax: torch.Tensor) -> torch.Tensor:
    """Powers of two s with s * amax in [0.5, 1) (exponent clamped to [-1022, 1023]); 1 for zero or
    non-finite entries. The rule of proj_pow2_scale in csrc/projection.h, on a tensor."""
    _, e = torch.frexp(amax)
    s = torch.ldexp(torch.ones_like(amax), (-e).clamp(-1022, 1023))
    ok = (amax > 0) & torch.isfinite(amax)
    return torch.where(ok, s, torch.ones_like(amax))


def _exponent(pow2: torch.Tensor) -> torch.Tensor:
    return torch.frexp(pow2)[1] - 1


def _ldexp(x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """x * 2**e for |e| <= 2046 without an overflowing intermediate (torch.ldexp forms 2**e)."""
    h = torch.div(e, 2, rounding_mode="floor")
    one = torch.ones_like(x)
    return x * torch.ldexp(one, h) * torch.ldexp(one, e - h)


def _local_absmax(gs: List[torch.Tensor], flat: List[torch.Tensor], k: int,
                  device: torch.device) -> torch.Tensor:
    """(k + 1,) float64: max |.| of this rank's part of each basis row and of g (0 when empty)."""
    T = len(gs)
    out = torch.zeros(k + 1, dtype=torch.float64, device=device)
    for r in range(k + 1):
        tensors = [x for x in (gs if r == k else flat[r * T:(r + 1) * T]) if x.numel() > 0]
        if tensors:
            out[r] = torch.stack(torch._foreach_norm(tensors, ord=math.inf)).max().double()
    return out


def check_group(op: str, group) -> None:
    """TypeError unless ``group`` is a ``torch.distributed.ProcessGroup`` (e.g. ``dist.group.WORLD``,
    ``dist.new_group(...)``, a DDP model's ``process_group``, a device mesh's ``get_group()``)."""
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError(f"{op}: process_group needs torch.distributed, which this torch build "
                           "does not have")
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"{op}: process_group must be a torch.distributed ProcessGroup or None, got "
                        f"{type(group).__name__}")


def project_sharded_(gs: List[torch.Tensor], flat: List[torch.Tensor], k: int,
                     probe: Optional[torch.Tensor], *, rcond: Optional[float], ridge: float,
                     group) -> torch.Tensor:
    """Sharded `project_orthogonal_` (arguments already validated). Returns c (k,) float64."""
    import torch.distributed as dist

    from . import _ext
    from ._projection_args import check_rcond

    if probe is None:
        raise ValueError("project_orthogonal_: with process_group every rank must pass its "
                         "(possibly empty) local tensors, so that all ranks join the same collectives")
    op = torch.ops.entangle_ext
    _ext.require("project_orthogonal_", probe)
    dev, T = probe.device, len(gs)
    world = dist.get_world_size(group)
    scale = None
    if probe.dtype == torch.float64:
        amax = _local_absmax(gs, flat, k, dev)
        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
        scale = pow2_scales(amax)
    if T > 0:
        G, b = op.projection_gram(gs, flat, scale)
    else:
        G = torch.zeros(k, k, dtype=torch.float64, device=dev)
        b = torch.zeros(k, dtype=torch.float64, device=dev)
    if ridge > 0.0:  # ridge * (mean tensor count) in total, in the units of the scaled rows
        sh = torch.full((k,), ridge * T / world, dtype=torch.float64, device=dev)
        G.diagonal().add_(sh if scale is None else _ldexp(sh, 2 * _exponent(scale[:k])))
    buf = torch.cat([G.reshape(-1), b])
    dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=group)
    G, b = buf[:k * k].view(k, k).contiguous(), buf[k * k:].contiguous()
    c = op.projection_solve(G, b, check_rcond("project_orthogonal_", rcond), 0.0)   # as projection.projection_solve
    c = torch.where(torch.isfinite(G).all() & torch.isfinite(b).all(), c, float("nan"))
    if scale is None:
        c_apply, c_user = c, c
    else:
        eg = _exponent(scale[k])
        c_apply = _ldexp(c, -eg)
        c_user = _ldexp(c, _exponent(scale[:k]) - eg)
    if T > 0:
        row_scale = None if scale is None else scale[:k].contiguous()
        op.projection_apply_(gs, flat, c_apply.contiguous(), row_scale)
    return c_user
