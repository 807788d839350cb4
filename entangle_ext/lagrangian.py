"""`AugmentedLagrangian`: the multiplier state of Stage 1 (equality/inequality constraints).

Stage 1 of the method (docs/algorithm.md §2) minimises -L_f(theta) subject to L_rem(theta) = c0 with
c0 = L_rem(theta_0) pinned once. This class owns everything that is not the model: the multipliers
lam, the penalty mu (with an optional growth schedule), the pinned values c0 and the last
violation, all as device tensors that are updated in place, so a whole training step that calls
`penalty` and `update` can be captured in a CUDA graph and replayed without host synchronisation.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Union

import torch

from ._augmented_lagrangian_args import (CLASS as _OP, as_c0, as_state_mu, check_dual_args, check_fits,
                                         check_mu_max, check_state_dtype, checked_state, schedule_args,
                                         state_dtype)
from ._al_schedule import NO_MEASUREMENT, schedule_step
from ._fwad import plain_of, pre_step_value
from .augmented_lagrangian import augmented_lagrangian_term, dual_update_

__all__ = ["AugmentedLagrangian"]

_STATE_VERSION = 1


class AugmentedLagrangian:
    r"""Augmented-Lagrangian multipliers, penalty and schedule for m constraints (Stage 1).

    Per training step (docs/algorithm.md §2, §6), with g = values - c0 (shape ``(m,)``)::

        loss = forget_term + al.penalty(g)   # lam^T g + (mu/2)||g||^2 (equality), see below
        loss.backward(); optimizer.step()
        al.update(...)                        # lam <- lam + mu g   (dual step, on the device)

    ``kind="equality"`` pins the constraints (the method: L_rem(theta) = L_rem(theta_0));
    ``kind="inequality"`` uses the convention g <= 0 (e.g. L_rem(theta) <= c0), multipliers
    lam >= 0, the Rockafellar / Powell-Hestenes term sum (1/(2 mu)) (max(0, lam + mu g)^2 - lam^2)
    and the projected step lam <- max(0, lam + mu g). See `entangle_ext.dual_update_` for damping
    and the clipping bounds, `entangle_ext.augmented_lagrangian_term` for the term.

    **Pre-step vs post-step dual update** (``update_with``). The reference implementation updates
    the multipliers with the g it computed *before* ``optimizer.step()`` (the same minibatch value
    that entered the loss); the paper's text re-evaluates g *after* the step, at the new
    parameters. Both are supported:

    * ``update_with="pre"`` (default, the reference code): ``al.update()`` with no argument uses
      the g last passed to `penalty` (detached); ``al.update(g)`` uses an explicit g. Passing a
      ``closure`` is an error in this mode.
    * ``update_with="post"`` (the paper): after ``optimizer.step()`` call
      ``al.update(closure=fn)``, where ``fn()`` re-evaluates the constraint *values* (e.g. the
      remote mean CE of the same minibatch) at the new parameters; it runs under
      ``torch.no_grad()`` and g = fn() - c0. Alternatively pass the re-evaluated g yourself:
      ``al.update(g_post)``. ``al.update()`` with no argument raises ValueError in this mode (it
      would silently fall back to the pre-step value). The post variant costs one extra forward.

    **Penalty schedule** (off unless ``mu_growth > 1``): the classical rule "grow mu when the
    violation does not shrink". Every ``schedule_every`` dual updates, per constraint, the mean |g|
    over the window's *finite* entries (a non-finite g, which gets here with ``check_finite=False``,
    e.g. in a CUDA graph, is left out of the sum and the count: not a 0) is the measurement (a scalar
    mu: the max over the constraints that have one). If it is > ``shrink_ratio`` times the previous
    measurement, mu <- min(mu * mu_growth, mu_max) (mu never decreases; the first one has nothing to
    compare with). A window without a finite entry (for a constraint) has none: mu stays and the
    next window is compared with the last measured one. Tensor ops only (device step and entry
    counters, ``torch.where``), so it keeps working inside a replayed CUDA graph. With minibatch
    estimates of g, use a window of many steps (e.g. 50) so that noise does not trigger growth.

    Args:
        c0: pinned reference values, a ``()`` or ``(m,)`` tensor or a float (e.g. the mean CE of
            the original model over the whole remote train set, in nats). m = c0.numel() >= 1:
            a run without a constraint is refused up front (the operators themselves accept
            m = 0). Detached and copied.
        mu: initial penalty, finite and > 0, float or ``()`` / ``(m,)`` tensor (copied; method
            default 10).
        kind: ``"equality"`` or ``"inequality"``.
        update_with: ``"pre"`` or ``"post"`` (see above).
        lam_min, lam_max, damping: passed to `dual_update_` (checked here, with its messages).
        mu_growth, shrink_ratio, mu_max, schedule_every: the penalty schedule (see above);
            mu_growth finite and >= 1 (default 1: no schedule), mu_max finite and > 0 (default
            1e6).
        check_finite: passed to `dual_update_`. ``None`` (default): True eagerly, False while a
            CUDA graph is being captured (non-finite entries then leave lam unchanged on the
            device instead of raising).
        device, dtype: of the state tensors, dtype float32 or float64; default: those of c0 if
            it is a floating tensor, else CPU and the default dtype, with float16/bfloat16 raised
            to float32 (lam, mu and c0 stay in full precision whatever the model dtype;
            `constraint` and `penalty` take the half-precision loss of such a model).

    Attributes:
        lam: ``(m,)`` multipliers (zeros at start), updated in place.
        mu: penalty tensor, ``()`` or ``(m,)``, updated in place by the schedule. Assigning a float
            or tensor to ``al.mu`` copies it in place (checked like the constructor's mu).
        c0: ``(m,)`` pinned values.

    Raises (constructor), before anything has run, so never after an optimizer step:
        ValueError: an unknown kind/update_with; an empty, non-finite or >1-D c0, a c0 or
            ``device`` on the meta device (no data); mu not finite and
            > 0 (float or tensor; a CUDA tensor is checked too, one host sync, except during
            CUDA-graph capture) or of a shape other than () and (m,); damping outside [0, 1];
            lam_min > lam_max; a NaN bound, lam_min = +inf or lam_max = -inf; lam_max < 0 with
            kind="inequality"; mu_growth not finite or < 1; shrink_ratio outside (0, 1]; mu_max
            not finite or <= 0 (an infinite one would let the schedule drive mu to inf mid-run);
            schedule_every not an integer in [1, 2**63 - 1]. "Finite" is in the state dtype:
            with float32 state, c0, mu and mu_max above ~3.4e38 are refused too, and so are a
            lam_min above / lam_max below that range.
        TypeError: c0 neither a float nor a floating tensor (e.g. a string), a non-floating mu
            tensor, a non-number mu/bound/damping/schedule setting, dtype not float32/float64,
            check_finite not None/True/False.

    A captured CUDA graph keeps the addresses of lam, mu and the buffers: `load_state_dict` (unless
    it changes the shape of mu) and the ``mu`` setter copy in place and stay valid; `to` allocates
    new tensors (recapture).
    """

    def __init__(self, c0: Union[torch.Tensor, float], *, mu: Union[torch.Tensor, float] = 10.0,
                 kind: str = "equality", update_with: str = "pre",
                 lam_min: Optional[float] = None, lam_max: Optional[float] = None,
                 damping: float = 0.0, mu_growth: float = 1.0, shrink_ratio: float = 0.25,
                 mu_max: float = 1e6, schedule_every: int = 1,
                 check_finite: Optional[bool] = None,
                 device: Optional[Union[str, torch.device]] = None,
                 dtype: Optional[torch.dtype] = None) -> None:
        if update_with not in ("pre", "post"):
            raise ValueError(f"{_OP}: update_with must be 'pre' or 'post', got {update_with!r}")
        self.lam_min, self.lam_max, self.damping = check_dual_args(_OP, kind, lam_min, lam_max,
                                                                   damping)
        self.mu_growth, self.shrink_ratio, self.mu_max, self.schedule_every = schedule_args(
            mu_growth, shrink_ratio, mu_max, schedule_every)
        if check_finite is not None and not isinstance(check_finite, bool):
            raise TypeError(f"{_OP}: check_finite must be None, True or False, got {check_finite!r}")
        self.c0 = c0_t = as_c0(c0, device, state_dtype(c0, dtype))
        check_mu_max(_OP, self.mu_max, c0_t.dtype)
        check_fits(_OP, c0_t.dtype, lam_min=self.lam_min, lam_max=self.lam_max)
        m = c0_t.numel()
        self._mu = mu_t = as_state_mu(mu, c0_t)
        self.kind = kind
        self.update_with = update_with
        self.check_finite = check_finite
        self.lam = torch.zeros(m, dtype=c0_t.dtype, device=c0_t.device)
        self._last_violation = torch.zeros_like(self.lam)
        self._window_sum = torch.zeros_like(self.lam)
        self._window_count = torch.zeros(m, dtype=torch.int64, device=c0_t.device)   # finite |g| entries
        self._prev_window = torch.full_like(mu_t, NO_MEASUREMENT)
        self._steps = torch.zeros((), dtype=torch.int64, device=c0_t.device)
        self._last_g: Union[torch.Tensor, str, None] = None

    # ------------------------------------------------------------------ properties
    @property
    def mu(self) -> torch.Tensor:
        return self._mu

    @mu.setter
    def mu(self, value: Union[torch.Tensor, float]) -> None:
        new = as_state_mu(value, self.c0)   # same checks as the constructor
        if new.dim() > 0 and new.numel() != self._mu.numel():
            raise ValueError(f"{_OP}: mu has shape {tuple(self._mu.shape)}; assign a float or a "
                             f"tensor of that shape, got {tuple(new.shape)}")
        with torch.no_grad():
            self._mu.copy_(new if new.dim() == 0 else new.reshape(self._mu.shape))

    @property
    def num_constraints(self) -> int:
        return self.lam.numel()

    @property
    def device(self) -> torch.device:
        return self.lam.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lam.dtype

    @property
    def steps(self) -> torch.Tensor:
        """Number of dual updates so far, a 0-d int64 device tensor."""
        return self._steps

    def __repr__(self) -> str:
        return (f"AugmentedLagrangian(m={self.num_constraints}, kind={self.kind!r}, "
                f"update_with={self.update_with!r}, device={self.device}, dtype={self.dtype})")

    # ------------------------------------------------------------------ step API
    def _as_g(self, g: torch.Tensor, what: str = "g") -> torch.Tensor:
        """g (or the constraint values) as ``(m,)`` in the state dtype. Only floating tensors are
        taken (TypeError for complex, integer and bool ones, as `augmented_lagrangian_term`
        refuses them; a cast would drop the imaginary part or hide a wrong argument); a finite
        entry that overflows in the cast to the state dtype (float64 -> float32 above ~3.4e38)
        is a ValueError, not an Inf/NaN penalty (checked in eager calls outside CUDA-graph
        capture; one host sync on CUDA, only for a g wider than the state)."""
        if not isinstance(g, torch.Tensor):
            raise TypeError(f"AugmentedLagrangian: {what} must be a floating tensor, got "
                            f"{type(g).__name__}")
        if not g.is_floating_point():
            raise TypeError(f"AugmentedLagrangian: {what} must be a floating tensor (float32/float64, "
                            f"or float16/bfloat16, upcast), got {g.dtype}")
        m = self.num_constraints
        if g.numel() != m or g.dim() > 1:
            raise ValueError(f"AugmentedLagrangian: {what} must have shape ({m},) (or () when m = 1), "
                             f"got {tuple(g.shape)}")
        out = g.reshape(m).to(self.dtype)
        if (g.dtype.itemsize > self.dtype.itemsize and not torch.compiler.is_compiling()
                and not g.is_meta and not (g.is_cuda and torch.cuda.is_current_stream_capturing())):
            pg = plain_of(g.detach())   # (the values of every batch entry under torch.func.vmap)
            lost = torch.isfinite(pg) & ~torch.isfinite(pg.to(self.dtype))
            if bool(lost.any()):
                raise ValueError(f"AugmentedLagrangian: {what} has finite entries beyond the range of "
                                 f"the state dtype {self.dtype} (largest {torch.finfo(self.dtype).max:.4g}): "
                                 f"{pg[lost].tolist()[:4]}; they would become Inf")
        return out

    def constraint(self, values: torch.Tensor) -> torch.Tensor:
        """g = values - c0, shape ``(m,)``, differentiable in ``values``.

        Args:
            values: ``()`` (m = 1) or ``(m,)`` current constraint values on the device of the state
                (e.g. the mean CE of a remote minibatch, in nats); cast to the state dtype, so a
                float16/bfloat16 loss is compared in float32 and its gradient flows back to it.
        Raises:
            TypeError: not a floating tensor (complex, integer and bool tensors are refused).
            ValueError: wrong number of entries or device; a finite entry beyond the range of
                the state dtype (a float64 value above ~3.4e38 with float32 state).
        """
        if not isinstance(values, torch.Tensor):
            raise TypeError(f"AugmentedLagrangian.constraint: values must be a tensor, got "
                            f"{type(values).__name__}")
        if values.device != self.device:
            raise ValueError(f"AugmentedLagrangian.constraint: values are on {values.device} but "
                             f"the state is on {self.device}")
        return self._as_g(values, "values") - self.c0

    def penalty(self, g: torch.Tensor) -> torch.Tensor:
        """The augmented-Lagrangian term for g (``(m,)`` or ``()``), a 0-d tensor.

        equality: lam^T g + (mu/2) ||g||^2; inequality: sum (1/(2 mu)) (max(0, lam + mu g)^2 -
        lam^2). Differentiable in g (gradient lam + mu g, resp. max(0, lam + mu g)); g is cast to
        the state dtype first (a half-precision g gets its gradient back through the cast); the
        result has the state dtype. Records g.detach() as the pre-step value that ``update()``
        uses in ``update_with="pre"`` mode. The first-order torch.func transforms (``grad``,
        ``vjp``, ``jacrev``, ``jvp``, ``jacfwd``, ``vmap`` of them) work; second derivatives raise
        NotImplementedError, as for `entangle_ext.augmented_lagrangian_term`.

        Raises:
            TypeError: g not a floating tensor (a complex, integer or bool g is refused, not cast).
            ValueError: g without m entries, or with a finite entry beyond the range of the
                state dtype (float64 above ~3.4e38 with float32 state: it would become Inf).
        """
        g = self._as_g(g)
        self._last_g = pre_step_value(g.detach())
        return augmented_lagrangian_term(g, self.lam, self._mu, kind=self.kind)

    def update(self, g: Optional[torch.Tensor] = None, *,
               closure: Optional[Callable[[], torch.Tensor]] = None) -> torch.Tensor:
        """Dual step lam <- proj((1 - damping) lam + mu g) (then clipping), in place; returns lam.

        Which g (see the class docstring): ``update(g)`` uses g (detached); ``update()`` uses the
        g of the last `penalty` call (``update_with="pre"`` only); ``update(closure=fn)`` uses
        g = fn() - c0, fn run under no_grad (``update_with="post"`` only). Then records |g| (see
        `violation`), advances the step counter and applies the penalty schedule. No host sync
        unless ``check_finite`` is True on CUDA, or g has a wider dtype than the state (float64 g,
        float32 state: one sync to refuse values the cast would overflow).

        Args:
            g: ``(m,)`` (or ``()`` when m = 1) floating tensor, cast to the state dtype; a Python
                number is a TypeError (pass a tensor on the state's device).

        Raises:
            TypeError: g (or the closure's result) not a floating tensor (a Python number, a
                complex, integer or bool tensor).
            ValueError: both g and closure, closure in "pre" mode, no g in "post" mode, a
                non-finite g (with check_finite; lam, mu and the counters unchanged), shape errors,
                a finite g beyond the range of the state dtype.
            RuntimeError: ``update()`` in "pre" mode before any `penalty` call, or after one
                under ``torch.func.vmap`` (one g per batch entry: pass g).
        """
        if g is not None and closure is not None:
            raise ValueError("AugmentedLagrangian.update: pass g or closure, not both")
        if closure is not None:
            if self.update_with != "post":
                raise ValueError("AugmentedLagrangian.update: a closure re-evaluates g after the "
                                 "step, which is update_with='post'; this instance uses 'pre'")
            with torch.no_grad():
                g = self.constraint(closure())
        elif g is None:
            if self.update_with == "post":
                raise ValueError("AugmentedLagrangian.update: update_with='post' needs the "
                                 "re-evaluated constraint: pass g or closure=")
            if not isinstance(self._last_g, torch.Tensor):   # None, or why there is none (vmap)
                raise RuntimeError(self._last_g or "AugmentedLagrangian.update: no g given and "
                                   "penalty() has not been called yet")
            g = self._last_g
        g = self._as_g(g).detach()
        check = self.check_finite
        if check is None:
            check = not (self.lam.is_cuda and torch.cuda.is_current_stream_capturing())
        dual_update_(self.lam, g, self._mu, kind=self.kind, lam_min=self.lam_min,
                     lam_max=self.lam_max, damping=self.damping, check_finite=check)
        with torch.no_grad():
            absg = g.abs()
            self._last_violation.copy_(absg)
            self._steps.add_(1)
            if self.mu_growth > 1.0:
                schedule_step(absg, self._mu, self._window_sum, self._window_count, self._prev_window,
                              self._steps, every=self.schedule_every, growth=self.mu_growth,
                              shrink=self.shrink_ratio, mu_max=self.mu_max)
        return self.lam

    def violation(self, sync: bool = False) -> Union[torch.Tensor, float]:
        """|g| of the last dual update.

        Returns a ``(m,)`` device tensor (a copy; zeros before the first update; NaN/Inf where that
        g was non-finite), or with ``sync=True`` a Python float, max_i |g_i| (one host sync).
        """
        if sync:
            return float(self._last_violation.max().item())
        return self._last_violation.clone()

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> Dict[str, Any]:
        """Tensors (cloned) and settings needed to resume: lam, mu, c0, violation, schedule state
        (window_sum and window_count: the sum and number of the finite |g| entries of the current
        window; prev_window: the last measurement, +inf before the first)."""
        return {
            "version": _STATE_VERSION, "kind": self.kind, "update_with": self.update_with,
            "lam": self.lam.clone(), "mu": self._mu.clone(), "c0": self.c0.clone(),
            "last_violation": self._last_violation.clone(), "window_sum": self._window_sum.clone(),
            "window_count": self._window_count.clone(), "prev_window": self._prev_window.clone(),
            "steps": self._steps.clone(), "lam_min": self.lam_min, "lam_max": self.lam_max, "damping": self.damping,
            "mu_growth": self.mu_growth, "shrink_ratio": self.shrink_ratio, "mu_max": self.mu_max,
            "schedule_every": self.schedule_every,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore the state tensors of `state_dict` (device/dtype converted), in place.

        mu is restored with its value and shape (a scalar-mu instance takes a per-constraint mu
        and vice versa; when the shape changes, mu and the schedule's window are new tensors:
        recapture any CUDA graph). The settings (bounds, damping, schedule, update_with) stay
        those of this instance. A state without ``window_count`` (the previous release's, version 1)
        loads as if every entry of its current window had been finite (count = steps mod this
        instance's schedule_every), and its prev_window, if steps < schedule_every (an unused 0), as
        no measurement yet (+inf).

        The state is checked before anything is copied (a failed load leaves the instance as it
        was), with the constructor's and the ``mu`` setter's messages; state tensors on a GPU
        cost one host sync (not checked during CUDA-graph capture).

        Raises:
            ValueError: a missing key, a ``version`` other than this release's (1), another
                kind, another number of constraints (lam / c0 / last_violation / window_sum
                shape: build this instance with a c0 of the same size), a mu of shape other than
                () or (m,) (prev_window alike), non-finite lam (or a negative one with
                kind="inequality"), mu not finite and > 0, non-finite c0, negative or NaN window
                sums, a negative last_violation (|g|: >= 0, NaN or +Inf), steps not a 0-d integer >= 0,
                a window_count not of shape (m,) or not integer-valued >= 0.
            TypeError: state not a dict, a state entry that is not a tensor, a non-floating
                lam / c0 / mu.
        """
        new = checked_state(f"{_OP}.load_state_dict", state, self.c0, self.kind, _STATE_VERSION,
                            self.schedule_every)
        mu = new["mu"]
        with torch.no_grad():
            if mu.shape != self._mu.shape:
                self._mu = torch.empty(mu.shape, dtype=self.dtype, device=self.device)
                self._prev_window = torch.empty_like(self._mu)
            self.lam.copy_(new["lam"])
            self._mu.copy_(mu)
            self.c0.copy_(new["c0"])
            self._last_violation.copy_(new["last_violation"])
            self._window_sum.copy_(new["window_sum"])
            self._window_count.copy_(new["window_count"])
            self._prev_window.copy_(new["prev_window"])
            self._steps.copy_(new["steps"])
        self._last_g = None

    def to(self, device: Union[str, torch.device, None] = None,
           dtype: Optional[torch.dtype] = None) -> "AugmentedLagrangian":
        """Move (and optionally cast) every state tensor; returns self. New tensors: recapture
        any CUDA graph that used the old ones. TypeError for a dtype other than float32/float64,
        ValueError (nothing moved) when mu_max is beyond the range of the new dtype, or when a
        finite c0, mu or multiplier lam would become Inf in it (float64 -> float32 above ~3.4e38;
        one host sync when the state is on CUDA), or for device="meta" (no data)."""
        fdt = self.dtype if dtype is None else dtype
        if device is not None and torch.device(device).type == "meta":
            raise ValueError(f"{_OP}.to: the meta device holds no data; the state must stay on a "
                             "real device (cpu or cuda)")
        check_state_dtype(f"{_OP}.to", "dtype", fdt)
        check_mu_max(f"{_OP}.to", self.mu_max, fdt)
        check_fits(f"{_OP}.to", fdt, lam_min=self.lam_min, lam_max=self.lam_max)
        names = ("c0", "lam", "_mu", "_last_violation", "_window_sum", "_prev_window")
        new = {name: getattr(self, name).to(device=device, dtype=fdt) for name in names}
        for name, what in (("c0", "c0"), ("lam", "the multipliers lam"), ("_mu", "mu")):
            old = getattr(self, name)
            if fdt != old.dtype and not bool(torch.isfinite(new[name]).all()) and bool(torch.isfinite(old).all()):
                raise ValueError(f"{_OP}.to: {what} (|value| up to {float(old.abs().max()):.4g}) does not fit "
                                 f"in {fdt}; nothing was moved")
        for name in names:
            setattr(self, name, new[name])
        self._steps, self._window_count = (t.to(device=device) for t in (self._steps, self._window_count))   # int64
        self._last_g = None
        return self
