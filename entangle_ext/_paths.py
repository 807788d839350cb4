"""Per-user directories of the package and the reading of user-given paths (no torch import: the
native-extension loader uses them)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["user_cache_dir", "expand_user"]


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/entangle_ext`` or ``~/.cache/entangle_ext`` (need not exist): data sets
    (``data/``) and the kernels compiled at the first import (``jit/``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "entangle_ext"


def expand_user(path: Any) -> Any:
    """A user-given path with a leading ``~`` / ``~user`` expanded (`os.path.expanduser`), as the
    shell does for an unquoted word: a str stays a str, another ``os.PathLike`` becomes a `Path`.
    Anything else (None, a loaded checkpoint dict, a wrong type) is returned unchanged, for the
    caller's own checks. Every path argument of the Python API and the command line goes through
    here, so ``"~/runs"`` never becomes a folder named ``~`` in the working directory."""
    if isinstance(path, str):
        return os.path.expanduser(path)
    if isinstance(path, os.PathLike):
        p = os.fspath(path)
        return Path(os.path.expanduser(p)) if isinstance(p, str) else path
    return path
