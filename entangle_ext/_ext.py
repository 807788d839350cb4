"""Loading of the native extension (`entangle_ext._C`) and build information.

Importing this module never raises: if the compiled extension is missing or was built against
another torch, the reason is kept and every operator call raises a `RuntimeError` that names it and
the fix. The pure-PyTorch reference implementations in `entangle_ext.reference` need no build.
"""
from __future__ import annotations

import torch

_C = None
_LOAD_ERROR: str | None = None

_REBUILD = ("rebuild it against the installed torch with "
            "`pip install --no-build-isolation .` (or `make test`)")

try:
    from . import _C  # noqa: F811  (registers torch.ops.entangle_ext.* as a side effect)
except ImportError as exc:  # pragma: no cover - depends on the install
    _LOAD_ERROR = f"the compiled extension entangle_ext._C could not be imported ({exc}); {_REBUILD}"
else:
    if _C.torch_version() != torch.__version__:  # pragma: no cover - depends on the install
        _LOAD_ERROR = (f"entangle_ext._C was compiled against torch {_C.torch_version()} but torch "
                       f"{torch.__version__} is installed; {_REBUILD}")


def available() -> bool:
    """True when the compiled operators are loaded and usable."""
    return _LOAD_ERROR is None


def load_error() -> str | None:
    """Why the compiled operators are unavailable, or None when they are."""
    return _LOAD_ERROR


def cuda_built() -> bool:
    """True when this build of entangle_ext contains the CUDA kernels.

    Decided at build time from `torch.version.cuda` (overridable with ENTANGLE_CPU_ONLY=1 /
    FORCE_CUDA=1), not from whether a GPU is present.
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
