"""Pure-PyTorch references of the augmented-Lagrangian operators (test oracles and fallback).

Plain formulas of Stage 1 of the method (docs/algorithm.md §2, §6), no compiled code, any device,
computed in float64 and returned in the dtype of ``lam`` (`dual_update_`) or ``g`` (`augmented_lagrangian_term`;
a float16 / bfloat16 g gives the dtype of ``lam``, as the operator, which upcasts such a g).
Same arguments and results as `entangle_ext.dual_update_` / `entangle_ext.augmented_lagrangian_term`,
but they do not validate values (non-finite entries follow the operators' device-side rule: they
leave lam unchanged).
"""
from __future__ import annotations

from typing import Optional, Union

import torch

__all__ = ["dual_update_", "augmented_lagrangian_term"]

_KINDS = ("equality", "inequality")


def _as_tensor(x: Union[torch.Tensor, float], like: torch.Tensor) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.to(device=like.device, dtype=torch.float64)
    return torch.tensor(float(x), dtype=torch.float64, device=like.device)


def dual_update_(lam: torch.Tensor, g: torch.Tensor, mu: Union[torch.Tensor, float], *,
                 kind: str = "equality", lam_min: Optional[float] = None,
                 lam_max: Optional[float] = None, damping: float = 0.0,
                 check_finite: Optional[bool] = None) -> torch.Tensor:
    """In-place float64 reference of the dual step; returns ``lam``. ``check_finite`` (the
    operator's host check) is taken and ignored: non-finite entries keep their lam, as below.

    t = (1 - damping) * lam + mu * g;  inequality: t = max(0, t);  lam = clamp(t, lam_min, lam_max),
    except where g or mu is non-finite (lam kept there).
    """
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
    l64 = lam.detach().to(torch.float64)
    g64 = g.detach().to(torch.float64).reshape(l64.shape)
    m64 = _as_tensor(mu, l64).expand(l64.shape)
    t = (1.0 - damping) * l64 + m64 * g64
    if kind == "inequality":
        t = t.clamp_min(0.0)
    if lam_min is not None:
        t = t.clamp_min(lam_min)
    if lam_max is not None:
        t = t.clamp_max(lam_max)
    ok = torch.isfinite(g64) & torch.isfinite(m64)
    with torch.no_grad():
        lam.copy_(torch.where(ok, t, l64).to(lam.dtype))
    return lam


def augmented_lagrangian_term(g: torch.Tensor, lam: torch.Tensor, mu: Union[torch.Tensor, float], *,
                              kind: str = "equality") -> torch.Tensor:
    """Float64 reference of the augmented-Lagrangian term, differentiable in ``g``; returns ``()``.

    equality:   sum_i lam_i g_i + (mu_i / 2) g_i^2
    inequality: sum_i (1 / (2 mu_i)) (max(0, lam_i + mu_i g_i)^2 - lam_i^2)   (mu > 0), evaluated
                piecewise as the operator does: lam_i g_i + (mu_i / 2) g_i^2 where lam_i + mu_i g_i > 0
                or is NaN (a NaN g gives NaN), else -lam_i^2 / (2 mu_i) (the difference of squares
                over 2 mu cancels to 0 for a tiny mu, e.g. 1e-20, where the true term is lam g).
    lam and mu are constants (detached). Returned in g's dtype, lam's for a float16 / bfloat16 g
    (whose term can exceed their range: 300^2 is beyond float16's 65504).
    """
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
    g64 = g.to(torch.float64).reshape(-1)
    l64 = lam.detach().to(torch.float64).reshape(-1)
    m64 = _as_tensor(mu, l64).detach().expand(l64.shape)
    if kind == "equality":
        out = (l64 * g64 + 0.5 * m64 * g64 * g64).sum()
    else:
        on = ~(l64 + m64 * g64 <= 0)   # active, or NaN
        ga = torch.where(on, g64, torch.zeros_like(g64))   # no 0 * inf gradient through the other side
        inactive = torch.where(l64 == 0, torch.zeros_like(l64), -(l64 * l64) / (2.0 * m64))
        out = torch.where(on, l64 * ga + 0.5 * m64 * ga * ga, inactive).sum()
    half = g.dtype in (torch.float16, torch.bfloat16)
    return out.to(lam.dtype if half else g.dtype)
