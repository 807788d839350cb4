"""Per-user directories of the package (no torch import: the native-extension loader uses them)."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["user_cache_dir"]


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/entangle_ext`` or ``~/.cache/entangle_ext`` (need not exist): data sets
    (``data/``) and the kernels compiled at the first import (``jit/``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "entangle_ext"
