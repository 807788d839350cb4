"""Registrations of the projection operators (`entangle_ext.projection`): their fake (meta)
kernels for torch.compile / FakeTensor, the autograd rule of the fused flat operator, and
`ProjectOrthogonalFunction`, the same rule as a ``torch.autograd.Function`` for the torch.func
transforms. Imported by ``projection.py``; importing it registers them once per process."""
from __future__ import annotations

import torch

from . import _ext

__all__ = ["ProjectOrthogonalFunction"]


# ---------------------------------------------------------------------------------------------
# torch.library registrations: fake (meta) kernels and autograd.
# ---------------------------------------------------------------------------------------------
def _fake_flat(g, basis, rcond=None, ridge=0.0):
    return torch.empty_like(g), g.new_empty((basis.shape[0],), dtype=torch.float64)


def _fake_inplace(grads, basis, rcond=None, ridge=0.0):
    k = len(basis) // max(len(grads), 1)
    return grads[0].new_empty((k,), dtype=torch.float64)


def _fake_gram(grads, basis, scale=None):
    k = len(basis) // max(len(grads), 1)
    return (grads[0].new_empty((k, k), dtype=torch.float64),
            grads[0].new_empty((k,), dtype=torch.float64))


def _fake_apply(grads, basis, coeffs, scale=None):
    return None


def _fake_solve(gram, vg, rcond=None, shift=0.0):
    return vg.new_empty((gram.shape[0],), dtype=torch.float64)


def _setup_context(ctx, inputs, output):
    _, basis, rcond, ridge = inputs
    ctx.save_for_backward(basis)
    ctx.rcond, ctx.ridge = rcond, ridge
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, grad_out, _grad_coeffs):
    (basis,) = ctx.saved_tensors
    grad_g = None
    if ctx.needs_input_grad[0]:
        # I - V^T (V V^T + ridge I)^+ V is symmetric: the vector-Jacobian product is the projection.
        grad_g, _ = torch.ops.entangle_ext.project_orthogonal(grad_out.contiguous(), basis,
                                                              ctx.rcond, ctx.ridge)
    return grad_g, None, None, None


class ProjectOrthogonalFunction(torch.autograd.Function):
    """The fused operator with the same autograd as its registration, as an autograd.Function with
    ``setup_context`` and a generated vmap rule, so that the torch.func transforms (grad, vjp,
    jacrev, functional_call + grad, vmap of a gradient) work on `project_orthogonal` too."""
    generate_vmap_rule = True

    @staticmethod
    def forward(g, basis, rcond, ridge):
        with torch.no_grad():   # the Function records the graph; not the operator's own autograd
            return torch.ops.entangle_ext.project_orthogonal(g, basis, rcond, ridge)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _setup_context(ctx, inputs, output)
        ctx.basis = inputs[1]   # for jvp (a constant: detached by project_orthogonal)

    @staticmethod
    def jvp(ctx, tg, _tbasis, _trcond, _tridge):
        # linear in g with the basis constant: the tangent of out is the projection of the tangent
        tout, _ = ProjectOrthogonalFunction.apply(tg.contiguous(), ctx.basis, ctx.rcond, ctx.ridge)
        return tout, None

    @staticmethod
    def backward(ctx, grad_out, _grad_coeffs):
        (basis,) = ctx.saved_tensors
        grad_g = None
        if ctx.needs_input_grad[0]:   # symmetric map: the VJP is the projection (differentiable again)
            grad_g, _ = ProjectOrthogonalFunction.apply(grad_out.contiguous(), basis, ctx.rcond, ctx.ridge)
        return grad_g, None, None, None


if _ext.available():
    for _name, _fake in (("project_orthogonal", _fake_flat), ("project_orthogonal_", _fake_inplace),
                         ("projection_gram", _fake_gram), ("projection_apply_", _fake_apply),
                         ("projection_solve", _fake_solve)):
        torch.library.register_fake(f"entangle_ext::{_name}")(_fake)
    torch.library.register_autograd("entangle_ext::project_orthogonal", _backward,
                                    setup_context=_setup_context)
