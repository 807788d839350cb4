"""Registrations of the projection operators (`entangle_ext.projection`): their fake (meta)
kernels for torch.compile / FakeTensor (they also run when any argument is a meta tensor, so they
check, as the C++ kernels do, that every tensor is on one device), the autograd rule of the fused
flat operator, and `ProjectOrthogonalFunction`, the same rule as a ``torch.autograd.Function`` for
the torch.func transforms. Imported by ``projection.py``; importing it registers them once per
process."""
from __future__ import annotations

import torch

from . import _ext
from ._wrappers import loop_vmap

__all__ = ["ProjectOrthogonalFunction"]


# ---------------------------------------------------------------------------------------------
# torch.library registrations: fake (meta) kernels and autograd.
# ---------------------------------------------------------------------------------------------
def _same_device_lists(op, grads, basis, **vectors):
    """The device checks of the C++ kernels (csrc/projection.h), with their messages: the fake
    kernel is what runs when one argument is a meta tensor, so without them a meta tensor among
    CPU tensors would be a silent no-op. None vectors (optional scale) are skipped."""
    T = len(grads)
    if T == 0:
        return
    dev = grads[0].device
    for t, x in enumerate(grads):
        if x.device != dev:
            raise ValueError(f"{op}: grads[{t}] is on {x.device} but grads[0] is on {dev}")
    for r, v in enumerate(basis):
        if v.device != dev:
            raise ValueError(f"{op}: basis[{r // T}][{r % T}] is on {v.device} but grads are on {dev}")
    for name, x in vectors.items():
        if x is not None and x.device != dev:
            raise ValueError(f"{op}: {name} is on {x.device} but the tensors are on {dev}")


def _fake_flat(g, basis, rcond=None, ridge=0.0):
    if basis.device != g.device:   # as the C++ kernel (a meta basis would reach this kernel)
        raise ValueError(f"project_orthogonal: g is on {g.device} but basis is on {basis.device}")
    return torch.empty_like(g), g.new_empty((basis.shape[0],), dtype=torch.float64)


def _fake_inplace(grads, basis, rcond=None, ridge=0.0):
    _same_device_lists("project_orthogonal_", grads, basis)
    k = len(basis) // max(len(grads), 1)
    return grads[0].new_empty((k,), dtype=torch.float64)


def _fake_gram(grads, basis, scale=None):
    _same_device_lists("projection_gram", grads, basis, scale=scale)
    k = len(basis) // max(len(grads), 1)
    return (grads[0].new_empty((k, k), dtype=torch.float64),
            grads[0].new_empty((k,), dtype=torch.float64))


def _fake_apply(grads, basis, coeffs, scale=None):
    _same_device_lists("projection_apply_", grads, basis, coeffs=coeffs, scale=scale)
    return None


def _fake_solve(gram, vg, rcond=None, shift=0.0):
    if vg.device != gram.device:
        raise ValueError(f"projection_solve: vg is on {vg.device} but the tensors are on {gram.device}")
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
    ``setup_context`` and a vmap rule, so that the torch.func transforms (grad, vjp, jacrev,
    jacfwd, hessian, functional_call + grad, vmap of a gradient) work on `project_orthogonal` too.

    The vmap rule runs the Function once per batch entry. (torch's generated rule,
    ``generate_vmap_rule = True``, fails under forward mode inside vmap (``jacfwd``, ``hessian``)
    with an internal AssertionError, because the rcond/ridge arguments are not tensors.)"""

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
    def vmap(info, in_dims, g, basis, rcond, ridge):
        return loop_vmap(ProjectOrthogonalFunction.apply, info, in_dims, (g, basis, rcond, ridge),
                         "project_orthogonal")

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
