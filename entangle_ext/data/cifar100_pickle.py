"""The restricted reader of torchvision's CIFAR-100 pickles (``cifar-100-python/``: ``train``,
``test``, ``meta``): `read_pickle` unpickles them without running code from them — every global
but numpy array reconstruction (and the latin1 encoding of bytes) is refused, and so are
object-dtype arrays. Used by `entangle_ext.data.cifar100.load_cifar100`."""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

__all__ = ["read_pickle"]


class _Refused(pickle.UnpicklingError):
    """A global or an array the CIFAR-100 reader does not load; the text says which."""


try:   # numpy >= 2 (the pickles of numpy 1 and of the Python 2 originals name numpy.core.multiarray)
    from numpy._core.multiarray import _reconstruct as _np_reconstruct
except ImportError:   # pragma: no cover - numpy 1
    from numpy.core.multiarray import _reconstruct as _np_reconstruct


class _NdarrayMarker:
    """What the pickled global numpy.ndarray stands for: only the first argument of `_reconstruct`,
    not a class the file may call (``ndarray(shape, dtype, buffer, ...)``)."""


def _reconstruct(cls, shape, typecode):
    if not isinstance(cls, _NdarrayMarker):
        raise _Refused(f"an array of type {getattr(cls, '__name__', cls)!r} (only numpy.ndarray)")
    return _np_reconstruct(np.ndarray, shape, typecode)


def _dtype(*args):
    dt = np.dtype(*args)
    if dt.hasobject:
        raise _Refused(f"an object-dtype numpy array ({dt})")
    return dt


def _latin1_encode(obj, encoding="utf-8", errors="strict"):
    # how Python 3 writes bytes at pickle protocols 0-2: _codecs.encode(str, "latin1")
    if not isinstance(obj, str) or encoding not in ("latin1", "latin-1") or errors != "strict":
        raise _Refused(f"the pickled call _codecs.encode({type(obj).__name__}, {encoding!r}, {errors!r}) "
                       "(only a str encoded as latin1)")
    return obj.encode("latin1")


# The only globals a CIFAR-100 pickle needs: numpy array reconstruction (the ``data`` array; the
# originals were written by Python 2 with protocol 2) and, for a copy re-pickled by Python 3 at
# protocol <= 2, the latin1 encoding of bytes. Dicts, lists, bytes, str and ints need no global.
_ALLOWED = {("numpy.core.multiarray", "_reconstruct"): _reconstruct,
            ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
            ("numpy", "ndarray"): _NdarrayMarker(),
            ("numpy", "dtype"): _dtype,
            ("_codecs", "encode"): _latin1_encode}


class _CifarUnpickler(pickle.Unpickler):
    """Unpickles torchvision's CIFAR-100 files without running code from them: every global but
    those of `_ALLOWED` is refused (`_Refused`), and so are object-dtype arrays."""

    def find_class(self, module, name):
        f = _ALLOWED.get((module, name))
        if f is None:
            raise _Refused(f"the pickled global {module}.{name}")
        return f


def _check_no_object_arrays(obj) -> None:
    """Refuse an object-dtype array however it was built (e.g. fields set on a plain dtype by its
    pickled state), anywhere in the dicts, lists and tuples of a loaded file."""
    stack, seen = [obj], set()
    while stack:
        o = stack.pop()
        if isinstance(o, np.ndarray):
            if o.dtype.hasobject:
                raise _Refused(f"an object-dtype numpy array ({o.dtype})")
        elif isinstance(o, (dict, list, tuple)) and id(o) not in seen:   # a pickle may hold cycles
            seen.add(id(o))
            stack.extend(o.values() if isinstance(o, dict) else o)


def read_pickle(path: Path, keys) -> dict:
    """One of torchvision's CIFAR-100 pickles as a dict holding ``keys``; errors name the file."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing (torchvision cifar-100-python layout: train, test, meta)")
    try:
        with open(path, "rb") as f:
            p = _CifarUnpickler(f, encoding="bytes").load()
        _check_no_object_arrays(p)
    except _Refused as e:
        raise ValueError(f"{path}: refuses to load {e} (a CIFAR-100 file holds only arrays, lists and "
                         "numbers)") from None
    except Exception as e:   # unpickling a corrupt file can raise almost anything
        raise ValueError(f"{path} is not a CIFAR-100 pickle: {type(e).__name__}: {e}") from e
    missing = [k.decode() for k in keys if not isinstance(p, dict) or k not in p]
    if missing:
        raise ValueError(f"{path} is not a CIFAR-100 pickle: missing keys {missing}")
    return p
