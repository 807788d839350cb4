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

import math

from typing import Optional, Union

import torch

from . import _ext

__all__ = ["dual_update_", "augmented_lagrangian_term"]

_KINDS = ("equality", "inequality")
Scalar = Union[torch.Tensor, float, int]


def _check_kind(op: str, kind: str) -> None:
    if kind not in _KINDS:
        raise ValueError(f"{op}: kind must be 'equality' or 'inequality', got {kind!r}")


def _as_mu(op: str, mu: Scalar, lam: torch.Tensor) -> torch.Tensor:
    """mu as a tensor. A Python number or a CPU tensor must be > 0 (ValueError); a CUDA tensor is
    not checked here (that would cost a host sync). Non-finite mu is handled by the kernels."""
    if isinstance(mu, torch.Tensor):
        if mu.device.type == "cpu" and mu.is_floating_point() and bool(((mu <= 0) & torch.isfinite(mu)).any()):
            raise ValueError(f"{op}: the penalty mu must be > 0, got {mu.tolist()}")
        return mu.detach().contiguous()
    if isinstance(mu, bool) or not isinstance(mu, (float, int)):
        raise TypeError(f"{op}: mu must be a tensor or a Python float, got {type(mu).__name__}")
    if math.isfinite(mu) and mu <= 0:   # non-finite mu: the kernels' own policy
        raise ValueError(f"{op}: the penalty mu must be > 0, got {mu}")
    # torch.full is a device fill (capturable), but the value is baked into a captured CUDA graph.
    return torch.full((), float(mu), dtype=lam.dtype, device=lam.device)


def _check_tensors(op: str, **named) -> None:
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")


def _check_same_device(op: str, lam: torch.Tensor, **named) -> None:
    for name, t in named.items():
        if t.device != lam.device:
            raise ValueError(f"{op}: lam is on {lam.device} but {name} is on {t.device} "
                             "(all tensors must be on one device)")


def _as_g(op: str, g: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    # A scalar constraint value (e.g. a mean loss minus c0) is accepted for m = 1.
    if g.dim() == 0 and lam.dim() == 1 and lam.shape[0] == 1:
        g = g.reshape(1)
    return g.contiguous()


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
            It must not require grad (the update is not differentiable). m = 0 is a no-op.
        g: ``(m,)`` constraint values, same dtype and device as ``lam`` (a 0-d tensor is accepted
            when m = 1). Units of the constraint (for Stage 1: nats, a cross-entropy difference).
            Detached; never differentiated through.
        mu: penalty, ``()`` or ``(m,)`` tensor, same dtype/device as ``lam``, units 1/[g]
            (lam has the units of mu * g). A Python float is converted to a device tensor with
            ``torch.full``; inside a captured CUDA graph that value is then frozen, so a schedule
            that changes mu between replays must pass a tensor and update it in place.
        kind: ``"equality"`` or ``"inequality"``.
        lam_min, lam_max: optional clipping bounds (floats), lam_min <= lam_max; for inequality
            constraints lam_max >= 0.
        damping: leak in [0, 1] (see above).
        check_finite: raise ValueError (lam left unchanged) when g or mu contains NaN/Inf. On CPU
            the check is free. On CUDA it reads one flag back to the host (a synchronisation) and
            raises RuntimeError during CUDA-graph capture; pass ``check_finite=False`` there: the
            kernel then keeps lam_i unchanged for every entry whose g_i or mu_i is non-finite
            (device-side select), so a bad minibatch can never poison the multipliers.

    Returns:
        ``lam`` (the same tensor, updated).

    Raises:
        TypeError: non-tensor lam/g, non-float32/64 lam, dtype mismatch between lam, g and mu.
        ValueError: shape mismatch (g not (m,), mu not () or (m,)), non-contiguous lam, device
            mismatch, unknown kind, damping outside [0, 1], lam_min > lam_max, lam_max < 0 for
            inequality, non-finite g or mu (with check_finite; lam unchanged).
        RuntimeError: extension not loaded / CUDA tensor with a CPU-only build / lam requires grad
            / check_finite=True during CUDA-graph capture.
    """
    op = "dual_update_"
    _check_tensors(op, lam=lam, g=g)
    _check_kind(op, kind)
    if lam.requires_grad:
        raise RuntimeError(f"{op}: lam requires grad; multipliers are constants (use a tensor "
                           "created without requires_grad, or lam.detach())")
    mu_t = _as_mu(op, mu, lam)
    g = _as_g(op, g.detach(), lam)
    _check_same_device(op, lam, g=g, mu=mu_t)
    _ext.require(op, lam, g, mu_t)
    torch.ops.entangle_ext.dual_update_(
        lam, g, mu_t, kind, None if lam_min is None else float(lam_min),
        None if lam_max is None else float(lam_max), float(damping), bool(check_finite))
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
    gradient flows to them (they are detached). Double backward is not implemented.

    Args:
        g: ``(m,)`` float32/float64 constraint values (CPU or CUDA), usually requiring grad; a 0-d
            tensor is accepted when m = 1. Units of the constraint. m = 0 is valid: the term is 0
            and, when g requires grad, connected to the graph (empty gradient), like ``g.sum()``.
        lam: ``(m,)`` multipliers, same dtype and device as g.
        mu: ``()`` or ``(m,)`` tensor, same dtype/device, or a Python float (converted; see
            `dual_update_` for the CUDA-graph caveat). Must be > 0 for ``kind="inequality"``.
        kind: ``"equality"`` or ``"inequality"``.

    Returns:
        ``()`` tensor, dtype and device of g, units of lam * g.

    Raises:
        TypeError: non-tensor or non-float32/64 inputs, dtype mismatch.
        ValueError: shape or device mismatch, unknown kind.
        RuntimeError: extension not loaded, or a CUDA tensor with a CPU-only build.
    """
    op = "augmented_lagrangian_term"
    _check_tensors(op, g=g, lam=lam)
    _check_kind(op, kind)
    mu_t = _as_mu(op, mu, lam)
    g = _as_g(op, g, lam)
    lam_c = lam.detach().contiguous()
    _check_same_device(op, lam_c, g=g, mu=mu_t)
    _ext.require(op, g, lam_c, mu_t)
    return torch.ops.entangle_ext.augmented_lagrangian(g, lam_c, mu_t, kind)


# ---------------------------------------------------------------------------------------------
# torch.library registrations: fake (meta) kernels and autograd.
# ---------------------------------------------------------------------------------------------
def _fake_dual_update(lam, g, mu, kind, lam_min, lam_max, damping, check_finite):
    return None


def _fake_al(g, lam, mu, kind):
    return g.new_empty(())


def _fake_al_backward(grad, g, lam, mu, kind):
    return torch.empty_like(g)


def _al_setup_context(ctx, inputs, output):
    g, lam, mu, kind = inputs
    ctx.save_for_backward(g, lam, mu)
    ctx.kind = kind


def _al_backward(ctx, grad):
    g, lam, mu = ctx.saved_tensors
    gg = None
    if ctx.needs_input_grad[0]:
        gg = torch.ops.entangle_ext.augmented_lagrangian_backward(grad.contiguous(), g, lam, mu,
                                                                  ctx.kind)
    return gg, None, None, None


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
