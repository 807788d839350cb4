"""Checkpoints of sharded run objects (FSDP parameters, optimizer state and momentum held as
DTensors): written and read by every rank with `torch.distributed.checkpoint`, next to the
checkpoint file rank 0 writes (``entangle_ext/unlearn/checkpoint.py``; docs/algorithm.md §11)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import torch

__all__ = ["has_dtensor", "save_sharded", "load_sharded", "init_optimizer_state", "sharded_dir"]


def has_dtensor(x: Any) -> bool:
    """Does ``x`` (a tensor, or dicts/lists of them) contain a DTensor (a sharded FSDP value)?"""
    if isinstance(x, dict):
        return any(has_dtensor(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(has_dtensor(v) for v in x)
    return isinstance(x, torch.Tensor) and type(x).__name__ == "DTensor"


def _as_dict(x: Any) -> Any:
    """Lists to {"0": ..., "1": ...} and keys to strings (the nesting `torch.distributed.checkpoint`
    keys by)."""
    if isinstance(x, dict):
        return {str(k): _as_dict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return {str(i): _as_dict(v) for i, v in enumerate(x)}
    return x


def _from_dict(x: Any, like: Any) -> Any:
    if isinstance(like, (list, tuple)):
        return [_from_dict(x[str(i)], v) for i, v in enumerate(like)]
    if isinstance(like, dict):
        return {k: _from_dict(x[str(k)], v) for k, v in like.items()}
    return x


def save_sharded(entries: Dict[str, Any], path: str) -> None:
    """Write the sharded run objects ``entries`` (state dicts holding DTensors) with
    `torch.distributed.checkpoint` under the directory ``path`` (collective: every rank)."""
    import torch.distributed.checkpoint as dcp
    dcp.save(_as_dict(entries), checkpoint_id=path)


def load_sharded(templates: Dict[str, Any], path: str) -> Dict[str, Any]:
    """Read `save_sharded`'s entries into ``templates`` (the current objects' state dicts, which
    give the shards' layout); returns them filled. Collective."""
    import torch.distributed.checkpoint as dcp
    sd = _as_dict(templates)
    dcp.load(sd, checkpoint_id=path)
    return {k: _from_dict(sd[str(k)], v) for k, v in templates.items()}


def init_optimizer_state(opt: torch.optim.Optimizer) -> None:
    """Create the per-parameter state of a fresh optimizer (zero gradients, one step with lr 0),
    so that a sharded checkpoint has tensors to load into. No effect when it already has state."""
    if opt.state:
        return
    params = [p for g in opt.param_groups for p in g["params"] if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    lrs = [g["lr"] for g in opt.param_groups]
    for g in opt.param_groups:
        g["lr"] = 0.0
    opt.step()
    for g, lr in zip(opt.param_groups, lrs):
        g["lr"] = lr
    for p in params:
        p.grad = None


def sharded_dir(state: Dict[str, Any]) -> str:
    """The `torch.distributed.checkpoint` directory of the checkpoint ``state``: the one of the
    stored name beside the checkpoint file it was read from (``state["path"]``, set by
    `load_checkpoint`), where the run wrote it, also after the out dir was moved or copied. The
    stored path itself is relative to the writer's working directory, so from another directory it
    named nothing or another run's shards. Without ``state["path"]`` (a state not read from a
    file) the stored path is used.

    Raises:
        FileNotFoundError: that directory does not exist beside the checkpoint file."""
    stored = state["sharded"]["path"]
    where = state.get("path")
    if where is None:
        return stored
    cand = Path(where).parent / Path(stored).name
    if not cand.is_dir():
        raise FileNotFoundError(f"the checkpoint {where} keeps its sharded state in {Path(stored).name}/ "
                                f"beside it, which does not exist ({cand}); copy that directory with the file")
    return str(cand)
