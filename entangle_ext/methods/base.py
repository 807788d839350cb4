"""What every baseline shares (docs/algorithm.md §10): `TrainConfig`, optimizers, data streams
over the retain set, the optimisation step and the run of a `StageLoop` (progress bar,
device-side logging, non-finite detection, checkpoints, resume).

A baseline is one small class::

    @register_method("ga")
    class GradientAscent(UnlearningMethod):
        Config = TrainConfig
        presets = {"cifar100": {"paper_code": {...}, "original": {...}}, ...}

        def run(self, model, splits, config, *, device, seed, out_dir, progress, loop_args):
            ...                       # build streams and a step function
            return self.loop(stream, config.epochs, step, objects, loop_args, keys, device)

and is called as ``entangle_ext.unlearn(model, splits, method="ga")`` (the run does the
evaluation, timing, report and checkpoint plumbing around ``run``). Under several ranks
(docs/algorithm.md §11) the streams give each rank its part of every global batch, so a method
writes its losses as global means (``from entangle_ext.unlearn.losses import mean_ce``, `Dist.means`) and takes
its steps with `descend` / `step_along` / ``grads_of``, which average the gradients over the ranks.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Iterable, Iterator, List, Literal, Optional, Sequence, Tuple

import torch

from ..unlearn.fields import MOMENTUM_RULE, at_least, require
from ..unlearn.data import BatchStream, Source, Splits, union_source
from ..unlearn.precision import master_weight_optimizer
# the registry and the base classes live below the run (entangle_ext/unlearn/method.py); the
# baselines import them from here, with what they share
from ..unlearn.method import (HPARAMS, METHODS, PAPER_SETTINGS, MethodConfig, UnlearningMethod,  # noqa: F401
                              available_methods, get_method, register_method)

__all__ = ["METHODS", "HPARAMS", "PAPER_SETTINGS", "register_method", "get_method",
           "available_methods", "MethodConfig", "TrainConfig", "UnlearningMethod", "ZipStream",
           "IndexedStream", "Optimizer", "retain_set", "make_optimizer", "make_presets", "every"]

Optimizer = Literal["sgd", "adam", "adamw"]


def every(**fields) -> Dict[str, Dict[str, Any]]:
    """The same overrides for every paper setting."""
    return {s: dict(fields) for s in PAPER_SETTINGS}


def make_presets(paper_code: Dict[str, Dict[str, Any]], original: Dict[str, Dict[str, Any]],
                 digits: Dict[str, Any]) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """{setting: {"paper_code": overrides, "original": overrides}} for the paper settings (missing
    settings get no overrides) plus "digits" (our values under both keys)."""
    out = {s: {"paper_code": dict(paper_code.get(s, {})), "original": dict(original.get(s, {}))}
           for s in PAPER_SETTINGS}
    out["digits"] = {"paper_code": dict(digits), "original": dict(digits)}
    return out


@dataclass
class TrainConfig(MethodConfig):
    """A baseline that trains with a torch optimizer. Defaults: the original authors' common
    setting (SGD lr 0.01, momentum 0.9, weight decay 5e-4, 10 epochs, batch 256; Unlearn-Sparse /
    Unlearn-Saliency, docs/algorithm.md §10).

    Attributes:
        optimizer: "sgd" (with ``momentum``), "adam" or "adamw" (PyTorch default betas/eps).
        lr: learning rate (>= 0); lr_decay: factor (> 0) applied after every epoch
            (``ExponentialLR``; 1 = constant).
        momentum, weight_decay: optimizer constants (>= 0; weight decay is L2 for SGD/Adam,
            decoupled for AdamW).
        epochs: passes (>= 0) over the method's driving stream.
        batch_size: retain-set (or driving) minibatch in samples; forget_batch_size: forget minibatch.
        grad_clip: max global gradient norm (`clip_grad_norm_`), None = no clipping.
        train_mode: run the model in train mode (BatchNorm statistics update, dropout on) while
            unlearning; evaluation is always in eval mode.
    """
    budget_fields: ClassVar[Tuple[str, ...]] = ("epochs",)
    optimizer: Optimizer = "sgd"
    lr: float = 0.01
    lr_decay: float = 1.0
    momentum: float = 0.9
    weight_decay: float = 5e-4
    epochs: int = 10
    batch_size: int = 256
    forget_batch_size: int = 256
    grad_clip: Optional[float] = None
    train_mode: bool = False

    def check_ranges(self) -> None:
        at_least(self, 0, "lr", "weight_decay", "epochs")
        require(self, 0 <= self.momentum < 1, "momentum", MOMENTUM_RULE)
        at_least(self, 1, "batch_size", "forget_batch_size")
        require(self, self.lr_decay > 0, "lr_decay", "> 0")
        require(self, self.grad_clip is None or self.grad_clip > 0, "grad_clip", "None or > 0")


# --------------------------------------------------------------------------------- data
def retain_set(splits: Splits) -> Source:
    """D_adj ∪ D_rem as one `Source` (`union_source` of ``splits.source("adjacent")`` and
    ``splits.source("remote")``: concatenated tensors when both are tensor datasets, else a
    ConcatDataset batched with the splits' collate function)."""
    return union_source([splits.source("adjacent"), splits.source("remote")])


class IndexedStream(BatchStream):
    """A `BatchStream` whose batches come with their dataset indices: ``(batch, idx)``, idx a
    (B,) int64 CPU tensor (e.g. to tell forget from retain samples in a union), for every kind of
    split (tensors indexed directly, other datasets loaded through a DataLoader)."""

    def fetch(self, idx: torch.Tensor):
        return super().fetch(idx), idx

    def _load(self, plan: Iterable[torch.Tensor]) -> Iterator[Any]:
        if self.tensors is not None:
            return super()._load(plan)          # batches come from `fetch`, with their indices
        sent: collections.deque = collections.deque()   # FIFO: the loader delivers in order

        def kept():
            for idx in plan:
                sent.append(idx)
                yield idx
        return ((b, sent.popleft()) for b in super()._load(kept()))


class ZipStream:
    """Several `BatchStream`s stepped together, one batch of each per step (``zip`` of loaders).

    An epoch has ``length`` steps: "max" / "min" of the streams' lengths, or the length of the
    stream of that name. Epoch e of each stream is its own shuffled pass e; a stream shorter than
    the epoch restarts with a fresh pass (``cycle=True``; pass e·R + r for its r-th restart, R the
    restarts per epoch) or yields None once exhausted (``cycle=False``). Orders are a pure
    function of the step, so a resumed run needs no stream state.
    """

    def __init__(self, streams: Dict[str, BatchStream], length: str = "max", cycle: bool = True):
        lens = {k: len(s) for k, s in streams.items()}
        if length not in ("max", "min") and length not in lens:
            raise ValueError(f"length must be 'max', 'min' or one of {list(lens)}, got {length!r}")
        self.n = max(lens.values()) if length == "max" else min(lens.values()) if length == "min" \
            else lens[length]
        self.streams, self.cycle = streams, cycle

    def __len__(self) -> int:
        return self.n

    def epoch_batches(self, epoch: int, start: int = 0):
        orders: Dict[tuple, List[torch.Tensor]] = {}
        for p in range(start, self.n):
            out = {}
            for k, s in self.streams.items():
                L = len(s)
                if p >= L and not self.cycle:
                    out[k] = None
                    continue
                sub = epoch * (-(-self.n // L)) + p // L
                if (k, sub) not in orders:
                    orders[(k, sub)] = s.batch_indices(sub)
                out[k] = s.fetch(orders[(k, sub)][p % L])
            yield out


# --------------------------------------------------------------------------------- training
def make_optimizer(params: Sequence[torch.Tensor], cfg: TrainConfig) -> torch.optim.Optimizer:
    """The `torch.optim` optimizer of ``cfg`` over ``params``, stepping float32 master copies of
    float16/bfloat16 parameters (`master_weight_optimizer`: used as a plain optimizer)."""
    if cfg.optimizer == "sgd":
        return master_weight_optimizer(torch.optim.SGD, params, lr=cfg.lr, momentum=cfg.momentum,
                                       weight_decay=cfg.weight_decay)
    cls = torch.optim.Adam if cfg.optimizer == "adam" else torch.optim.AdamW
    return master_weight_optimizer(cls, params, lr=cfg.lr, weight_decay=cfg.weight_decay)
