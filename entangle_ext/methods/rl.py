"""RL (random labels): train on D_f relabelled at random together with the retain set
(Unlearn-Saliency's ``RL``; docs/algorithm.md §10)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Optional, Tuple

import torch
import torch.nn.functional as F

from ..unlearn.data import stream_seed, split_batch, union_source
from ..unlearn.distributed import current
from ..unlearn.losses import loss_logits, trainable_params
from .base import IndexedStream, TrainConfig, UnlearningMethod, every, make_optimizer, make_presets, register_method

__all__ = ["RandomLabel", "RLConfig", "random_labels", "LabelMode"]

LabelMode = Literal["never_true", "uniform"]


@dataclass
class RLConfig(TrainConfig):
    """`TrainConfig` (defaults: Unlearn-Saliency RL, SGD lr 0.01, momentum 0.9, weight decay 5e-4,
    10 epochs, batch 256) plus

    Attributes:
        label_mode: "never_true" (default): each forget sample gets a label drawn uniformly from
            the C − 1 classes other than its own; "uniform": uniformly over all C classes, the
            original code's draw (it can hit the true label).
    """
    label_mode: LabelMode = "never_true"


def random_labels(y: torch.Tensor, num_classes: int, mode: LabelMode, generator: torch.Generator,
                  span: Optional[Tuple[int, int, int]] = None) -> torch.Tensor:
    """Random class labels for the (B,) int64 labels ``y``: uniform over the C − 1 wrong classes
    ("never_true") or over all C ("uniform"). Drawn on the CPU from ``generator``, returned on
    ``y.device`` (int64). ``span`` = (lo, hi, n): ``y`` is positions [lo, hi) of a global batch of
    n samples (a rank's part, `BatchStream.shard_span`); the draw is for all n, so every rank gets
    its part of the labels one process draws. Raises ValueError for C < 2 with "never_true"."""
    lo, hi, n = span if span is not None else (0, y.shape[0], y.shape[0])
    if mode == "never_true":
        if num_classes < 2:
            raise ValueError("random labels that are never the true one need at least 2 classes")
        shift = torch.randint(1, num_classes, (n,), generator=generator)[lo:hi]
        return (y + shift.to(y.device, non_blocking=True)) % num_classes
    return torch.randint(0, num_classes, (n,), generator=generator)[lo:hi].to(y.device, non_blocking=True)


@register_method("rl")
class RandomLabel(UnlearningMethod):
    """One shuffled stream over D_f ∪ D_adj ∪ D_rem (batch ``batch_size``); the forget samples of
    each batch get random labels (`random_labels`, a fresh draw every step from a generator
    seeded by (seed, step)); descend the mean CE of the batch. Not in the reference code:
    "paper_code" presets = the original's hyperparameters with never-true labels; "original"
    presets draw uniformly over all classes and train in train mode, as that code does."""
    Config = RLConfig
    presets = make_presets(paper_code={}, original=every(label_mode="uniform", train_mode=True),
                           digits=dict(optimizer="adam", lr=1e-3, weight_decay=0.0, epochs=5, batch_size=64))

    def rl_stream(self, model, splits, config, seed, device) -> IndexedStream:
        """The stream over the union of D_f, D_adj, D_rem (`union_source`), forget samples first
        (indices < the forget split's length); batches ``(batch, idx)``, for every kind of split."""
        data = union_source([splits.source(n) for n in ("forget", "adjacent", "remote")])
        return self.stream(model, data, config.batch_size, "train", seed, device, cls=IndexedStream)

    def rl_step(self, model, params, opt, config, stream, n_forget: int, seed: int,
                before_step: Optional[Callable[[], None]] = None,
                after_step: Optional[Callable[[], None]] = None):
        """The step function of RL on one ``(batch, idx)`` of `rl_stream` (hooks for SalUn)."""
        C = int(self.num_classes)

        def step(i, b):
            batch, idx = b
            self.set_epoch_lr(opt, config, i, len(stream))
            inputs, y = split_batch(batch)
            gen = torch.Generator().manual_seed(stream_seed(seed, f"{self.name}/labels", i))
            forget = (idx < n_forget).to(y.device, non_blocking=True)
            y = torch.where(forget, random_labels(y, C, config.label_mode, gen,
                                                  span=stream.shard_span(i % len(stream))), y)
            loss = current().means(F.cross_entropy(loss_logits(model, inputs), y, reduction="none"))[0]
            self.descend(opt, params, loss, config, before_step)
            if after_step is not None:
                after_step()
            return loss, []
        return step

    def run(self, model, splits, config, *, device, seed, out_dir=None, progress=True, loop_args):
        params = trainable_params(model)
        opt = make_optimizer(params, config)
        stream = self.rl_stream(model, splits, config, seed, device)
        step = self.rl_step(model, params, opt, config, stream, len(splits.source("forget").dataset), seed)
        return self.loop(stream, config.epochs, step, {"model": model, "optimizer": opt}, loop_args,
                         device=device)
