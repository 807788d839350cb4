"""What test modules share besides fixtures (import it as ``from _support import ...``; tests/
conftest.py puts tests/ on sys.path and re-exports these names): the repository root, the shared
real-data folder, the devices to test on, and the ragged-segment generator of the operator tests."""
import contextlib
import os
import signal
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
"""The repository root (the folder with pyproject.toml)."""

SHARED_DATA = Path(os.environ.get("ENTANGLE_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
"""The real datasets beside the checkout (``../shared/data``, or $ENTANGLE_SHARED_DATA); tests that
read them skip when a file is absent."""

HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])


def ragged(lengths, gen, dtype=torch.float64, scale=3.0, distinct=True):
    """(x, offsets): ``sum(lengths)`` values from ``gen`` (distinct by default: W2 is
    differentiable there) and their ``cu_seqlens``-style int64 offsets, one segment per length."""
    n = sum(lengths)
    if distinct:  # distinct values: the function is differentiable there
        x = torch.randperm(max(n, 1) * 7, generator=gen)[:n].to(dtype) / 7.0
        x = (x - x.mean() if n else x) * scale / max(n, 1) ** 0.5
    else:
        x = torch.randint(-3, 4, (n,), generator=gen).to(dtype)
    off = torch.tensor([0] + list(np.cumsum(lengths)), dtype=torch.int64)
    return x, off


@contextlib.contextmanager
def hup_default(on: bool = True):
    """SIGHUP at its default disposition inside (under ``nohup make test`` it arrives ignored, and
    the package rightly keeps an inherited SIG_IGN); nothing where there is no SIGHUP or ``on`` is
    False."""
    if not on or not hasattr(signal, "SIGHUP"):
        yield
        return
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, before)
