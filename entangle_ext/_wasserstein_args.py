"""Argument normalisation shared by the W2 operator wrapper and its pure-PyTorch reference.

Two input forms are accepted (the `cu_seqlens` convention of variable-length attention kernels):

* equal-length batches: ``u`` of shape ``(n,)`` or ``(S, n)`` and ``v`` of shape ``(m,)`` or
  ``(S, m)`` (``n`` and ``m`` may differ);
* ragged segments: flat ``u`` ``(N_u,)`` and ``v`` ``(N_v,)`` with ``u_offsets`` / ``v_offsets`` of
  shape ``(S + 1,)`` (int32 or int64 prefix sums, first 0, last N): segment ``s`` of ``u`` is
  ``u[u_offsets[s]:u_offsets[s + 1]]``. Segment ``s`` of ``u`` and of ``v`` may have different sizes.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np
import torch

from ._dense import check_dense
from ._wrappers import is_batched, transforms_active

OffsetsLike = Union[torch.Tensor, Sequence[int]]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass
class Segments:
    u: torch.Tensor            # (N_u,) contiguous, compute dtype
    v: torch.Tensor            # (N_v,) contiguous, compute dtype
    u_offsets: torch.Tensor    # (S+1,) int64 on u.device
    v_offsets: torch.Tensor    # (S+1,) int64 on u.device
    num_segments: int          # S
    out_shape: tuple           # shape of the unreduced result: () for 1-D dense input, else (S,)
    max_seqlen: Optional[int]  # known bound on every segment length, or None
    input_dtype: torch.dtype   # dtype of the caller's tensors (result is cast back to it)
    ragged: bool


_OFFSETS_CACHE: "dict[tuple, torch.Tensor]" = {}
_OFFSETS_CACHE_MAX = 64


def dense_offsets(S: int, n: int, device: torch.device) -> torch.Tensor:
    """``arange(S + 1) * n`` as int64 on ``device``, cached (saves kernel launches in hot loops).

    Not cached while a CUDA graph is being captured (the tensor would live in the graph's pool),
    nor while torch.compile traces (a lookup keyed by the sizes would make Dynamo guard on them,
    one graph per size), nor under a torch.func transform (a tensor made under ``grad`` / ``jvp``
    is a wrapper of that transform's level; cached, it outlived the level and a later call under
    another transform failed with functorch's internal "escaped?" assertion). The cached tensor is
    always a normal one, also when the first call runs under `torch.inference_mode` (an inference
    tensor cannot be saved for a later backward).
    """
    if torch.compiler.is_compiling():
        return torch.arange(S + 1, device=device, dtype=torch.int64) * n
    key = (S, n, device)
    off = _OFFSETS_CACHE.get(key)
    if off is not None:
        return off
    with torch.inference_mode(False):
        off = torch.arange(S + 1, device=device, dtype=torch.int64) * n
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return off
    if transforms_active():
        return off   # made under torch.func.grad / jvp it is that level's wrapper: it must not outlive it
    if len(_OFFSETS_CACHE) >= _OFFSETS_CACHE_MAX:
        _OFFSETS_CACHE.pop(next(iter(_OFFSETS_CACHE)))
    _OFFSETS_CACHE[key] = off
    return off


_OFFSETS_WANTED = "a 1-D int32 or int64 tensor or a sequence of ints (cu_seqlens)"


def _as_offsets(op: str, off: OffsetsLike, name: str, device: torch.device) -> torch.Tensor:
    if not isinstance(off, torch.Tensor):
        what = type(off).__name__
        try:
            vals = list(off)
        except TypeError as exc:
            raise TypeError(f"{op}: {name} must be {_OFFSETS_WANTED}, got {what}") from exc
        if not vals:   # as_tensor([]) is float32: say what is wrong, not "got torch.float32"
            raise ValueError(f"{op}: {name} must be {_OFFSETS_WANTED} with S+1 >= 1 entries, "
                             f"got an empty {what}")
        flag = next((i for i, v in enumerate(vals) if isinstance(v, (bool, np.bool_)) or (
            isinstance(v, torch.Tensor) and v.dtype == torch.bool)), None)
        if flag is not None:   # as_tensor([0, True, 10]) is int64 [0, 1, 10]
            raise TypeError(f"{op}: {name} must be {_OFFSETS_WANTED}, got a {what} whose entry {flag} is the "
                            f"bool {bool(vals[flag])}")
        try:
            off = torch.as_tensor(vals)   # keep the inferred dtype: 2.5 must not become 2
        except (TypeError, ValueError, RuntimeError) as exc:
            big = next((int(v) for v in vals if isinstance(v, (int, np.integer)) and not -2**63 <= int(v) < 2**63), None)
            raise TypeError(f"{op}: {name} must be {_OFFSETS_WANTED}, got a {what} with " + (
                "non-integer entries" if big is None else f"an integer beyond int64 ({big})")) from exc
        if off.dtype not in (torch.int32, torch.int64):
            kind = "integer entries of another width" if not off.is_floating_point() and off.dtype != torch.bool \
                else "non-integer entries"
            raise TypeError(f"{op}: {name} must be {_OFFSETS_WANTED}, got a {what} with "
                            f"{kind} ({off.dtype}; int32 or int64 only)")
    if off.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{op}: {name} must be int32 or int64 (cu_seqlens), got {off.dtype}")
    if off.dim() != 1 or off.numel() < 1:
        raise ValueError(f"{op}: {name} must be 1-D with S+1 entries, got shape {tuple(off.shape)}")
    if off.device.type == "meta" and device.type != "meta":   # no data to copy to the values
        raise ValueError(f"{op}: {name} is on meta but u is on {device}")
    if off.dtype != torch.int64 or off.device != device:
        off = off.to(device=device, dtype=torch.int64)
    return off if off.is_contiguous() else off.contiguous()


def check_max_seqlen(op: str, max_seqlen) -> None:
    """None or an int in [0, 2**63 - 1] (the operator's int64 argument; TypeError for anything
    else, bool and float included: int() would truncate 4.7 or read '4'); a SymInt while
    torch.compile traces."""
    if max_seqlen is None:
        return
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, (numbers.Integral, torch.SymInt)):
        raise TypeError(f"{op}: max_seqlen must be an int or None, got {type(max_seqlen).__name__} "
                        f"{max_seqlen!r}")
    if max_seqlen < 0:
        raise ValueError(f"{op}: max_seqlen must be >= 0, got {max_seqlen}")
    if isinstance(max_seqlen, numbers.Integral) and max_seqlen > 2**63 - 1:
        raise ValueError(f"{op}: max_seqlen must be at most 2**63 - 1 (an int64 bound on the segment "
                         f"lengths), got {max_seqlen}")


def _host_longest(*offsets) -> Optional[int]:
    """Longest segment of offsets given as host lists / CPU tensors (None if any is on a GPU, or
    while torch.compile traces: the values are data the graph cannot guard on; the kernel's
    ``validate`` pass checks a given max_seqlen against the segments instead)."""
    if torch.compiler.is_compiling():
        return None
    longest = 0
    for off in offsets:
        if isinstance(off, torch.Tensor):
            if is_batched(off):   # one set of offsets per vmap entry: the kernel's validate pass checks
                return None
            if off.device.type != "cpu" or off.dtype not in (torch.int32, torch.int64) or off.dim() != 1:
                return None
            if off.numel() > 1:
                longest = max(longest, int((off[1:] - off[:-1]).max()))
        else:
            try:
                vals = list(off)
            except TypeError:   # not a sequence: _as_offsets names the problem
                return None
            if not all(isinstance(x, int) for x in vals):
                return None
            longest = max([longest] + [b - a for a, b in zip(vals[:-1], vals[1:])])
    return longest


def normalize(op: str, u: torch.Tensor, v: torch.Tensor, u_offsets: Optional[OffsetsLike],
              v_offsets: Optional[OffsetsLike], max_seqlen: Optional[int] = None) -> Segments:
    """Check and convert the caller's arguments; see the module docstring for the forms.

    Raises:
        TypeError: non-tensor inputs, non-floating or mismatched dtypes, non-integer offsets, a
            max_seqlen that is not an int (a float, str or bool).
        ValueError: mismatched devices or shapes (meta offsets with real values), empty dense
            distributions or offsets, only one of the two offsets given, or a max_seqlen below 0.
    """
    for name, t in (("u", u), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        check_dense(op, name, t)
        if t.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"{op}: {name} must be a floating tensor (float16/bfloat16/float32/"
                            f"float64), got {t.dtype}")
    if u.dtype != v.dtype:
        raise TypeError(f"{op}: u and v must have the same dtype, got {u.dtype} and {v.dtype}")
    if u.device != v.device:
        raise ValueError(f"{op}: u is on {u.device} but v is on {v.device}")
    if (u_offsets is None) != (v_offsets is None):
        raise ValueError(f"{op}: give both u_offsets and v_offsets (ragged form) or neither")
    check_max_seqlen(op, max_seqlen)
    compute = torch.float32 if u.dtype in (torch.float16, torch.bfloat16) else u.dtype
    device = u.device

    if u_offsets is None:
        if u.dim() not in (1, 2) or v.dim() != u.dim():
            raise ValueError(f"{op}: dense inputs must both be (n,) or both (S, n); got shapes "
                             f"{tuple(u.shape)} and {tuple(v.shape)}")
        if u.dim() == 2 and u.shape[0] != v.shape[0]:
            raise ValueError(f"{op}: u has {u.shape[0]} rows but v has {v.shape[0]}")
        n, m = u.shape[-1], v.shape[-1]
        S = 1 if u.dim() == 1 else u.shape[0]
        if S > 0 and (n == 0 or m == 0):
            raise ValueError(f"{op}: W2 to an empty distribution is undefined (u has {n} values "
                             f"per segment, v has {m})")
        if max_seqlen is not None and S > 0 and int(max_seqlen) < max(n, m):
            raise ValueError(f"{op}: max_seqlen={max_seqlen} but the longest segment has "
                             f"{max(n, m)} values")
        uo = dense_offsets(S, n, device)
        vo = dense_offsets(S, m, device)
        # The bound goes to the operator's ``int max_seqlen`` (not SymInt): while torch.compile
        # traces, max(n, m) there would specialise the graph on the sizes (one graph per size), so
        # the known bound is only the caller's max_seqlen (a constant hint; None: the kernel
        # finds it, on CUDA the device path unless validating).
        known = max_seqlen if torch.compiler.is_compiling() else max(n, m)
        return Segments(_flat(u, compute), _flat(v, compute), uo, vo, S, () if u.dim() == 1 else (S,),
                        known, u.dtype, False)

    if u.dim() != 1 or v.dim() != 1:
        raise ValueError(f"{op}: with offsets, u and v must be flat 1-D tensors; got shapes "
                         f"{tuple(u.shape)} and {tuple(v.shape)}")
    if device.type == "cuda" or max_seqlen is not None:  # host offsets: longest without a sync
        longest = _host_longest(u_offsets, v_offsets)
        if longest is not None and max_seqlen is not None and int(max_seqlen) < longest:
            raise ValueError(f"{op}: max_seqlen={max_seqlen} but the longest segment has {longest} values")
        max_seqlen = longest if max_seqlen is None else max_seqlen
    uo = _as_offsets(op, u_offsets, "u_offsets", device)
    vo = _as_offsets(op, v_offsets, "v_offsets", device)
    if uo.numel() != vo.numel():
        raise ValueError(f"{op}: u_offsets and v_offsets must both have S+1 entries, got "
                         f"{uo.numel()} and {vo.numel()}")
    S = uo.numel() - 1
    return Segments(_flat(u, compute), _flat(v, compute), uo, vo, S, (S,),
                    None if max_seqlen is None else int(max_seqlen), u.dtype, True)


def _flat(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t as a contiguous 1-D tensor of `dtype` (no call, and so no overhead, when it already is)."""
    if t.dim() != 1:
        t = t.reshape(-1)
    if t.dtype != dtype:
        t = t.to(dtype)
    return t if t.is_contiguous() else t.contiguous()


def reduce(op: str, w2: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return w2
    if reduction == "mean":
        return w2.mean()
    if reduction == "sum":
        return w2.sum()
    raise ValueError(f"{op}: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
