"""Pure-PyTorch references of the low-rank orthogonal projection (method.md Stage 2 step 5).

``project_orthogonal`` / ``project_orthogonal_`` are the float64 oracles of
`entangle_ext.project_orthogonal` / `entangle_ext.project_orthogonal_`: same arguments, same
results, same cutoff rule (row-normalised Gram C = S G S, eigenvalues <= rcond * max discarded,
i.e. ``pinv(C, rtol=rcond, hermitian=True)``), computed entirely in float64 with plain PyTorch.
They synchronise with the host on CUDA (``torch.linalg.eigh``).

``project_orthogonal_flat_composite`` and ``project_orthogonal_loop`` are the plain-PyTorch
baselines of the benchmark (bench/bench_projection.py): what one writes without a fused kernel.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import torch

__all__ = ["project_orthogonal", "project_orthogonal_", "project_orthogonal_flat_composite",
           "project_orthogonal_loop", "solve_coefficients"]

DEFAULT_RCOND = 1e-7


def solve_coefficients(gram: torch.Tensor, vg: torch.Tensor, rcond: float = DEFAULT_RCOND) -> torch.Tensor:
    """c = S C^+ S (V g) with C = S G S, S = diag(1/sqrt(G_ii)) (0 for a zero row).

    Args:
        gram: ``(k, k)`` Gram matrix V V^T (any float dtype; computed in float64).
        vg: ``(k,)`` products V g.
        rcond: relative eigenvalue cutoff of C (dimensionless).

    Returns:
        ``(k,)`` float64 coefficients c on the device of ``gram``.
    """
    G = gram.double()
    b = vg.double()
    d = torch.diagonal(G)
    active = (d > 0) & torch.isfinite(d)
    s = torch.where(active, d.clamp_min(torch.finfo(torch.float64).tiny).rsqrt(), torch.zeros_like(d))
    C = s[:, None] * G * s[None, :]
    w, Q = torch.linalg.eigh(C)
    cut = rcond * w.max().clamp_min(0)
    keep = (w > cut) & (w > 0)
    winv = torch.where(keep, 1.0 / torch.where(keep, w, torch.ones_like(w)), torch.zeros_like(w))
    y = Q @ (winv * (Q.T @ (s * b)))
    return s * y


def project_orthogonal(g: torch.Tensor, basis, *, rcond: float = DEFAULT_RCOND
                       ) -> Tuple[torch.Tensor, torch.Tensor]:
    """float64 reference of `entangle_ext.project_orthogonal`: out = g - V^T c, c = (V V^T)^+ V g.

    Args:
        g: ``(P,)`` tensor. basis: ``(k, P)`` tensor or sequence of k ``(P,)`` tensors.
        rcond: relative eigenvalue cutoff of the row-normalised Gram.

    Returns:
        ``(out, coeffs)``: out ``(P,)`` in the dtype of g, coeffs ``(k,)`` float64. Differentiable
        in g through plain autograd (V is detached).
    """
    V = basis if isinstance(basis, torch.Tensor) else torch.stack(list(basis))
    V = V.detach().double()
    gd = g.double()
    c = solve_coefficients(V @ V.T, V @ gd, rcond)
    out = gd - V.T @ c
    return out.to(g.dtype), c.detach()


def project_orthogonal_(grads: Sequence[torch.Tensor], basis, *, rcond: float = DEFAULT_RCOND) -> torch.Tensor:
    """float64 reference of `entangle_ext.project_orthogonal_` (in place on ``grads``).

    With g = cat(grads), v_i = cat(basis[i]): grads <- g - V^T c, c = (V V^T)^+ V g
    (method.md Stage 2 step 5), Gram and dots accumulated per tensor in float64.

    Args:
        grads: T tensors (any shapes, one device), modified in place (rounded once to their dtype).
        basis: k sequences of T tensors matching ``grads`` tensor by tensor (or k tensors when T == 1).
        rcond: relative eigenvalue cutoff of the row-normalised Gram (dimensionless).

    Returns:
        coeffs ``(k,)`` float64 on the device of ``grads``.

    Raises:
        Whatever the underlying PyTorch ops raise on mismatched shapes/devices (no extra checks).
    """
    grads = list(grads)
    rows = [[v] if isinstance(v, torch.Tensor) else list(v) for v in basis]
    k = len(rows)
    dev = grads[0].device
    G = torch.zeros(k, k, dtype=torch.float64, device=dev)
    b = torch.zeros(k, dtype=torch.float64, device=dev)
    for t, x in enumerate(grads):
        X = x.detach().reshape(-1).double()
        Vt = torch.stack([r[t].detach().reshape(-1).double() for r in rows])
        G += Vt @ Vt.T
        b += Vt @ X
    c = solve_coefficients(G, b, rcond)
    with torch.no_grad():
        for t, x in enumerate(grads):
            Vt = torch.stack([r[t].detach().reshape(-1).double() for r in rows])
            x.copy_((x.reshape(-1).double() - Vt.T @ c).reshape(x.shape))
    return c


def project_orthogonal_flat_composite(grads: Sequence[torch.Tensor], basis, *,
                                      rcond: float = DEFAULT_RCOND, ridge: float = 1e-12) -> torch.Tensor:
    """Plain-PyTorch flattened baseline: torch.cat -> matmul -> solve -> split back (in place).

    V = stack(cat(basis[i])) ``(k, P)`` and g = cat(grads) are materialised (copies), G = V V^T and
    V g are matmuls in the input dtype, the k x k system is solved in float64 with
    ``torch.linalg.solve`` and a tiny relative ridge (``ridge * trace(G)/k``, the reference
    recipe's approach), and g - V^T c is split back into ``grads``. ``rcond`` is unused (kept for
    a uniform signature). Returns c ``(k,)`` float64.
    """
    grads = list(grads)
    rows = [[v] if isinstance(v, torch.Tensor) else list(v) for v in basis]
    with torch.no_grad():
        g = torch.cat([x.reshape(-1) for x in grads])
        V = torch.stack([torch.cat([v.reshape(-1) for v in r]) for r in rows])
        G = (V @ V.T).double()
        b = (V @ g).double()
        k = G.shape[0]
        eye = torch.eye(k, dtype=torch.float64, device=G.device)
        c = torch.linalg.solve(G + ridge * (torch.trace(G) / k + 1e-300) * eye, b)
        out = g - V.T @ c.to(V.dtype)
        off = 0
        for x in grads:
            n = x.numel()
            x.copy_(out[off:off + n].view_as(x))
            off += n
    return c


def project_orthogonal_loop(grads: Sequence[torch.Tensor], basis, *,
                            rcond: float = DEFAULT_RCOND, ridge: float = 1e-12) -> torch.Tensor:
    """Per-parameter Python loop with float64 dots (the reference recipe's style), in place.

    G_ij = sum_t <basis[i][t], basis[j][t]> and b_i = sum_t <basis[i][t], grads[t]> in float64,
    ``torch.linalg.solve`` with a tiny relative ridge, then ``grads[t] -= sum_i c_i basis[i][t]``
    per tensor. ``rcond`` is unused. Returns c ``(k,)`` float64.
    """
    grads = list(grads)
    rows = [[v] if isinstance(v, torch.Tensor) else list(v) for v in basis]
    k = len(rows)
    with torch.no_grad():
        dev = grads[0].device
        G = torch.zeros(k, k, dtype=torch.float64, device=dev)
        b = torch.zeros(k, dtype=torch.float64, device=dev)
        for t, x in enumerate(grads):
            xd = x.double()
            vd = [r[t].double() for r in rows]
            for i in range(k):
                b[i] += (vd[i] * xd).sum()
                for j in range(i + 1):
                    G[i, j] += (vd[i] * vd[j]).sum()
        G = torch.tril(G) + torch.tril(G, -1).T
        eye = torch.eye(k, dtype=torch.float64, device=dev)
        c = torch.linalg.solve(G + ridge * (torch.trace(G) / k + 1e-300) * eye, b)
        for t, x in enumerate(grads):
            upd = sum(c[i] * rows[i][t].double() for i in range(k))
            x.sub_(upd.to(x.dtype))
    return c
