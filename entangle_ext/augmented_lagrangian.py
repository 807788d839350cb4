"""Augmented-Lagrangian operators of Stage 1 (custom operators + autograd).

Stage 1 of Cheng, Liu, Li, Zhang, "Machine Unlearning under Retain-Forget Entanglement", ICLR 2026
(docs/algorithm.md §2) minimises -L_f(theta) subject to L_rem(theta) = L_rem(theta_0) with the
augmented Lagrangian

    loss = forget term + lam^T g + (mu/2) ||g||^2,        g = L_rem(batch) - c0,

followed by the dual (multiplier) step lam <- lam + mu g. Two operators implement it on the device
(CPU and CUDA kernels, no host sync on the CUDA path when ``check_finite=False``):

* `dual_update_`              - the in-place multiplier step (equality or inequality constraints);
* `augmented_lagrangian_term` - the penalty term, fused forward and backward kernels.

Inequality constraints use the convention g <= 0 (feasible when g_i <= 0, multipliers lam_i >= 0)
and the Rockafellar / Powell-Hestenes form of the term. The class `entangle_ext.AugmentedLagrangian`
(module `entangle_ext.lagrangian`) wraps both with the state of a run.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import _ext, _fwad
from ._augmented_lagrangian_args import (Scalar, as_g, as_mu, check_dual_args, check_fits, check_flag, check_kind,
                                         check_same_device, check_shapes, check_state_dtype, check_tensors)
from ._overlap import check_disjoint, refuse_transforms

__all__ = ["dual_update_", "augmented_lagrangian_term"]


def dual_update_(lam: torch.Tensor, g: torch.Tensor, mu: Scalar, *, kind: str = "equality",
                 lam_min: Optional[float] = None, lam_max: Optional[float] = None,
                 damping: float = 0.0, check_finite: bool = True) -> torch.Tensor:
    """Augmented-Lagrangian multiplier step, in place on the device of ``lam``; returns ``lam``.

    For every constraint i (docs/algorithm.md §6), with t_i the unclipped step:

        equality:    t_i = (1 - damping) * lam_i + mu_i * g_i
        inequality:  t_i = max(0, (1 - damping) * lam_i + mu_i * g_i)     (convention g_i <= 0)
        lam_i <- min(max(t_i, lam_min), lam_max)                          (bounds optional)

    With ``damping = 0`` this is the method's lam <- lam + mu g (equality) and the classical
    projected step for inequalities. ``damping`` in [0, 1] is a leak of the multiplier toward 0 at
    every step: under a persistent constraint bias b (minibatch noise) lam settles at mu b / damping
    instead of drifting without bound. Bounds are applied after the projection.

    Args:
        lam: ``(m,)`` float32/float64 contiguous multipliers (CPU or CUDA); updated in place.
            Keep them in float32 even for a float16/bfloat16 model (a half lam is a TypeError).
            It must not require grad (the update is not differentiable), nor share memory with
            g or mu. m = 0 is a no-op. Its version counter is bumped, as by ATen's in-place ops:
            a backward through a term that saved lam before this step raises RuntimeError.
        g: ``(m,)`` constraint values, same device as ``lam`` and its dtype, or float16/bfloat16
            (upcast to the dtype of lam); a 0-d tensor is accepted when m = 1. Units of the
            constraint (for Stage 1: nats, a cross-entropy difference). Detached; never
            differentiated through.
        mu: penalty, ``()`` or ``(m,)`` tensor (a ``(1,)`` mu for m > 1 is a ValueError, not
            broadcast), same dtype/device as ``lam``, units 1/[g] (lam has the units of mu * g);
            a Python float or a CPU tensor must be > 0 (checked on the host in eager calls, not
            while torch.compile traces; NaN/Inf are left to ``check_finite``). A Python float is
            converted to a device tensor with ``torch.full``; inside a captured CUDA graph that
            value is then frozen, so a schedule that changes mu between replays must pass a
            tensor and update it in place.
        kind: ``"equality"`` or ``"inequality"``.
        lam_min, lam_max: optional clipping bounds (floats), lam_min <= lam_max; lam_min = +inf
            and lam_max = -inf are refused (no value satisfies them), lam_min = -inf and
            lam_max = +inf are no bound; for inequality constraints lam_max >= 0.
        damping: leak in [0, 1] (see above).
        check_finite: raise ValueError (lam left unchanged) when g or mu contains NaN/Inf. On CPU
            the check is free. On CUDA it reads one flag back to the host (a synchronisation) and
            raises RuntimeError during CUDA-graph capture; pass ``check_finite=False`` there: the
            kernel then keeps lam_i unchanged for every entry whose g_i or mu_i is non-finite
            (device-side select), so a bad minibatch can never poison the multipliers.

    Overflow: only g and mu are checked, not the result, so a step t_i beyond the range of the
    dtype of lam (|t_i| > ~1.8e308 in float64, ~3.4e38 in float32) from finite g and mu sets
    lam_i to +-inf without an error; the penalty term is then inf/NaN, which a NaN check of the
    loss sees. A finite lam_min / lam_max clips it to the bound instead.

    Returns:
        ``lam`` (the same tensor, updated).

    Raises:
        TypeError: non-tensor lam/g, non-float32/64 lam, dtype mismatch between lam, g (other
            than a float16/bfloat16 g) and mu, non-float bounds or damping, a check_finite that
            is not a bool.
        ValueError: shape mismatch (lam not (m,), g not (m,), mu not () or (m,)), non-contiguous
            lam, device mismatch (a meta tensor among real ones too), lam sharing memory with g or
            mu (eager calls; not checked while torch.compile traces), unknown kind, damping
            outside [0, 1], lam_min > lam_max, a NaN bound, lam_min = +inf, lam_max = -inf,
            lam_max < 0 for inequality, mu <= 0 (Python float or CPU tensor, eager calls), a
            Python-float mu beyond the range of lam's dtype (e.g. 1e39 for float32 lam, or an
            integer beyond the float range such as 10**400), lam_min above or lam_max below the range of lam's dtype (e.g. 1e300
            for float32 lam: it would become Inf; eager calls), non-finite g or mu (with
            check_finite; lam unchanged).
        RuntimeError: extension not loaded / CUDA tensor with a CPU-only build / lam requires grad
            / check_finite=True during CUDA-graph capture / a torch.func wrapper tensor (called
            under ``torch.func.vmap``, ``grad``, ``functionalize``: an in-place step without
            autograd, batching or functionalization rule).
        NotImplementedError: lam, g or mu carries a forward-mode tangent (``torch.func.jvp``,
            ``jacfwd``, dual tensors): the step is not differentiable, in either mode.
    """
    op = "dual_update_"
    check_tensors(op, lam=lam, g=g)
    _fwad.refuse(op, lam, g, mu)   # an in-place state update: no autograd in either mode
    refuse_transforms(op, lam, g, mu)
    check_state_dtype(op, "lam", lam.dtype)
    lam_min, lam_max, damping = check_dual_args(op, kind, lam_min, lam_max, damping)
    check_fits(op, lam.dtype, lam_min=lam_min, lam_max=lam_max)
    check_finite = check_flag(op, "check_finite", check_finite)
    if lam.requires_grad:
        raise RuntimeError(f"{op}: lam requires grad; multipliers are constants (use a tensor "
                           "created without requires_grad, or lam.detach())")
    mu_t = as_mu(op, mu, lam, finite=False)
    g = as_g(op, g.detach(), lam)
    check_shapes(op, lam, g, mu_t)
    check_same_device(op, lam, g=g, mu=mu_t)
    check_disjoint(op, [lam], [g, mu_t], lambda i: "lam", ("g", "mu").__getitem__)
    _ext.require(op, lam, g, mu_t)
    torch.ops.entangle_ext.dual_update_(lam, g, mu_t, kind, lam_min, lam_max, damping,
                                        bool(check_finite))
    return lam


def augmented_lagrangian_term(g: torch.Tensor, lam: torch.Tensor, mu: Scalar, *,
                              kind: str = "equality") -> torch.Tensor:
    """The augmented-Lagrangian penalty term, a 0-d tensor differentiable with respect to ``g``.

        equality:    sum_i lam_i g_i + (mu_i / 2) g_i^2
        inequality:  sum_i (1 / (2 mu_i)) (max(0, lam_i + mu_i g_i)^2 - lam_i^2)   (g_i <= 0 feasible)

    The inequality form (Rockafellar; Powell-Hestenes) is evaluated without dividing by mu where the
    constraint is active (lam_i + mu_i g_i > 0, term = lam_i g_i + mu_i g_i^2 / 2) and as
    -lam_i^2 / (2 mu_i) elsewhere (0 when lam_i = 0). Gradient with respect to g (fused backward
    kernel): equality lam + mu g; inequality max(0, lam + mu g). lam and mu are constants: no
    gradient flows to them (they are detached). Forward mode (``torch.func.jvp``, ``jacfwd``,
    dual tensors) works: the tangent is sum_i s_i t_i with s the gradient above (no tangent flows
    from lam or mu). So do the torch.func reverse-mode transforms (``grad``, ``vjp``, ``jacrev``,
    ``functional_call`` + ``grad``, ``vmap`` of them: one kernel call per batch entry; in eager
    mode: transforms inside ``torch.compile`` are not supported). Second
    derivatives (double backward, ``hessian``, any nesting of ``jacfwd`` / ``jacrev``) are not
    implemented: NotImplementedError.

    Args:
        g: ``(m,)`` constraint values (CPU or CUDA), usually requiring grad, in the dtype of
            ``lam``; a float16/bfloat16 g (the loss of a half-precision model) is upcast to the
            dtype of lam first (``g.to(lam.dtype)``: the gradient flows back to the half g). A
            0-d tensor is accepted when m = 1. Units of the constraint. m = 0 is valid: the term
            is 0 and, when g requires grad, connected to the graph (empty gradient), like
            ``g.sum()``.
        lam: ``(m,)`` float32/float64 multipliers, on the device of g (float32 even for a
            half-precision model: a half lam is a TypeError).
        mu: ``()`` or ``(m,)`` tensor (a ``(1,)`` mu for m > 1 is a ValueError, not broadcast),
            same dtype/device as lam, or a Python float (converted; see `dual_update_` for the
            CUDA-graph caveat). A Python float or a CPU tensor must be finite and > 0
            (ValueError) in eager calls; a CUDA tensor is not checked (that would need a device
            sync), nor is any mu while torch.compile traces (the check would break the graph or
            specialise it on the value): there a zero, negative or non-finite mu gives a wrong or
            NaN/Inf term without an error (`AugmentedLagrangian` checks its mu when it is set).
        kind: ``"equality"`` or ``"inequality"``.

    Returns:
        ``()`` tensor, dtype of lam (= that of g unless g was upcast), device of g, units of
        lam * g.

    Raises:
        TypeError: non-tensor inputs, a lam that is not float32/float64, a g of another dtype
            than lam other than float16/bfloat16, a mu of another dtype than lam.
        ValueError: shape or device mismatch (lam not (m,), g not (m,), mu not () or (m,); a
            meta tensor among real ones), unknown kind, a non-finite or non-positive mu (Python
            float or CPU tensor, eager calls).
        RuntimeError: extension not loaded, or a CUDA tensor with a CPU-only build.
        NotImplementedError: (when differentiated) a second derivative.
    """
    op = "augmented_lagrangian_term"
    check_tensors(op, g=g, lam=lam)
    check_state_dtype(op, "lam", lam.dtype)
    check_kind(op, kind)
    mu_t = as_mu(op, mu, lam, finite=True)
    g = as_g(op, g, lam)
    lam_c = lam.detach().contiguous()
    check_shapes(op, lam_c, g, mu_t)
    check_same_device(op, lam_c, g=g, mu=mu_t)
    _ext.require(op, g, lam_c, mu_t)
    if _fwad.has_tangent(g) or _fwad.under_transform(g):
        # forward mode (jvp/jacfwd/dual) or torch.func (grad/vjp/jacrev/vmap): the registered autograd runs under neither
        return _fwad.ALForward.apply(g, lam_c, mu_t.detach(), kind)
    return torch.ops.entangle_ext.augmented_lagrangian(g, lam_c, mu_t, kind)


# ---------------------------------------------------------------------------------------------
# torch.library registrations: fake (meta) kernels and autograd.
# ---------------------------------------------------------------------------------------------
# The fake kernels also run when any argument is a meta tensor: they check, as the C++ kernels
# do and with their messages, that every tensor is on the device of lam.
def _fake_dual_update(lam, g, mu, kind, lam_min, lam_max, damping, check_finite):
    check_same_device("dual_update_", lam, g=g, mu=mu)
    return None


def _fake_al(g, lam, mu, kind):
    check_same_device("augmented_lagrangian", lam, g=g, mu=mu)
    return g.new_empty(())


def _fake_al_backward(grad, g, lam, mu, kind):
    check_same_device("augmented_lagrangian_backward", lam, g=g, mu=mu, grad=grad)
    return torch.empty_like(g)


def _al_setup_context(ctx, inputs, output):
    g, lam, mu, kind = inputs
    ctx.save_for_backward(g, lam, mu)
    ctx.kind = kind


def _al_backward(ctx, grad):
    # one reverse rule for the registered op and its forward-mode Function (_fwad.ALForward)
    return _fwad.ALForward.backward(ctx, grad)


def _al_double_backward(ctx, *grads):
    raise NotImplementedError("entangle_ext.augmented_lagrangian_term: double backward (second "
                              "derivatives of the augmented-Lagrangian term) is not implemented")


def _noop_setup(ctx, inputs, output):
    pass


if _ext.available():
    torch.library.register_fake("entangle_ext::dual_update_")(_fake_dual_update)
    torch.library.register_fake("entangle_ext::augmented_lagrangian")(_fake_al)
    torch.library.register_fake("entangle_ext::augmented_lagrangian_backward")(_fake_al_backward)
    torch.library.register_autograd("entangle_ext::augmented_lagrangian", _al_backward,
                                    setup_context=_al_setup_context)
    torch.library.register_autograd("entangle_ext::augmented_lagrangian_backward",
                                    _al_double_backward, setup_context=_noop_setup)
