"""The three entangle_ext operators the driver needs, behind one private seam.

The operators ``entangle_ext.project_orthogonal_``, ``entangle_ext.dual_update_`` and
``entangle_ext.augmented_lagrangian_term`` are developed on other branches. Every driver call goes
through this module: when the operator exists on the ``entangle_ext`` package it is called,
otherwise a plain-PyTorch equivalent with the same semantics runs (device-side, no host sync).
The fallbacks are temporary and will be deleted after the operator branches are merged.
"""
from __future__ import annotations

from typing import List, Sequence

import torch

import entangle_ext as _ee

__all__ = ["project_", "dual_update_", "al_term"]

_RCOND = 1e-10


def _dot64(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> torch.Tensor:
    """Σ_t <a_t, b_t> accumulated in float64 over a list of tensors, as a 0-d device tensor."""
    acc = None
    for x, y in zip(a, b):
        d = torch.dot(x.reshape(-1).double(), y.reshape(-1).double())
        acc = d if acc is None else acc + d
    return acc


def _sym_pinv(gram: torch.Tensor, rcond: float) -> torch.Tensor:
    """Pseudo-inverse of a k×k symmetric PSD Gram matrix without host sync: closed form for
    k ≤ 2 (rank decided on the device by torch.where), `torch.linalg.pinv` otherwise (which may
    synchronise on CUDA for its error check)."""
    k = gram.shape[0]
    tr = torch.diagonal(gram).sum()
    safe_tr = torch.where(tr > 0, tr, torch.ones_like(tr))
    rank1 = torch.where(tr > 0, gram / (safe_tr * safe_tr), torch.zeros_like(gram))  # G = t·uuᵀ → uuᵀ/t
    if k == 1:
        return rank1
    if k == 2:
        a, b, d = gram[0, 0], gram[0, 1], gram[1, 1]
        det = a * d - b * b
        full = det > rcond * tr * tr
        safe_det = torch.where(full, det, torch.ones_like(det))
        inv = torch.stack([torch.stack([d, -b]), torch.stack([-b, a])]) / safe_det
        return torch.where(full, inv, rank1)
    return torch.linalg.pinv(gram, rtol=rcond, hermitian=True)


def project_(grads: List[torch.Tensor], basis: List[List[torch.Tensor]], rcond: float = _RCOND
             ) -> torch.Tensor:
    """In place: grads ← grads − Vᵀ (V Vᵀ)⁺ V grads over the concatenation of all tensors.

    Implements step 5 of Stage 2 (W-PGD) in method.md. ``grads[t]`` and ``basis[r][t]`` have the
    same shape/dtype/device for every parameter tensor t; k = len(basis) directions. The Gram
    matrix and V·grads are accumulated in float64; (V Vᵀ)⁺ is a device-side pseudo-inverse with
    relative cutoff ``rcond`` (a zero or parallel direction is dropped, never divides by zero).
    Returns the coefficients c (k,) float64 on the device. No host synchronisation.
    """
    fn = getattr(_ee, "project_orthogonal_", None)
    if fn is not None:
        return fn(grads, basis, rcond=rcond)
    k = len(basis)
    if k == 0:
        return grads[0].new_zeros((0,), dtype=torch.float64)
    gram_rows = []
    for i in range(k):
        gram_rows.append(torch.stack([_dot64(basis[i], basis[j]) for j in range(k)]))
    gram = torch.stack(gram_rows)                                   # (k, k) float64
    vg = torch.stack([_dot64(basis[i], grads) for i in range(k)])  # (k,)   float64
    coeffs = _sym_pinv(gram, rcond) @ vg
    for t, g in enumerate(grads):
        upd = sum(coeffs[r].to(g.dtype) * basis[r][t] for r in range(k))
        g.sub_(upd)
    return coeffs


def dual_update_(lam: torch.Tensor, g: torch.Tensor, mu: float) -> torch.Tensor:
    """In place λ ← λ + μ·g (equality constraint), λ and g device tensors of the same shape.

    Implements the Stage 1 dual update of method.md. ``g`` is detached. No host sync. Returns λ.
    """
    fn = getattr(_ee, "dual_update_", None)
    if fn is not None:
        return fn(lam, g.detach(), mu, kind="equality")
    return lam.add_(g.detach().to(lam.dtype), alpha=float(mu))


def al_term(g: torch.Tensor, lam: torch.Tensor, mu: float) -> torch.Tensor:
    """Augmented-Lagrangian penalty λᵀg + (μ/2)‖g‖² (Stage 1 of method.md), differentiable in g.

    ``g`` () or (m,) constraint value(s) with autograd, ``lam`` same shape (no grad), float.
    Returns a 0-d tensor on g's device.
    """
    fn = getattr(_ee, "augmented_lagrangian_term", None)
    if fn is not None:
        return fn(g, lam, mu, kind="equality")
    lam = lam.detach().to(g.dtype)
    return (lam * g).sum() + 0.5 * float(mu) * (g * g).sum()
