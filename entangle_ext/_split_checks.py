"""Argument checks of the split builders (`entangle_ext.splits`, `entangle_ext.split_features`):
integer labels and index arrays, name lists, attribute columns and feature matrices, each refused
with a message naming the argument rather than coerced (a float label is not truncated, a -1 in an
attribute is read as absent as in the columns)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import List, Optional, Sequence

import numpy as np
import torch

__all__ = ["check_unique_indices", "as_int_array", "int_value", "int_list", "index_list", "names_list", "attr_matrix", "present",
           "float_matrix"]


def as_int_array(a, name: str) -> np.ndarray:
    """``a`` (a 1-D sequence, numpy array or tensor of integers: labels or sample indices) as an int64
    array.

    Raises:
        ValueError: ``a`` is not 1-D, or holds anything but integers: a float array is refused even
            when its values are whole (as the data loaders and `IndexSplit` refuse float labels and
            indices: 1e20 or inf would wrap to a negative int64, 2.7 would be truncated), and the
            message says how to cast it.
    """
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    a = np.asarray(a)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        hint = ""
        if np.issubdtype(a.dtype, np.floating):
            hint = ("; floats are not cast (1e20 or inf would wrap around, 2.7 would be truncated): "
                    "pass an integer array, e.g. a.astype(np.int64) after checking the values are whole")
        raise ValueError(f"{name} must hold integers, got dtype {a.dtype}{hint}")
    return a.astype(np.int64)


def check_unique_indices(a: np.ndarray, name: str) -> None:
    """ValueError unless the integer array ``a`` (sample indices) holds no negative and no repeated
    entry (either would put one sample in two splits, or read an index from the end)."""
    if a.size and a.min() < 0:
        raise ValueError(f"{name} must be sample indices >= 0, got {int(a.min())}")
    u, counts = np.unique(a, return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"{name} repeats index {int(u[counts > 1][0])}: each sample may appear once")


def int_value(x, name: str, minimum: Optional[int] = None, hint: str = "") -> int:
    """``x`` as a Python int when it holds an integer: a Python int, a numpy integer, or a 0-d
    integer numpy array / tensor (a bool, float, str or anything else is not coerced).

    Raises:
        TypeError: ``x`` is not such an integer (``hint`` is appended to the message).
        ValueError: it is below ``minimum``.
    """
    v = x
    if isinstance(v, torch.Tensor) and v.dim() == 0 and v.dtype != torch.bool \
            and not v.is_floating_point() and not v.is_complex():
        v = int(v.item())
    elif isinstance(v, np.ndarray) and v.ndim == 0 and np.issubdtype(v.dtype, np.integer):
        v = int(v)
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an integer (a Python int, numpy integer or 0-d integer tensor), "
                        f"got {type(x).__name__} {x!r}{hint}")
    v = int(v)
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v}")
    return v


def int_list(x, name: str, hint: str = "") -> List[int]:
    """One integer label or a collection of them (list, tuple, range, set, any other iterable but a
    str, bytes or dict; a 1-D array / tensor) as a list of ints,
    each checked by `int_value`; a str is refused (TypeError), not read as a sequence."""
    if isinstance(x, str):
        raise TypeError(f"{name} must be an integer or a sequence of integers, got the str {x!r}{hint}")
    if isinstance(x, (torch.Tensor, np.ndarray)):
        if x.ndim == 0:
            return [int_value(x, name, hint=hint)]
        if x.ndim != 1:
            raise ValueError(f"{name} must be an integer or a 1-D sequence of integers, got shape {tuple(x.shape)}")
        return [int_value(v, f"{name}[{i}]", hint=hint) for i, v in enumerate(x)]
    if isinstance(x, Iterable) and not isinstance(x, (bytes, dict)):   # list, tuple, range, set, generator, Series
        return [int_value(v, f"{name}[{i}]", hint=hint) for i, v in enumerate(x)]
    return [int_value(x, name, hint=hint)]


def index_list(x, what: str) -> List[int]:
    """An index sequence (list, tuple, range, 1-D numpy array / tensor) as a list of Python ints;
    each entry a Python int, a numpy integer or a 0-d integer array / tensor.

    Raises:
        ValueError: ``x`` is not such a sequence (a set, a str, a scalar, a 2-D array), or an entry is
            not an integer (a bool, float, str, ...); the message names ``what`` and the entry.
    """
    if isinstance(x, (np.ndarray, torch.Tensor)):
        if x.ndim != 1:
            raise ValueError(f"{what} must be a 1-D sequence of integer indices, got an array of shape "
                             f"{tuple(x.shape)}")
        x = x.tolist()          # integer dtypes give Python ints; float / bool ones are refused below
    if not isinstance(x, (list, tuple, range)):
        raise ValueError(f"{what} must be a list of integer indices, got {type(x).__name__}")
    if all(type(v) is int for v in x):     # the common case, without a per-entry check
        return list(x)
    out = []
    for i, v in enumerate(x):
        try:
            out.append(int_value(v, what))
        except TypeError:
            raise ValueError(f"{what} must hold integers only; entry {i} is {type(v).__name__} {v!r}") from None
    return out


def names_list(names, count: int, name: str, what: str) -> Optional[List[str]]:
    """``names`` (None or a sequence of at least ``count`` names) as a list; ValueError when it is
    too short for the classes it must name (``what``), TypeError for a str."""
    if names is None:
        return None
    if isinstance(names, str):
        raise TypeError(f"{name} must be a sequence of names, not one str {names!r}")
    names = list(names)
    if len(names) < count:
        raise ValueError(f"{name} has {len(names)} names but {count} {what} need one; give one name per class")
    return names


def attr_matrix(attrs, names: Sequence[str]) -> np.ndarray:
    """(N, len(names)) bool from a mapping name → (N,) array or an object with ``attr_names``."""
    cols = []
    for n in names:
        if n not in attrs:
            raise ValueError(f"unknown attribute {n!r}; available: {sorted(attrs)[:50]}")
        a = attrs[n]
        a = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
        if a.ndim != 1:
            raise ValueError(f"attribute {n!r} must be 1-D")
        if not (a.dtype == bool or np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
            raise ValueError(f"attribute {n!r} must hold numbers or bools ({{0,1}}, {{-1,+1}} or bool), got "
                             f"dtype {a.dtype}; convert it first, e.g. np.asarray(column, dtype=int)")
        if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
            raise ValueError(f"attribute {n!r} holds NaN or infinite values")
        cols.append(a > 0)   # accepts {0,1}, {-1,+1} (CelebA's file) and bool
    if len({len(c) for c in cols}) > 1:
        raise ValueError("attribute columns have different lengths")
    return np.stack(cols, 1) if cols else np.zeros((0, 0), bool)


def present(value, name: str) -> bool:
    """A ``forget_subclass`` value read as `attr_matrix` reads an attribute: True / 1 present,
    False / 0 / -1 absent; anything else is refused (ValueError) rather than guessed."""
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 0 and value.dtype in (torch.bool, np.bool_):
        value = bool(value.item())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    try:
        v = int_value(value, f"forget_subclass[{name!r}]")
    except TypeError:
        v = None
    if v not in (-1, 0, 1):
        raise ValueError(f"forget_subclass[{name!r}] must be True / 1 (present) or False / 0 / -1 (absent), "
                         f"got {value!r}")
    return v > 0


def float_matrix(a, name: str) -> torch.Tensor:
    """(rows, dims) float32 CPU tensor of a real (or bool) numpy array / tensor / nested list;
    TypeError for another dtype (str, object, complex), ValueError unless 2-D and finite."""
    if isinstance(a, torch.Tensor):
        t = a.detach()
        if t.is_complex():
            raise TypeError(f"{name} must be real, got dtype {t.dtype}")
    else:
        arr = np.asarray(a)
        if not (arr.dtype == bool or np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
            raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
        t = torch.as_tensor(arr)
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D (samples, dims), got shape {tuple(t.shape)}")
    t = t.float().cpu()
    bad = ~torch.isfinite(t)
    if bad.any():
        rows = torch.nonzero(bad.any(1)).flatten()
        raise ValueError(f"{name} holds {int(bad.sum())} NaN or infinite value(s) (after the cast to float32) "
                         f"in {len(rows)} row(s), first row {int(rows[0])}: the distances would be meaningless; "
                         "drop or fix those rows")
    return t
