"""Argument checks of the augmented-Lagrangian operators (`entangle_ext.augmented_lagrangian`) and of
`entangle_ext.AugmentedLagrangian` (`entangle_ext.lagrangian`) in one place, so both raise the same messages,
the class at construction and the operators at every call. docs/algorithm.md §2, §6."""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Dict, Optional, Tuple, Union

import numpy as np
import torch

from ._al_schedule import NO_MEASUREMENT
from ._dense import check_dense
from ._shown import shown
from ._wrappers import plain_of

_KINDS = ("equality", "inequality")
_STATE_DTYPES = (torch.float32, torch.float64)
_HALF_DTYPES = (torch.float16, torch.bfloat16)
Scalar = Union[torch.Tensor, float, int]


def check_kind(op: str, kind: str) -> None:
    if kind not in _KINDS:
        raise ValueError(f"{op}: kind must be 'equality' or 'inequality', got {kind!r}")


def as_real(op: str, name: str, x) -> float:
    """A Python or numpy real number as a float: TypeError for anything else (bool included),
    ValueError for an integer beyond the float range (e.g. 10**400) instead of OverflowError."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{op}: {name} must be a float, got {type(x).__name__}")
    try:
        return float(x)
    except OverflowError:
        digits = str(abs(int(x)))
        raise ValueError(f"{op}: {name} is beyond the float range, got an integer of {len(digits)} digits "
                         f"({'-' if x < 0 else ''}{digits[:12]}...)") from None


def check_flag(op: str, name: str, x) -> bool:
    """A bool flag (Python bool or numpy bool), else TypeError: a string such as 'no' is truthy
    and must not silently mean True."""
    if isinstance(x, bool):
        return x
    if isinstance(x, np.bool_):
        return bool(x)
    raise TypeError(f"{op}: {name} must be True or False, got {x!r}")


def check_dual_args(op: str, kind: str, lam_min, lam_max, damping
                    ) -> Tuple[Optional[float], Optional[float], float]:
    """The host-side arguments of the dual step (also checked by `AugmentedLagrangian` at
    construction): damping in [0, 1], lam_min <= lam_max (neither NaN, lam_min not +inf, lam_max
    not -inf: such a bound leaves no value and would set every multiplier to +-inf), lam_max >= 0
    for inequality constraints. Returns them as floats; TypeError / ValueError otherwise."""
    check_kind(op, kind)
    damping = as_real(op, "damping", damping)
    lo = None if lam_min is None else as_real(op, "lam_min", lam_min)
    hi = None if lam_max is None else as_real(op, "lam_max", lam_max)
    if not 0.0 <= damping <= 1.0:
        raise ValueError(f"{op}: damping must be in [0, 1], got {damping:g}")
    for name, v in (("lam_min", lo), ("lam_max", hi)):
        if v is not None and v != v:   # NaN; not math.isnan, a graph break on a symbolic float
            raise ValueError(f"{op}: {name} is NaN")
    if lo is not None and lo == math.inf:
        raise ValueError(f"{op}: lam_min is +inf: no multiplier can reach it (a finite bound, or "
                         "None for none)")
    if hi is not None and hi == -math.inf:
        raise ValueError(f"{op}: lam_max is -inf: no multiplier can reach it (a finite bound, or "
                         "None for none)")
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"{op}: lam_min ({lo:g}) > lam_max ({hi:g})")
    if kind == "inequality" and hi is not None and hi < 0:
        raise ValueError(f"{op}: an inequality multiplier is >= 0, so lam_max must be >= 0, "
                         f"got {hi:g}")
    return lo, hi, damping


def check_fits(op: str, dtype: torch.dtype, *, mu: Optional[float] = None, lam_min: Optional[float] = None,
               lam_max: Optional[float] = None) -> None:
    """ValueError for host floats that would become Inf in the multipliers' ``dtype``: a finite
    mu above its largest value, a lam_min above it (every multiplier clipped to +inf) or a
    lam_max below its lowest. (A lam_min below the lowest or a lam_max above the largest is no
    bound, as -inf / +inf are.) Not checked while torch.compile traces (a comparison would
    specialise a symbolic float)."""
    if torch.compiler.is_compiling():
        return
    top = torch.finfo(dtype).max
    if mu is not None and top < mu < math.inf:
        raise ValueError(f"{op}: the penalty mu={mu:g} is beyond the range of the multipliers' dtype "
                         f"{dtype} (largest {top:.4g})")
    if mu is not None and 0 < mu < math.inf and underflows(mu, dtype):
        raise ValueError(f"{op}: the penalty mu={mu:g} underflows to 0 in the multipliers' dtype {dtype}: "
                         "it must be > 0 there")
    if lam_min is not None and lam_min > top:
        raise ValueError(f"{op}: lam_min={lam_min:g} is beyond the range of the multipliers' dtype {dtype} "
                         f"(largest {top:.4g}): every multiplier would be clipped to +inf")
    if lam_max is not None and lam_max < -top:
        raise ValueError(f"{op}: lam_max={lam_max:g} is beyond the range of the multipliers' dtype {dtype} "
                         f"(lowest {-top:.4g}): every multiplier would be clipped to -inf")


def underflows(x: float, dtype: torch.dtype) -> bool:
    """A positive host float that rounds to 0 in ``dtype`` (e.g. 1e-50 in float32): at most half
    the smallest subnormal (tiny * eps), which rounds to 0 (ties to even). Host arithmetic only: no
    tensor is made on the per-step dual-update path."""
    fi = torch.finfo(dtype)
    return x <= fi.tiny * fi.eps / 2


def check_state_dtype(op: str, name: str, dtype: torch.dtype) -> None:
    """Multipliers (and mu, c0) are float32 or float64 whatever the model dtype."""
    if dtype not in _STATE_DTYPES:
        raise TypeError(f"{op}: {name} must be float32 or float64 (got {dtype}): keep "
                        "the multipliers in float32 even for a half-precision model")


def as_mu(op: str, mu: Scalar, lam: torch.Tensor, *, finite: bool) -> torch.Tensor:
    """mu as a tensor of the dtype of lam. A Python number or a CPU tensor must be > 0, and with
    ``finite`` also finite (ValueError); a CUDA tensor is not checked here (that would cost a host
    sync). Without ``finite``, non-finite mu is left to the kernels (`entangle_ext.dual_update_`:
    ``check_finite``). While torch.compile traces (``torch.compiler.is_compiling()``) neither the CPU
    tensor nor a Python float is checked: a data-dependent check would break the graph
    (``fullgraph=True`` fails) and a comparison of a symbolic float would specialise it on the
    value; eager calls keep both checks, and `AugmentedLagrangian` has checked its mu when it was
    set."""
    if isinstance(mu, torch.Tensor):
        if mu.dtype != lam.dtype:
            raise TypeError(f"{op}: mu is {mu.dtype} but lam is {lam.dtype} (same dtype required)")
        if mu.device.type == "cpu" and not torch.compiler.is_compiling():
            m = plain_of(mu.detach())   # under torch.func.vmap: every batch entry's mu at once
            bad = (m <= 0) | ~torch.isfinite(m) if finite else (m <= 0) & torch.isfinite(m)
            if bool(bad.any()):
                need = "> 0 and finite" if finite else "> 0"
                raise ValueError(f"{op}: the penalty mu must be {need}, got {shown(m, bad)}")
        return mu.detach().contiguous()
    if isinstance(mu, bool) or not isinstance(mu, numbers.Real):
        raise TypeError(f"{op}: mu must be a tensor or a Python float, got {type(mu).__name__}")
    mu = as_real(op, "mu", mu)
    if torch.compiler.is_compiling():
        # Not compared while torch.compile traces: under dynamic=True a float mu (an argument, a
        # default, a closure) is a symbolic float that becomes a tensor input of the graph; a
        # host comparison would specialise the graph on its value (one graph per mu) and
        # math.isfinite would break it. Eager calls (and AugmentedLagrangian, when mu is set)
        # keep the check; in a compiled graph a bad float mu behaves as a CUDA tensor mu does.
        # zeros + mu, not torch.full: Dynamo keeps the float symbolic (a graph input) only when
        # it enters the graph through arithmetic; torch.full would specialise it.
        return torch.zeros((), dtype=lam.dtype, device=lam.device) + mu
    is_finite = -math.inf < mu < math.inf
    if (finite and not is_finite) or (is_finite and mu <= 0):
        need = "> 0 and finite" if finite else "> 0"
        raise ValueError(f"{op}: the penalty mu must be {need}, got {mu}")
    check_fits(op, lam.dtype, mu=mu)
    # torch.full is a device fill (capturable), but the value is baked into a captured CUDA graph.
    return torch.full((), mu, dtype=lam.dtype, device=lam.device)


def check_tensors(op: str, **named) -> None:
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        check_dense(op, name, t)


def check_shapes(op: str, lam: torch.Tensor, g: torch.Tensor, mu: torch.Tensor) -> None:
    """lam ``(m,)``, g ``(m,)`` and mu ``()`` or ``(m,)`` (a ``(1,)`` mu for m > 1 is refused, not
    broadcast), checked in the wrapper so that the message names the public function."""
    if lam.dim() != 1:
        raise ValueError(f"{op}: lam must have 1 dimension (m,), got shape {tuple(lam.shape)}")
    m = lam.shape[0]
    if g.dim() != 1 or g.shape[0] != m:
        raise ValueError(f"{op}: g must have shape (m,) = ({m},) like lam, got {tuple(g.shape)}")
    if not (mu.dim() == 0 or (mu.dim() == 1 and mu.shape[0] == m)):
        raise ValueError(f"{op}: mu must have shape () or (m,) = ({m},), got {tuple(mu.shape)}")


def check_same_device(op: str, lam: torch.Tensor, **named) -> None:
    for name, t in named.items():
        if t.device != lam.device:
            raise ValueError(f"{op}: lam is on {lam.device} but {name} is on {t.device} "
                             "(all tensors must be on one device)")


def as_g(op: str, g: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """g in the dtype of lam: float16/bfloat16 is upcast (autograd-connected, like
    ``g.to(lam.dtype)``); any other mismatch is a TypeError. A scalar constraint value (e.g. a mean
    loss minus c0) is accepted for m = 1."""
    if g.dtype != lam.dtype:
        if g.dtype not in _HALF_DTYPES:
            raise TypeError(f"{op}: g is {g.dtype} but lam is {lam.dtype} (same dtype required; "
                            "only float16/bfloat16 g is upcast to the dtype of lam)")
        g = g.to(lam.dtype)
    if g.dim() == 0 and lam.dim() == 1 and lam.shape[0] == 1:
        g = g.reshape(1)
    return g.contiguous()


CLASS = "AugmentedLagrangian"


def capturing(t: torch.Tensor) -> bool:
    """True while a CUDA graph is being captured on t's device (no value check may sync then)."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def schedule_args(mu_growth, shrink_ratio, mu_max, schedule_every):
    """The penalty schedule's settings as (float, float, float, int), or TypeError/ValueError."""
    growth, shrink, top = (as_real(CLASS, n, x) for n, x in (
        ("mu_growth", mu_growth), ("shrink_ratio", shrink_ratio), ("mu_max", mu_max)))
    if not 1.0 <= growth < math.inf:   # inf: the schedule would drive mu to inf mid-run
        raise ValueError(f"{CLASS}: mu_growth must be finite and >= 1, got {mu_growth}")
    if not 0.0 < shrink <= 1.0:
        raise ValueError(f"{CLASS}: shrink_ratio must be in (0, 1], got {shrink_ratio}")
    if not 0.0 < top < math.inf:
        raise ValueError(f"{CLASS}: mu_max must be finite and > 0, got {mu_max}")
    if isinstance(schedule_every, bool) or not isinstance(schedule_every, numbers.Real):
        raise TypeError(f"{CLASS}: schedule_every must be an integer >= 1, got {type(schedule_every).__name__} "
                        f"{schedule_every!r}")
    every = as_real(CLASS, "schedule_every", schedule_every)
    if not (math.isfinite(every) and every >= 1 and every == int(every)):
        raise ValueError(f"{CLASS}: schedule_every must be an integer >= 1, got {schedule_every!r}")
    # exact for a Python int (its float rounds 2**63 - 1 up to 2**63)
    every = int(schedule_every) if isinstance(schedule_every, numbers.Integral) else int(every)
    if every > 2**63 - 1:   # compared with the int64 step counter at every dual update
        raise ValueError(f"{CLASS}: schedule_every must be at most 2**63 - 1 (the int64 step counter), "
                         f"got {schedule_every!r}")
    return growth, shrink, top, every


def check_mu_max(op: str, mu_max: float, dtype: torch.dtype) -> None:
    """mu_max must stay finite in the state dtype (float32: <= ~3.4e38), or the schedule's clamp
    would let mu reach inf."""
    top = torch.finfo(dtype).max
    if mu_max > top:
        raise ValueError(f"{op}: mu_max must be finite in the state dtype {dtype} (<= {top:.4g}), "
                         f"got {mu_max:g}")


def state_dtype(c0, dtype: Optional[torch.dtype]) -> torch.dtype:
    """float32/float64: ``dtype`` if given (else TypeError), else that of a floating c0 tensor
    (else the default dtype), float16/bfloat16 raised to float32."""
    if dtype is not None:
        check_state_dtype(CLASS, "dtype", dtype)
        return dtype
    d = c0.dtype if isinstance(c0, torch.Tensor) else torch.get_default_dtype()
    return d if d in (torch.float32, torch.float64) else torch.float32


def as_c0(c0, device, dtype: torch.dtype, op: str = CLASS) -> torch.Tensor:
    """c0 as a new ``(m,)`` tensor, m >= 1, finite in ``dtype`` (a CUDA tensor: checked with one
    host sync, except during CUDA-graph capture)."""
    if isinstance(c0, torch.Tensor):
        if c0.is_meta or (device is not None and torch.device(device).type == "meta"):
            raise ValueError(f"{op}: c0 (or device=) is on the meta device, which holds no data; "
                             "build the state on a real device (cpu or cuda)")
        if not c0.is_floating_point():
            raise TypeError(f"{op}: c0 must be a floating tensor, got {c0.dtype}")
        if c0.dim() > 1:
            raise ValueError(f"{op}: c0 must be a () or (m,) tensor, got shape "
                             f"{tuple(c0.shape)} (flatten it yourself if that is meant)")
        c0_t = c0.detach().to(device=c0.device if device is None else device,
                              dtype=dtype).reshape(-1).clone()
        bad = c0_t.numel() > 0 and not capturing(c0_t) and not bool(torch.isfinite(c0_t).all())
    else:   # a host float: checked on the host, filled on the device (no copy, no sync)
        if isinstance(c0, bool) or not isinstance(c0, numbers.Real):
            raise TypeError(f"{op}: c0 must be a float or a floating tensor, got "
                            f"{type(c0).__name__}")
        c0 = as_real(op, "c0", c0)
        if not abs(c0) <= torch.finfo(dtype).max:   # NaN, Inf, or beyond float32
            raise ValueError(f"{op}: the pinned values c0 must be finite (in the state dtype "
                             f"{dtype}), got {c0}")
        c0_t, bad = torch.full((1,), c0, dtype=dtype, device=device), False
    if c0_t.is_meta:   # no data: nothing could be checked or computed
        raise ValueError(f"{op}: c0 (or device=) is on the meta device, which holds no data; build the state on a real device")
    if c0_t.numel() == 0:
        raise ValueError(f"{op}: c0 is empty (need at least one constraint)")
    if bad:   # finite as given: the cast to dtype overflowed
        beyond, over = c0.dtype != dtype and bool(torch.isfinite(c0.detach()).all()), ~torch.isfinite(c0_t)
        raise ValueError(f"{op}: the pinned values c0 must be finite" + (f" in the state dtype {dtype}: {shown(c0.reshape(-1), over)} "
                         f"({c0.dtype}) is beyond its range" if beyond else f", got {shown(c0_t, over)}"))
    return c0_t


def as_state_mu(mu, like: torch.Tensor, op: str = CLASS) -> torch.Tensor:
    """mu as a ``()`` or ``(m,)`` tensor with the dtype/device of ``like`` (m = like.numel()),
    finite (in that dtype) and > 0 (checked unless a CUDA graph is being captured)."""
    m = like.numel()
    if isinstance(mu, torch.Tensor):
        if not mu.is_floating_point():
            raise TypeError(f"{op}: mu must be a floating tensor, got {mu.dtype}")
        if not (mu.dim() == 0 or (mu.dim() == 1 and mu.numel() == m)):
            raise ValueError(f"{op}: mu must have shape () or ({m},), got {tuple(mu.shape)}")
        mu_t = mu.detach().to(device=like.device, dtype=like.dtype).clone()
        if not capturing(mu_t) and not bool(((mu_t > 0) & torch.isfinite(mu_t)).all()):
            raise ValueError(f"{op}: mu must be finite and > 0, got {shown(mu_t, ~((mu_t > 0) & torch.isfinite(mu_t)))}")
        return mu_t
    if not (0 < as_real(op, "mu", mu) <= torch.finfo(like.dtype).max) or underflows(mu, like.dtype):
        raise ValueError(f"{op}: mu must be a finite float > 0 (in the state dtype {like.dtype}), "
                         f"got {mu}" + (" (it underflows to 0 there)" if 0 < mu < 1 else ""))
    return torch.full((), float(mu), dtype=like.dtype, device=like.device)


_STATE_TENSORS = ("lam", "mu", "c0", "last_violation", "window_sum", "prev_window", "steps")
COUNT = "window_count"   # not in the version-1 states of the previous release


def _state_keys(op: str, state, kind: str, version: int) -> None:
    if not isinstance(state, Mapping):
        raise TypeError(f"{op}: state must be a dict from state_dict(), got {type(state).__name__}")
    missing = [k for k in ("version", "kind") + _STATE_TENSORS if k not in state]
    if missing:
        raise ValueError(f"{op}: missing keys {missing}")
    v = state["version"]
    if isinstance(v, bool) or not isinstance(v, int) or v != version:
        raise ValueError(f"{op}: state version {v!r} is not supported (this entangle_ext reads "
                         f"version {version})")
    if state["kind"] != kind:
        raise ValueError(f"{op}: state is for kind {state['kind']!r}, this instance is {kind!r}")
    for k in _STATE_TENSORS + ((COUNT,) if COUNT in state else ()):
        if not isinstance(state[k], torch.Tensor):
            raise TypeError(f"{op}: {k} must be a tensor, got {type(state[k]).__name__}")


def checked_state(op: str, state, c0: torch.Tensor, kind: str, version: int,
                  every: int) -> Dict[str, torch.Tensor]:
    """The tensors of an `AugmentedLagrangian` state, checked as the constructor and the ``mu``
    setter check theirs (same messages) and converted to the dtype/device of ``c0``, before
    anything of the instance is touched: the version, the kind, the shapes for m = c0.numel()
    constraints, finite lam (>= 0 for inequality constraints), mu finite and > 0, c0 finite,
    window sums >= 0, steps a 0-d integer >= 0, window counts integers >= 0 (values not checked
    during CUDA-graph capture). Without a window count (a version-1 state), see `window_count`."""
    _state_keys(op, state, kind, version)
    meta = [k for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_meta]
    if meta:   # no data to restore (e.g. a state_dict of a model built on the meta device)
        raise ValueError(f"{op}: state has meta tensors (no data) for {sorted(meta)}; load a state "
                         "saved from real tensors")
    m = c0.numel()
    for key in ("lam", "c0", "last_violation", "window_sum") + ((COUNT,) if COUNT in state else ()):
        if tuple(state[key].shape) != (m,):
            raise ValueError(f"{op}: state has {key} of shape {tuple(state[key].shape)}, but this "
                             f"instance has {m} constraints (multipliers): build it with a c0 of "
                             "the same size")
    mu = state["mu"]
    if not (mu.dim() == 0 or tuple(mu.shape) == (m,)) or mu.shape != state["prev_window"].shape:
        raise ValueError(f"{op}: state mu has shape {tuple(mu.shape)}, expected () or ({m},) "
                         f"(and prev_window of the same shape)")
    steps = state["steps"]
    if steps.dim() != 0 or steps.is_floating_point() or steps.is_complex() or \
            steps.dtype == torch.bool or int(steps) < 0:
        raise ValueError(f"{op}: steps must be a 0-d integer tensor >= 0, got {steps!r}")
    if not state["lam"].is_floating_point():
        raise TypeError(f"{op}: lam must be a floating tensor, got {state['lam'].dtype}")
    out = {k: state[k].detach().to(device=c0.device, dtype=c0.dtype)
           for k in ("lam", "last_violation", "window_sum", "prev_window")}
    out.update(mu=as_state_mu(mu, c0, op), c0=as_c0(state["c0"], c0.device, c0.dtype, op),
               steps=steps.detach().to(device=c0.device, dtype=torch.int64))
    out[COUNT] = window_count(op, state, out, every)
    lam = out["lam"]
    if not capturing(lam):
        if not bool(torch.isfinite(lam).all()):
            given = state["lam"].detach()
            beyond = bool(torch.isfinite(given).all())   # finite as given: the cast to c0's dtype overflowed
            raise ValueError(f"{op}: lam must be finite" + (
                f" in the state dtype {c0.dtype}: {shown(given, ~torch.isfinite(lam))} ({given.dtype}) is beyond its range"
                if beyond else f", got {shown(given, ~torch.isfinite(given))}"))
        if kind == "inequality" and bool((lam < 0).any()):
            raise ValueError(f"{op}: an inequality multiplier is >= 0, got lam = {shown(lam, lam < 0)}")
        for k in ("window_sum", "prev_window"):
            if not bool((out[k] >= 0).all()):
                raise ValueError(f"{op}: {k} must be >= 0 (sums of |g|), got {shown(out[k], ~(out[k] >= 0))}")
        if bool((out["last_violation"] < 0).any()):   # |g|: >= 0, or NaN/+Inf for a non-finite g
            raise ValueError(f"{op}: last_violation must be >= 0 (it is |g|), got "
                             f"{shown(out['last_violation'], out['last_violation'] < 0)}")
    return out


def window_count(op: str, state, out: Dict[str, torch.Tensor], every: int) -> torch.Tensor:
    """The ``(m,)`` int64 count of finite |g| entries in the current window of a state (shape already
    checked): integer-valued and >= 0 (values not checked during CUDA-graph capture). A state
    without one (version 1, the previous release) gets steps mod ``every`` (every entry taken as
    finite) and, while steps < ``every`` (no window has ended: its prev_window is an unused 0),
    ``out["prev_window"]`` becomes `NO_MEASUREMENT`."""
    steps, prev = out["steps"], out["prev_window"]
    if COUNT not in state:
        out["prev_window"] = torch.where(steps < every, torch.full_like(prev, NO_MEASUREMENT), prev)
        return torch.remainder(steps, every).expand(out["window_sum"].shape).clone()
    count = state[COUNT].detach()
    bad, ok = count.dtype == torch.bool or count.is_complex(), None
    if not bad and not capturing(count):
        ok = count >= 0
        if count.is_floating_point():   # integer-valued, and within int64
            ok &= (count == count.floor()) & (count < 2.0**63)
        bad = not bool(ok.all())
    if bad:
        raise ValueError(f"{op}: {COUNT} must hold integers >= 0 (counts of finite |g| entries), got "
                         f"{'a tensor' if capturing(count) else shown(count, None if ok is None else ~ok)} ({count.dtype})")
    return count.to(device=out["steps"].device, dtype=torch.int64)
