"""Loading of the native extension (`entangle_ext._C`) and build information.

Two routes (`build_route`): "ahead-of-time" — ``entangle_ext._C`` was compiled when the package
was installed (``pip install --no-build-isolation .``, ``make build``); "first-import" — no
compiled module came with the package (a plain ``pip install .``), so `entangle_ext._jit`
compiles the shipped sources against the imported torch at the first import, into a cache
directory (`build_path` says where).

Importing this module never raises: if the extension cannot be loaded or compiled, the reason is
kept (`load_error`) and every operator call raises a `RuntimeError` that names it and the fix.
The pure-PyTorch reference implementations in `entangle_ext.reference` need no build.
"""
from __future__ import annotations

import importlib
import os
import sys
import warnings

import torch

from . import _build

_C = None
_LOAD_ERROR: str | None = None
_ROUTE: str | None = None

_REBUILD = ("reinstall against the installed torch with `pip install --no-build-isolation <source dir>` "
            "(`make build` in a checkout)")

try:
    # the compiled extension, imported for its side effect: it registers torch.ops.entangle_ext.*
    # (by name, so that import-linter does not read `from . import _C` as an import of the package)
    _C = importlib.import_module(f"{__package__}._C")
    _ROUTE = "ahead-of-time"
except ImportError as exc:  # pragma: no cover - depends on the install
    try:
        _no_jit = _build.flag("ENTANGLE_NO_JIT")
    except ValueError as vexc:   # a bad switch value: the import goes on, the operators raise naming it
        _no_jit, _LOAD_ERROR = False, f"the C++ kernels were not compiled at import: {vexc}"
        warnings.warn(f"entangle_ext: {_LOAD_ERROR}", RuntimeWarning, stacklevel=2)
    if _LOAD_ERROR is not None:
        pass
    elif _no_jit:
        _LOAD_ERROR = (f"the compiled extension entangle_ext._C could not be imported ({exc}) and ENTANGLE_NO_JIT=1 "
                       f"forbids compiling it at import (and loading a copy an earlier import compiled): unset "
                       f"ENTANGLE_NO_JIT, or {_REBUILD}")
    else:
        from . import _jit
        if not isinstance(exc, ModuleNotFoundError):   # a compiled _C is there but does not load
            print(f"entangle_ext: the installed {__package__}._C does not load with torch {torch.__version__} "
                  f"({(str(exc).splitlines() or [type(exc).__name__])[0][:200]}; e.g. it was built for another torch): compiling the kernels "
                  "from the shipped sources instead", file=sys.stderr, flush=True)
        try:
            _C = _jit.load(torch)
            _ROUTE = "first-import"
        except (_jit.JitBuildError, ValueError) as jexc:   # ValueError: a bad ENTANGLE_CPU_ONLY / FORCE_CUDA value
            _LOAD_ERROR = f"the C++ kernels could not be compiled at the first import: {jexc}"
            warnings.warn(f"entangle_ext: {_LOAD_ERROR}. The operators raise until this is fixed; the "
                          "pure-PyTorch references in entangle_ext.reference work.", RuntimeWarning, stacklevel=2)
if _C is not None and _C.torch_version() != torch.__version__:  # pragma: no cover - depends on the install
    _LOAD_ERROR = (f"entangle_ext._C was compiled against torch {_C.torch_version()} but torch "
                   f"{torch.__version__} is installed; {_REBUILD}")


def build_route() -> str | None:
    """How the native extension was built: "ahead-of-time" (at install time, or ``make build``),
    "first-import" (compiled from the shipped sources by this or an earlier first import, after a
    plain ``pip install .``), or None when it is not loaded (`load_error` says why)."""
    return _ROUTE if _LOAD_ERROR is None else None


def build_path() -> str | None:
    """The file of the loaded native extension (in the package, or in the first-import cache
    directory), or None when it is not loaded."""
    return None if _C is None or _LOAD_ERROR is not None else os.path.abspath(_C.__file__)


def available() -> bool:
    """True when the compiled operators are loaded and usable."""
    return _LOAD_ERROR is None


def load_error() -> str | None:
    """Why the compiled operators are unavailable, or None when they are."""
    return _LOAD_ERROR


def cuda_built() -> bool:
    """True when this build of entangle_ext contains the CUDA kernels (either `build_route`).

    Decided at build time from `torch.version.cuda` and a CUDA toolkit (nvcc) being found
    (overridable with ENTANGLE_CPU_ONLY=1 / FORCE_CUDA=1), not from whether a GPU is present.
    """
    return _C is not None and bool(_C.cuda_built())


def cuda_arch_list() -> str:
    """The TORCH_CUDA_ARCH_LIST the CUDA kernels were compiled for ('' in a CPU-only build)."""
    return "" if _C is None else str(_C.cuda_arch_list())


def built_torch_version() -> str | None:
    """The torch version the native extension was compiled against (None when not loaded)."""
    return None if _C is None else str(_C.torch_version())


def require(op: str, *tensors: torch.Tensor) -> None:
    """Raise a clear error when `op` cannot run on `tensors` with this build.

    Raises:
        RuntimeError: the extension is not loaded, or a tensor is on CUDA and this build has no
            CUDA kernels, or a tensor is on a device type the extension has no kernels for.
    """
    if _LOAD_ERROR is not None:
        raise RuntimeError(f"entangle_ext.{op}: {_LOAD_ERROR}. The pure-PyTorch fallback is "
                           f"entangle_ext.reference.{op}.")
    for t in tensors:
        if t.device.type == "cuda" and not cuda_built():
            raise RuntimeError(
                f"entangle_ext.{op}: got a CUDA tensor but this entangle_ext build has no CUDA "
                "kernels (it was built CPU-only). Reinstall with a CUDA build of torch and nvcc: "
                "`FORCE_CUDA=1 pip install --no-build-isolation .`, or move the tensors to the CPU.")
        if t.device.type not in ("cpu", "cuda", "meta"):
            raise RuntimeError(f"entangle_ext.{op}: no kernels for device type '{t.device.type}' "
                               "(supported: cpu, cuda)")
