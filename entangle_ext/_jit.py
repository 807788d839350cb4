"""Compiling the native extension at the first import (the route of a plain ``pip install .``).

pip builds a package in an isolated environment without the user's torch, and a binary compiled
against another torch would not load; so such an install ships the C++/CUDA sources
(``entangle_ext/_csrc``) and `load` compiles them with ``torch.utils.cpp_extension.load`` against
the torch that is imported, once, into a cache directory keyed by everything the binary depends
on (`build_dir`). A file lock makes concurrent first imports compile once: the others wait and
load the result. ``pip install --no-build-isolation .`` compiles ahead of time instead (setup.py).

Environment: ``ENTANGLE_JIT_DIR`` (cache root instead of ``~/.cache/entangle_ext/jit``),
``ENTANGLE_NO_JIT=1`` (never compile at import), ``CXX``, ``MAX_JOBS`` and the switches of
`entangle_ext._build` (``ENTANGLE_CPU_ONLY``, ``FORCE_CUDA``, ``TORCH_CUDA_ARCH_LIST``, ...).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Optional, Tuple

from . import _build
from ._paths import user_cache_dir
from ._version import __version__

__all__ = ["sources_dir", "build_dir", "load", "JitBuildError"]

_PKG = Path(__file__).resolve().parent


class JitBuildError(RuntimeError):
    """The extension could not be compiled at import; the message names the cause and the fix."""


def sources_dir() -> Optional[Path]:
    """The native sources: ``entangle_ext/_csrc`` of an installed package, else ``csrc/`` of the
    source checkout this package is imported from; None when neither exists."""
    for d in (_PKG / "_csrc", _PKG.parent / "csrc"):
        if (d / "sources.txt").is_file():
            return d
    return None


def _sources(src: Path, cuda: bool):
    names = _build.read_sources(src)   # "csrc/<path>" as listed for the source checkout
    files = [src / Path(*Path(n).parts[1:]) for n in names if cuda or n.endswith(".cpp")]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise JitBuildError(f"native sources missing from {src}: {missing}; reinstall entangle_ext")
    return [str(f) for f in files]


def _digest(src: Path) -> str:
    """SHA-256 (first 12 hex digits) of every source and header under ``src``."""
    h = hashlib.sha256()
    for f in sorted(p for p in src.rglob("*") if p.is_file() and p.suffix in (".h", ".cuh", ".cpp", ".cu", ".txt")):
        h.update(str(f.relative_to(src)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def build_dir(torch, cuda: bool, src: Path) -> Path:
    """Where this build lives: ``<root>/<version>-torch<torch version>-<cpu|cu<version>>-
    py<major><minor>-<sources digest>`` under ``$ENTANGLE_JIT_DIR`` or ``~/.cache/entangle_ext/jit``:
    another torch, Python, device set or source tree never reuses a binary."""
    root = Path(os.environ["ENTANGLE_JIT_DIR"]) if os.environ.get("ENTANGLE_JIT_DIR") else user_cache_dir() / "jit"
    dev = f"cu{torch.version.cuda}" if cuda else "cpu"
    tag = f"{__version__}-torch{torch.__version__}-{dev}-py{sys.version_info[0]}{sys.version_info[1]}-{_digest(src)}"
    return root / tag.replace("+", "_")


def _decide_cuda(torch) -> Tuple[bool, str]:
    """(build CUDA kernels?, a note for the progress message). A CUDA torch without nvcc gives
    the CPU kernels only (CUDA tensors then raise, naming the fix) instead of no kernels."""
    try:
        return _build.want_cuda(torch, _build.locate_cuda_home()), ""
    except _build.BuildError as e:
        if _build.flag("FORCE_CUDA"):
            raise JitBuildError(str(e)) from None
        return False, f" (no CUDA kernels: {e})"


def _check_tools(cuda: bool) -> None:
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise JitBuildError(f"no C++ compiler found ({cxx!r} is not on PATH; set CXX): install one (Debian/"
                            "Ubuntu: apt install g++; macOS: xcode-select --install), or use the pure-PyTorch "
                            "references in entangle_ext.reference")
    try:
        from torch.utils.cpp_extension import verify_ninja_availability
        verify_ninja_availability()
    except RuntimeError:
        raise JitBuildError("the ninja build tool is missing: pip install ninja") from None


def load(torch):
    """Compile (once per `build_dir`) and import the native extension; returns the module.

    Prints one line to stderr before compiling and one when done (compiling takes minutes: on a
    2-core machine about 3 for the CPU kernels, over 10 with CUDA for two architectures).

    Raises:
        JitBuildError: no sources (a package installed without them), no C++ compiler, no ninja,
            FORCE_CUDA=1 that cannot be honoured, or a failed compilation (the compiler's last
            output lines are in the message).
    """
    src = sources_dir()
    if src is None:
        raise JitBuildError(f"no native sources next to {_PKG} to compile; reinstall entangle_ext")
    cuda, note = _decide_cuda(torch)
    out = build_dir(torch, cuda, src)
    out.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock, Timeout   # a torch dependency
    lock = FileLock(str(out) + ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"entangle_ext: waiting for another process compiling the kernels into {out}",
              file=sys.stderr, flush=True)
        lock.acquire()
    try:
        return _compile(torch, src, out, cuda, note)
    finally:
        lock.release()


def _compile(torch, src: Path, out: Path, cuda: bool, note: str):
    from torch.utils import cpp_extension
    fresh = not any(out.glob("*.so")) and not any(out.glob("*.pyd"))
    if fresh:
        _check_tools(cuda)
        what = "CPU + CUDA" if cuda else "CPU"
        took = "about 3 minutes on 2 cores" if not cuda else \
            "10 minutes or more for CUDA on 2 cores; ENTANGLE_CPU_ONLY=1 builds the CPU kernels only"
        print(f"entangle_ext: first import with torch {torch.__version__}: compiling the {what} kernels{note} "
              f"of {src} into {out} (once; {took}) ...", file=sys.stderr, flush=True)
    arch = _build.cuda_arch_list(torch) if cuda else ""
    f = _build.compile_flags(torch, __version__, cuda, arch, shell_escaped=True)
    t = time.perf_counter()
    try:
        mod = cpp_extension.load(
            name="entangle_ext_C", sources=_sources(src, cuda), build_directory=str(out),
            extra_cflags=f["cxx"], extra_cuda_cflags=f["nvcc"], extra_ldflags=f["ldflags"],
            extra_include_paths=_build.nvidia_include_dirs() if cuda else None, with_cuda=cuda, verbose=False)
    except (RuntimeError, OSError, ImportError) as e:
        tail = " | ".join(str(e).strip().splitlines()[-6:])
        raise JitBuildError(f"compiling the kernels into {out} failed: {tail}") from None
    if fresh:
        print(f"entangle_ext: compiled in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    return mod
