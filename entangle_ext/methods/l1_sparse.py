"""ℓ1-sparse: fine-tune on the retain set plus a linearly decaying ℓ1 penalty on the weights
(Jia et al., Unlearn-Sparse; docs/algorithm.md §10)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..unlearn.fields import require
from ..unlearn.losses import mean_ce, trainable_params
from .base import TrainConfig, UnlearningMethod, every, make_optimizer, make_presets, register_method, retain_set

__all__ = ["L1Sparse", "L1SparseConfig"]


@dataclass
class L1SparseConfig(TrainConfig):
    """`TrainConfig` (defaults: Unlearn-Sparse, SGD lr 0.01, momentum 0.9, weight decay 5e-4,
    10 epochs, batch 256) plus

    Attributes:
        l1: γ ≥ 0; epoch e (of E) adds γ·(1 − e/E)·‖θ‖₁ to the retain CE. Unlearn-Sparse leaves γ
            to the user; 5e-4 is the reference code's CIFAR value.
    """
    l1: float = 5e-4

    def check_ranges(self) -> None:
        super().check_ranges()
        require(self, self.l1 >= 0, "l1", ">= 0")


_SGD = dict(optimizer="sgd", momentum=0.9, weight_decay=0.0, epochs=10)


@register_method("l1_sparse")
class L1Sparse(UnlearningMethod):
    """Descend mean CE(retain batch) + γ_e·Σ|θ| over D_adj ∪ D_rem, γ_e = γ(1 − e/E) in epoch e
    (all trainable parameters). "paper_code" presets: the reference run scripts."""
    Config = L1SparseConfig
    required_splits = ("adjacent", "remote")
    presets = make_presets(
        paper_code={"cifar100": dict(_SGD, lr=1e-3, l1=5e-4, batch_size=128),
                    "tinyimagenet": dict(_SGD, optimizer="adam", momentum=0.0, lr=2e-5, l1=2e-4, batch_size=128),
                    "celeba": dict(_SGD, lr=5e-4, l1=5e-4, batch_size=128),
                    "toxigen": dict(_SGD, lr=1e-3, l1=5e-4, batch_size=64)},
        original=every(train_mode=True),
        digits=dict(optimizer="adam", lr=1e-3, weight_decay=0.0, epochs=5, batch_size=64, l1=1e-4))

    def run(self, model, splits, config, *, device, seed, out_dir=None, progress=True, loop_args):
        params = trainable_params(model)
        opt = make_optimizer(params, config)
        stream = self.stream(model, retain_set(splits), config.batch_size, "retain", seed, device)
        epochs = max(config.epochs, 1)

        def step(i, batch):
            self.set_epoch_lr(opt, config, i, len(stream))
            gamma = config.l1 * (1.0 - (i // len(stream)) / epochs)
            ce = mean_ce(model, batch)
            norm1 = torch.stack([p.abs().sum() for p in params]).sum()
            self.descend(opt, params, ce + gamma * norm1, config)
            return ce, [norm1]

        return self.loop(stream, config.epochs, step, {"model": model, "optimizer": opt}, loop_args,
                         ["l1_norm"], device=device)
