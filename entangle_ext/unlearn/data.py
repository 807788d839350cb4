"""Data plumbing of the driver: `Splits`, deterministic resumable batch streams, model calls.

A Dataset item is either an ``(x, y)`` tuple (``y`` an int class index) or a dict with a
``"labels"`` entry plus model keyword inputs (Hugging Face style, e.g. ``input_ids``,
``attention_mask``). Datasets exposing ``.tensors`` (e.g. `torch.utils.data.TensorDataset`,
possibly already on the GPU) are batched by direct tensor indexing, without per-sample collation.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch.utils.data import Dataset
from torch.utils.data._utils.collate import default_collate

__all__ = ["Splits", "BatchStream", "forward_logits", "move_batch", "batch_size_of", "concat_batches"]


@dataclass
class Splits:
    """The three disjoint training sets (docs/algorithm.md §1) plus optional held-out parts.

    Attributes:
        forget: D_f train (the sub-population to forget; keeps its coarse label).
        adjacent: D_adj train (sibling sub-populations of the same coarse class).
        remote: D_rem train (everything else).
        forget_test, adjacent_test, remote_test: optional held-out parts, evaluation only.
    """
    forget: Dataset
    adjacent: Dataset
    remote: Dataset
    forget_test: Optional[Dataset] = None
    adjacent_test: Optional[Dataset] = None
    remote_test: Optional[Dataset] = None

    TRAIN = ("forget", "adjacent", "remote")
    TEST = ("forget_test", "adjacent_test", "remote_test")

    def named(self) -> Dict[str, Dataset]:
        """All present splits by name (train first, then held-out)."""
        out = {}
        for n in self.TRAIN + self.TEST:
            d = getattr(self, n)
            if d is not None:
                out[n] = d
        return out

    def check(self) -> None:
        """Raise ValueError if a train split is missing/empty or a held-out split is empty."""
        for n, d in self.named().items():
            try:
                size = len(d)
            except TypeError as exc:
                raise ValueError(f"split {n!r} must be a sized Dataset") from exc
            if size == 0:
                raise ValueError(f"split {n!r} is empty: every split of Splits needs at least one sample")
        for n in self.TRAIN:
            if getattr(self, n) is None:
                raise ValueError(f"split {n!r} is required")


def _stream_seed(seed: int, stream: str, epoch: int) -> int:
    h = hashlib.sha256(f"{seed}/{stream}/{epoch}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


class BatchStream:
    """Deterministic, resumable minibatch stream over a Dataset.

    The order of epoch e is a pure function of (seed, name, e), so a resumed run only needs the
    counters (epoch, position). Batches are moved to ``device``; the last batch of an epoch may be
    smaller (no drop_last), as with a DataLoader.
    """

    def __init__(self, dataset: Dataset, batch_size: int, *, shuffle: bool, seed: int, name: str,
                 device: torch.device):
        self.dataset, self.batch_size, self.shuffle = dataset, int(batch_size), shuffle
        self.seed, self.name, self.device = seed, name, device
        self.n = len(dataset)
        self.epoch, self.pos = 0, 0  # next batch to deliver (cycling use)

    def __len__(self) -> int:
        return (self.n + self.batch_size - 1) // self.batch_size

    def order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.n)
        g = torch.Generator().manual_seed(_stream_seed(self.seed, self.name, epoch))
        return torch.randperm(self.n, generator=g)

    def batch_indices(self, epoch: int) -> List[torch.Tensor]:
        return list(torch.split(self.order(epoch), self.batch_size))

    def fetch(self, idx: torch.Tensor):
        ds = self.dataset
        tensors = getattr(ds, "tensors", None)
        if tensors is not None:
            dev_idx = idx.to(tensors[0].device, non_blocking=True)  # async H2D, no stream sync
            batch = tuple(t[dev_idx] for t in tensors)
        else:
            batch = default_collate([ds[int(i)] for i in idx])
        return move_batch(batch, self.device)

    def fetch_pass(self, epoch: int, limit: int) -> List[Any]:
        """The first ``limit`` batches of epoch ``epoch`` (a fresh shuffled pass per epoch)."""
        return [self.fetch(idx) for idx in self.batch_indices(epoch)[:limit]]

    def epoch_batches(self, epoch: int, start: int = 0) -> Iterator[Any]:
        """Batches of one epoch, from batch index ``start``."""
        for idx in self.batch_indices(epoch)[start:]:
            yield self.fetch(idx)

    def next(self):
        """Next batch of an endless cycle (advances ``epoch``/``pos``)."""
        idxs = self.batch_indices(self.epoch)
        if self.pos >= len(idxs):
            self.epoch, self.pos = self.epoch + 1, 0
            idxs = self.batch_indices(self.epoch)
        b = self.fetch(idxs[self.pos])
        self.pos += 1
        return b

    def state_dict(self) -> dict:
        """The cycling position {"epoch", "pos"} (the order itself is a function of the seed)."""
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, s: dict) -> None:
        self.epoch, self.pos = int(s["epoch"]), int(s["pos"])


def move_batch(batch, device):
    """Move a tuple/list/dict batch to ``device`` (non_blocking)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: move_batch(v, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(move_batch(v, device) for v in batch) if isinstance(batch, tuple) \
            else [move_batch(v, device) for v in batch]
    return batch


def split_batch(batch) -> Tuple[Any, torch.Tensor]:
    """(inputs, labels) of a tuple/list or dict batch. Raises ValueError otherwise."""
    if isinstance(batch, dict):
        if "labels" not in batch:
            raise ValueError("dict batches need a 'labels' entry")
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        return inputs, batch["labels"]
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], batch[1]
    raise ValueError("batches must be (x, y) tuples or dicts with 'labels'")


def forward_logits(model: torch.nn.Module, inputs) -> torch.Tensor:
    """Call the model (``model(x)`` or ``model(**inputs)``) and return (B, C) logits.

    Accepts plain tensors, tuples (first element), dicts with a ``"logits"`` key and objects with
    ``.logits`` (Hugging Face). Raises ValueError when the output is not a 2-D tensor of logits.
    """
    out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    if isinstance(out, dict) and "logits" in out:
        out = out["logits"]
    elif hasattr(out, "logits"):
        out = out.logits
    elif isinstance(out, (tuple, list)):
        out = out[0]
    if not isinstance(out, torch.Tensor) or out.dim() != 2:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"the model must return 2-D logits (batch, classes); got {shape}")
    return out


def batch_size_of(batch) -> int:
    _, y = split_batch(batch)
    return int(y.shape[0])


def concat_batches(batches: List[Any]):
    """Concatenate batches along dim 0, or return None when shapes do not allow it (e.g. padded
    text of different lengths)."""
    first = batches[0]
    try:
        if isinstance(first, dict):
            return {k: torch.cat([b[k] for b in batches]) for k in first}
        return tuple(torch.cat([b[i] for b in batches]) for i in range(len(first)))
    except (RuntimeError, TypeError):
        return None


def slice_batch(batch, start: int, stop: int):
    if isinstance(batch, dict):
        return {k: v[start:stop] for k, v in batch.items()}
    return tuple(v[start:stop] for v in batch)
