"""Checkpoints and random-number state of a run: `seed_everything`, RNG capture/restore, the
checkpoint writer/reader, and how run objects (models, optimizers, multipliers, data streams,
tensor lists) are saved into and restored from a checkpoint.

A checkpoint is one ``torch.save`` dict: the run-wide entries (``config``, ``evals``, ``c0``, ...),
the stage entries (``stage``, ``step``, ``history``, one entry per run object), ``rng`` (python,
numpy, torch and CUDA generator states), ``tag`` and ``format`` (`CHECKPOINT_FORMAT`).
"""
from __future__ import annotations

import contextlib
import os
import random
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Union

import numpy as np
import torch

__all__ = ["seed_everything", "rng_state", "set_rng_state", "preserved_rng", "capture_state",
           "restore_state", "Checkpointer", "load_checkpoint", "CHECKPOINT_FORMAT"]

CHECKPOINT_FORMAT = 2   # 2: Stage-1 multipliers as an `AugmentedLagrangian` state dict


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed python, numpy and torch (all devices); optionally force deterministic algorithms
    (`torch.use_deterministic_algorithms`, cuDNN deterministic, the cuBLAS workspace variable)."""
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def rng_state() -> Dict[str, Any]:
    """The python, numpy and torch (CPU, and every CUDA device when available) generator states."""
    s = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def set_rng_state(s: Dict[str, Any]) -> None:
    """Restore the states captured by `rng_state` (CUDA ones only when CUDA is available)."""
    torch.set_rng_state(s["torch"])
    np.random.set_state(s["numpy"])
    random.setstate(s["python"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Context manager: the caller's generator states are restored on exit (also on error)."""
    saved = rng_state()
    try:
        yield
    finally:
        set_rng_state(saved)


def capture_state(obj: Any) -> Any:
    """What a checkpoint stores for one run object: ``obj.state_dict()`` (modules, optimizers,
    `AugmentedLagrangian`, `BatchStream`), detached clones for a list of tensors (e.g. a momentum
    buffer), or the object itself for plain values (floats, dicts)."""
    if hasattr(obj, "state_dict"):
        return obj.state_dict()
    if isinstance(obj, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in obj):
        return [t.detach().clone() for t in obj]
    return obj


def restore_state(obj: Any, state: Any) -> None:
    """Inverse of `capture_state`, in place: ``obj.load_state_dict(state)`` or a copy into each
    tensor of a list. Plain values cannot be restored in place (the caller reads them).

    Raises ValueError when a tensor list has another length than the stored one.
    """
    if hasattr(obj, "load_state_dict"):
        obj.load_state_dict(state)
    elif isinstance(obj, (list, tuple)):
        if len(obj) != len(state):
            raise ValueError(f"checkpoint holds {len(state)} tensors where the run has {len(obj)}")
        with torch.no_grad():
            for t, s in zip(obj, state):
                t.copy_(s)


class Checkpointer:
    """Writes ``{out_dir}/checkpoints/{tag}.pt`` atomically (tmp + rename), with the run-wide
    entries of ``common`` (a dict the driver may extend during the run) and the RNG states, and
    points ``checkpoints/latest.pt`` at it. ``last_path`` is the last good checkpoint (None
    before the first one, or always when ``out_dir`` is None: then nothing is written).

    The stages call it as ``checkpointer(step, state)`` (tag ``stage{S}_step{step:06d}``).
    """

    def __init__(self, out_dir: Optional[Union[str, Path]], common: Dict[str, Any]):
        self.dir = Path(out_dir) / "checkpoints" if out_dir is not None else None
        self.common = common
        self.last_path: Optional[str] = None
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)

    def save(self, tag: str, state: Dict[str, Any]) -> Optional[str]:
        """Write ``common`` + ``state`` under ``tag``; returns the path (None without out_dir)."""
        if self.dir is None:
            return None
        path = self.dir / f"{tag}.pt"
        _atomic_save({**self.common, **state, "rng": rng_state(), "tag": tag,
                      "format": CHECKPOINT_FORMAT}, path)
        _atomic_save({"path": str(path)}, self.dir / "latest.pt")
        self.last_path = str(path)
        return self.last_path

    def __call__(self, step: int, state: Dict[str, Any]) -> Optional[str]:
        return self.save(f"stage{state['stage']}_step{step:06d}", state)


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_suffix(".pt.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Union[str, Path]) -> Dict[str, Any]:
    """Load a checkpoint written by `unlearn` onto the CPU.

    Args:
        path: a checkpoint file, or an out dir / checkpoints dir (its latest checkpoint is used).
    Raises:
        FileNotFoundError: no such file, or no checkpoint under the directory.
        ValueError: a checkpoint of another format (written by another version of the package).
    """
    p = Path(path)
    if p.is_dir():
        for c in (p / "checkpoints" / "latest.pt", p / "latest.pt"):
            if c.exists():
                p = Path(torch.load(c, weights_only=False)["path"])
                break
        else:
            raise FileNotFoundError(f"no checkpoint under {path}")
    if not p.exists():
        raise FileNotFoundError(f"checkpoint {p} not found")
    ckpt = torch.load(p, map_location="cpu", weights_only=False)
    if ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint {p} has format {ckpt.get('format', 1)}, this version of "
                         f"entangle_ext reads format {CHECKPOINT_FORMAT}: restart the run")
    return ckpt
