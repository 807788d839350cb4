"""Pure-PyTorch references of the low-rank orthogonal projection (docs/algorithm.md §5).

``project_orthogonal`` / ``project_orthogonal_`` / ``projection_gram`` / ``projection_apply_`` /
``projection_solve`` are the float64 oracles of the operators of the same names in
`entangle_ext.projection`: same arguments, same results, same cutoff rule (row-normalised Gram
C = S (G + ridge I) S, eigenvalues <= rcond * max discarded, i.e.
``pinv(C, rtol=rcond, hermitian=True)``), computed entirely in float64 with plain PyTorch. Rows are
scaled by powers of two before the Gram is formed (exact; the result is scale-invariant), so rows of
any finite magnitude project correctly. They synchronise with the host on CUDA
(``torch.linalg.eigh``).

``project_orthogonal_flat_composite`` and ``project_orthogonal_loop`` are the plain-PyTorch
baselines of the benchmark (bench/bench_projection.py): what one writes without a fused kernel.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from ..projection import DEFAULT_RCOND

__all__ = ["project_orthogonal", "project_orthogonal_", "projection_gram", "projection_apply_",
           "projection_solve", "project_orthogonal_flat_composite", "project_orthogonal_loop",
           "solve_coefficients"]


def solve_coefficients(gram: torch.Tensor, vg: torch.Tensor, rcond: Optional[float] = None,
                       shift=0.0) -> torch.Tensor:
    """c = S C^+ S (V g) with C = S (G + shift) S, S = diag(1/sqrt(G_ii + shift_i)) (0 for a zero
    or non-finite diagonal).

    Args:
        gram: ``(k, k)`` Gram matrix V V^T (any float dtype; computed in float64).
        vg: ``(k,)`` products V g.
        rcond: relative eigenvalue cutoff of C (dimensionless); None: DEFAULT_RCOND.
        shift: a float or a ``(k,)`` tensor added to the diagonal of G.

    Returns:
        ``(k,)`` float64 coefficients c on the device of ``gram``.
    """
    rcond = DEFAULT_RCOND if rcond is None else rcond
    G = gram.double()
    b = vg.double()
    d = torch.diagonal(G) + torch.as_tensor(shift, dtype=torch.float64, device=G.device)
    active = (d > 0) & torch.isfinite(d)
    s = torch.where(active, d.clamp_min(torch.finfo(torch.float64).tiny).rsqrt(), torch.zeros_like(d))
    s0 = torch.where(active, s, torch.zeros_like(s))
    C = s0[:, None] * G * s0[None, :]
    C.diagonal().copy_(torch.where(active, s0 * s0 * d, torch.zeros_like(d)))
    w, Q = torch.linalg.eigh(C)
    cut = rcond * w.max().clamp_min(0)
    keep = (w > cut) & (w > 0)
    winv = torch.where(keep, 1.0 / torch.where(keep, w, torch.ones_like(w)), torch.zeros_like(w))
    y = Q @ (winv * (Q.T @ (s0 * b)))
    return s0 * y


def projection_solve(gram: torch.Tensor, vg: torch.Tensor, *, rcond: Optional[float] = None,
                     shift: float = 0.0) -> torch.Tensor:
    """float64 reference of `entangle_ext.projection_solve`: c = (G + shift I)^+ b, same rule."""
    return solve_coefficients(gram, vg, rcond, shift)


def _pow2(amax: torch.Tensor) -> torch.Tensor:
    _, e = torch.frexp(amax)
    s = torch.ldexp(torch.ones_like(amax), (-e).clamp(-1022, 1023))
    return torch.where((amax > 0) & torch.isfinite(amax), s, torch.ones_like(amax))


def _project(g: torch.Tensor, V: torch.Tensor, rcond, shift) -> Tuple[torch.Tensor, torch.Tensor]:
    """float64 g (P,), V (k, P) -> (g - V^T c, c), rows scaled by powers of two first."""
    if g.numel() == 0:
        k = V.shape[0]
        return g.clone(), torch.zeros(k, dtype=torch.float64, device=g.device)
    s = _pow2(V.abs().amax(dim=1))
    sg = _pow2(g.abs().max())
    Vs, gs = V * s[:, None], g * sg
    cs = solve_coefficients(Vs @ Vs.T, Vs @ gs, rcond, shift * s * s if shift else 0.0)
    return g - Vs.T @ (cs / sg), cs * s / sg


def project_orthogonal(g: torch.Tensor, basis, *, rcond: Optional[float] = None, ridge: float = 0.0
                       ) -> Tuple[torch.Tensor, torch.Tensor]:
    """float64 reference of `entangle_ext.project_orthogonal`: out = g - V^T c,
    c = (V V^T + ridge I)^+ V g.

    Args:
        g: ``(P,)`` tensor. basis: ``(k, P)`` tensor or sequence of k ``(P,)`` tensors.
        rcond: relative eigenvalue cutoff of the row-normalised Gram; None: DEFAULT_RCOND.
        ridge: >= 0 added to the Gram diagonal.

    Returns:
        ``(out, coeffs)``: out ``(P,)`` in the dtype of g, coeffs ``(k,)`` float64. Differentiable
        in g through plain autograd (V is detached).
    """
    V = basis if isinstance(basis, torch.Tensor) else torch.stack(list(basis))
    out, c = _project(g.double(), V.detach().double(), rcond, ridge)
    return out.to(g.dtype), c.detach()


def _kept(grads, basis):
    grads = list(grads)
    rows = [[v] if isinstance(v, torch.Tensor) else list(v) for v in basis]
    keep = [t for t, x in enumerate(grads) if x is not None]
    return [grads[t] for t in keep], [[r[t] for t in keep] for r in rows]


def _flat(tensors, device):
    if not tensors:
        return torch.zeros(0, dtype=torch.float64, device=device)
    return torch.cat([x.detach().reshape(-1).double() for x in tensors])


def projection_gram(grads: Sequence[Optional[torch.Tensor]], basis) -> Tuple[torch.Tensor, torch.Tensor]:
    """float64 reference of `entangle_ext.projection_gram`: (V V^T, V g) over the tensors given."""
    gs, rows = _kept(grads, basis)
    dev = gs[0].device if gs else "cpu"
    V = torch.stack([_flat(r, dev) for r in rows])
    return V @ V.T, V @ _flat(gs, dev)


def projection_apply_(grads: Sequence[Optional[torch.Tensor]], basis, coeffs: torch.Tensor) -> None:
    """float64 reference of `entangle_ext.projection_apply_`: grads[t] -= sum_i c_i basis[i][t]."""
    gs, rows = _kept(grads, basis)
    with torch.no_grad():
        for t, x in enumerate(gs):
            upd = sum(coeffs[i].double() * rows[i][t].double() for i in range(len(rows)))
            x.copy_((x.double() - upd).to(x.dtype))


def project_orthogonal_(grads: Sequence[Optional[torch.Tensor]], basis, *, rcond: Optional[float] = None,
                        ridge: float = 0.0, process_group=None) -> torch.Tensor:
    """float64 reference of `entangle_ext.project_orthogonal_` (in place on ``grads``).

    With g = cat(grads), v_i = cat(basis[i]) (``None`` gradients skipped with their basis entries):
    grads <- g - V^T c, c = (V V^T + ridge * T * I)^+ V g (docs/algorithm.md §5), T the number of
    non-None gradients.

    Args:
        grads: T tensors or None (any shapes, one device), modified in place (rounded once).
        basis: k sequences of T tensors matching ``grads`` tensor by tensor (or k tensors when T == 1).
        rcond: relative eigenvalue cutoff of the row-normalised Gram; None: DEFAULT_RCOND.
        ridge: >= 0 per tensor.

    Returns:
        coeffs ``(k,)`` float64 on the device of ``grads``.

        process_group: None only (the reference projects the tensors it is given; a sharded
            projection is the operator's).

    Raises:
        NotImplementedError: a ``process_group``.
        Whatever the underlying PyTorch ops raise on mismatched shapes/devices (no extra checks).
    """
    if process_group is not None:
        raise NotImplementedError("reference.project_orthogonal_ projects local tensors only: process_group "
                                  "must be None (use entangle_ext.project_orthogonal_ for sharded gradients)")
    gs, rows = _kept(grads, basis)
    dev = gs[0].device if gs else "cpu"
    V = torch.stack([_flat(r, dev) for r in rows])
    out, c = _project(_flat(gs, dev), V, rcond, ridge * len(gs))
    with torch.no_grad():
        off = 0
        for x in gs:
            n = x.numel()
            x.copy_(out[off:off + n].view(x.shape).to(x.dtype))
            off += n
    return c


def project_orthogonal_flat_composite(grads: Sequence[torch.Tensor], basis, *,
                                      rcond: Optional[float] = None, ridge: float = 1e-12) -> torch.Tensor:
    """Plain-PyTorch flattened baseline: torch.cat -> matmul -> solve -> split back (in place).

    V = stack(cat(basis[i])) ``(k, P)`` and g = cat(grads) are materialised (copies), G = V V^T and
    V g are matmuls in the input dtype, the k x k system is solved in float64 with
    ``torch.linalg.solve`` and a tiny relative ridge (``ridge * trace(G)/k``, a benchmark
    baseline's regulariser: the reference recipe adds an absolute 1e-8 per parameter tensor to the
    Gram diagonal, docs/algorithm.md §5), and g - V^T c is split back into ``grads``. ``rcond`` is unused (kept for
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
                            rcond: Optional[float] = None, ridge: float = 1e-12) -> torch.Tensor:
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
