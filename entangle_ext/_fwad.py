"""Forward-mode AD (``torch.func.jvp`` / ``jacfwd``, ``torch.autograd.forward_ad`` dual tensors)
and the torch.func transforms.

The operators' registered autograd (the C++ autograd of `wasserstein2_1d`, the
``torch.library.register_autograd`` of the augmented-Lagrangian term) is reverse mode only: under
forward mode it used to give a zero / ``None`` tangent without an error, and it cannot run under
the torch.func transforms (``grad``, ``vjp``, ``jacrev``: torch raises a RuntimeError about
``setup_context``). The wrappers therefore check for tangents (`has_tangent`, cheap: nothing is
looked at when no dual level is open) and torch.func wrapper tensors (`under_transform`) and

* route `wasserstein2_1d`, `augmented_lagrangian_term` (and `project_orthogonal`, whose
  autograd.Function has a ``jvp``) through an autograd.Function with ``setup_context``, a ``jvp``
  and a vmap rule; its backward runs the operator's backward kernel through `FirstOrder`, whose
  own derivatives (second derivatives of the operator, by any nesting of transforms) raise
  NotImplementedError, as the registered autograd's double backward does;
* `refuse` (NotImplementedError) in the operators that are not differentiable
  (`dual_update_`, `project_orthogonal_`, `projection_gram`, `projection_apply_`,
  `projection_solve`), where a dropped tangent would otherwise read as a zero derivative.
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.autograd.forward_ad as fwAD

from ._wrappers import is_batched, loop_vmap, plain_of, transforms_active


def has_tangent(*tensors) -> bool:
    """True when any tensor argument (or tensor in a list/tuple argument) carries a forward-mode
    tangent at an open dual level (``make_dual``, ``torch.func.jvp``, ``jacfwd``)."""
    top = getattr(fwAD, "_current_level", 0)
    if top < 0:  # no dual level open: no tensor can have a tangent
        return False
    for t in _flatten(tensors):
        t = _unbatched(t)
        for level in range(top + 1):
            if fwAD.unpack_dual(t, level=level).tangent is not None:
                return True
    return False


def under_transform(*tensors) -> bool:
    """True when a tensor argument is a torch.func wrapper (``grad`` / ``vjp`` / ``jacrev`` /
    ``vmap`` / ``jvp`` levels): the operator's registered autograd cannot run under these, the
    autograd.Functions here can. One query when no transform is running; False while
    torch.compile traces (it traces the registered operator)."""
    if torch.compiler.is_compiling() or not transforms_active():
        return False
    f = torch._C._functorch   # (not functionalize's wrappers: the operators run under it as they are)
    return any(f.is_gradtrackingtensor(t) or f.is_batchedtensor(t) for t in _flatten(tensors))


def pre_step_value(g: torch.Tensor):
    """The plain value of ``g`` (detached) to keep beyond a torch.func transform (what
    `AugmentedLagrangian.penalty` records for ``update()``): under ``grad`` / ``jvp`` /
    ``functionalize`` the tensor under the wrappers (a wrapper must not outlive its transform);
    under ``vmap`` there is one g per batch entry and no single value, so a str saying so
    (``update()`` raises it)."""
    if torch.compiler.is_compiling() or not transforms_active():
        return g
    if is_batched(g):
        return ("AugmentedLagrangian.update: the last penalty() ran under torch.func.vmap (one g "
                "per batch entry, no single pre-step value); pass the constraint: update(g)")
    g = plain_of(g)
    if torch._is_functional_tensor(g):   # torch.func.functionalize's wrapper: its current value
        torch._sync(g)
        g = torch._from_functional_tensor(g)
    return g


def _unbatched(t: torch.Tensor) -> torch.Tensor:
    """The tensor under every ``torch.func.vmap`` layer of t (a BatchedTensor has no batching rule
    for ``_unpack_dual``; the tangent of ``jvp(vmap(f))`` lives on the tensor it wraps)."""
    f = torch._C._functorch
    while f.is_batchedtensor(t):
        t = f.get_unwrapped(t)
    return t


def _flatten(xs) -> Iterable[torch.Tensor]:
    for x in xs:
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, (list, tuple)):
            yield from _flatten(x)


def refuse(op: str, *tensors, hint: str = "") -> None:
    """Raise NotImplementedError when a tensor argument of ``op`` (an operator with no autograd, in
    either mode) carries a forward-mode tangent: its result would carry none, which reads as a zero
    derivative. ``hint``: appended to the message (e.g. the differentiable alternative)."""
    if has_tangent(*tensors):
        raise NotImplementedError(
            f"forward-mode AD (jvp/jacfwd/dual tensors) is not supported by entangle_ext.{op}: it is "
            "not differentiable in reverse mode either (no autograd), so its result would carry no "
            "tangent, which reads as a zero derivative; pass tensors without tangents (e.g. "
            "fwAD.unpack_dual(x).primal)" + hint)


def _segment_sum(x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Per-segment sums of the flat ``x`` (N,) with ``(S+1,)`` offsets; no host synchronisation.
    Elements outside [offsets[0], offsets[-1]) (malformed offsets, validate=False) are dropped."""
    S = offsets.shape[0] - 1
    pos = torch.arange(x.shape[-1], device=offsets.device, dtype=offsets.dtype)
    ids = torch.searchsorted(offsets[1:].contiguous(), pos, right=True)
    inside = (ids < S) & (pos >= offsets[0])
    src = torch.where(inside.to(x.device), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return x.new_zeros((S,)).index_add(0, ids.clamp(max=max(S - 1, 0)).to(x.device), src)


class FirstOrder(torch.autograd.Function):
    """``kernel(*args[:nargs])`` (an operator's backward kernel, or its tangent rule) as a function
    of ``args`` whose own derivatives raise NotImplementedError naming ``op``: the second
    derivatives of W2 and of the augmented-Lagrangian term are not implemented (outside torch.func,
    under plain forward AD, the tangent of the result is NaN instead: see ``jvp``). ``args[nargs:]``
    are the operator's inputs the result depends on through tensors saved without a derivative
    (W2's local gradients du, dv): passing them makes a second derivative reach the refusal
    instead of reading as zero. (A backward kernel called bare would also fail inside torch under
    the torch.func transforms: its registered autograd.)"""

    @staticmethod
    def forward(op, kernel, nargs, *args):
        with torch.no_grad():
            return kernel(*args[:nargs])

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.op = inputs[0]
        # what a NaN tangent (`jvp`) looks like; not the outputs themselves (ctx <-> output: a cycle)
        outs = output if isinstance(output, tuple) else (output,)
        ctx.like = (isinstance(output, tuple), [(o.shape, o.dtype, o.device) for o in outs])

    @staticmethod
    def _refuse(op):
        raise NotImplementedError(f"entangle_ext.{op}: second derivatives (double backward, hessian, "
                                  "jacfwd/jacrev of a gradient or of a tangent) are not implemented")

    @staticmethod
    def jvp(ctx, *tangents):
        if transforms_active():   # torch.func (jacfwd of a gradient or tangent): refuse
            FirstOrder._refuse(ctx.op)
        # Plain forward AD computes tangents eagerly, also of a gradient taken while a dual level is
        # open (dual input, then autograd.grad: a first-order use). That tangent would be a second
        # derivative: NaN, so that reading it cannot pass for a value.
        many, like = ctx.like
        nan = [torch.full(shape, float("nan"), dtype=dtype, device=device) for shape, dtype, device in like]
        return tuple(nan) if many else nan[0]

    @staticmethod
    def backward(ctx, *grads):
        FirstOrder._refuse(ctx.op)

    @staticmethod
    def vmap(info, in_dims, op, kernel, nargs, *args):
        return loop_vmap(FirstOrder.apply, info, in_dims, (op, kernel, nargs, *args), op)


def _w2_tangent(du, dv, uo, vo, tu, tv):
    t = None
    if tu is not None:
        t = _segment_sum(du * tu, uo)
    if tv is not None:
        tv_s = _segment_sum(dv * tv, vo)
        t = tv_s if t is None else t + tv_s
    return t


class W2Forward(torch.autograd.Function):
    """``entangle_ext::wasserstein2_1d`` with a forward-mode rule. The kernel returns the local
    gradients du = dW2^2_s/du, dv = dW2^2_s/dv, so the tangent of segment s is
    sum_{i in s} du_i tu_i + sum_{j in s} dv_j tv_j. Used only when an input carries a tangent or is
    a torch.func wrapper (the C++ autograd, which runs under neither, stays the fast path); its
    backward is the operator's backward kernel. Both rules go through `FirstOrder`, so a second
    derivative raises."""

    @staticmethod
    def vmap(info, in_dims, *args):
        return loop_vmap(W2Forward.apply, info, in_dims, args, "wasserstein2_1d")

    @staticmethod
    def forward(u, v, uo, vo, max_seqlen, validate):
        with torch.no_grad():
            w2, du, dv = torch.ops.entangle_ext.wasserstein2_1d(u, v, uo, vo, max_seqlen, True, True,
                                                                validate)
        return w2, du, dv

    @staticmethod
    def setup_context(ctx, inputs, output):
        u, v, uo, vo, _, _ = inputs
        _, du, dv = output
        ctx.mark_non_differentiable(du, dv)
        ctx.save_for_backward(du, dv, uo, vo, u, v)
        ctx.save_for_forward(du, dv, uo, vo, u, v)   # (not ctx attributes: du, dv are outputs, a cycle)

    @staticmethod
    def jvp(ctx, tu, tv, *_):
        du, dv, uo, vo, u, v = ctx.saved_tensors
        return FirstOrder.apply("wasserstein2_1d", _w2_tangent, 6, du, dv, uo, vo, tu, tv, u, v), None, None

    @staticmethod
    def backward(ctx, grad, _gdu, _gdv):
        du, dv, uo, vo, u, v = ctx.saved_tensors
        gu, gv = FirstOrder.apply("wasserstein2_1d", torch.ops.entangle_ext.wasserstein2_1d_backward,
                                  5, grad.contiguous(), du, dv, uo, vo, u, v)
        return (gu if ctx.needs_input_grad[0] else None, gv if ctx.needs_input_grad[1] else None,
                None, None, None, None)


def _al_tangent(g, lam, mu, tg, kind):
    slope = lam + mu * g
    if kind == "inequality":
        slope = slope.clamp(min=0)
    return (slope * tg).sum(-1)


class ALForward(torch.autograd.Function):
    """``entangle_ext::augmented_lagrangian`` with a forward-mode rule: the tangent is
    sum_i s_i t_i with s = lam + mu g (equality) or max(0, lam + mu g) (inequality), the gradient
    of the term; lam and mu are constants (no tangent flows from them, as no gradient does). Used
    when g carries a tangent or is a torch.func wrapper; both rules go through `FirstOrder`, so a
    second derivative raises (the jvp rule's own tangent once read g without its outer tangent:
    ``jacfwd(jacfwd(term))`` was zero instead of diag(mu))."""

    @staticmethod
    def vmap(info, in_dims, *args):
        return loop_vmap(ALForward.apply, info, in_dims, args, "augmented_lagrangian_term")

    @staticmethod
    def forward(g, lam, mu, kind):
        with torch.no_grad():
            return torch.ops.entangle_ext.augmented_lagrangian(g, lam, mu, kind)

    @staticmethod
    def setup_context(ctx, inputs, output):
        g, lam, mu, kind = inputs
        ctx.save_for_backward(g, lam, mu)
        ctx.fw = (g, lam, mu)
        ctx.kind = kind

    @staticmethod
    def jvp(ctx, tg, *_):
        g, lam, mu = ctx.fw
        return FirstOrder.apply("augmented_lagrangian_term", _al_tangent, 5, g, lam, mu, tg, ctx.kind, g)

    @staticmethod
    def backward(ctx, grad):
        g, lam, mu = ctx.saved_tensors
        gg = None
        if ctx.needs_input_grad[0]:
            gg = FirstOrder.apply("augmented_lagrangian_term",
                                  torch.ops.entangle_ext.augmented_lagrangian_backward,
                                  5, grad.contiguous(), g, lam, mu, ctx.kind)
        return gg, None, None, None
