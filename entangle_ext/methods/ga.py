"""GA (NegGrad): gradient ascent on the forget cross-entropy (docs/algorithm.md §10)."""
from __future__ import annotations

from dataclasses import dataclass

from ..unlearn.losses import mean_ce, trainable_params
from .base import TrainConfig, UnlearningMethod, every, make_optimizer, make_presets, register_method

__all__ = ["GradientAscent", "GAConfig"]

_SGD = dict(optimizer="sgd", momentum=0.0, weight_decay=0.0, epochs=10)


@dataclass
class GAConfig(TrainConfig):
    """`TrainConfig` with Unlearn-Sparse GA's defaults: SGD lr 1e-4, momentum 0.9, weight decay
    5e-4, 5 epochs, forget batch 256 (eval mode; the "original" presets add train mode)."""
    lr: float = 1e-4
    epochs: int = 5


@register_method("ga")
class GradientAscent(UnlearningMethod):
    """Maximise the mean forget CE: each step descends −mean CE(forget batch), ``config.epochs``
    passes over D_f (batches of ``forget_batch_size``). "paper_code" presets: the reference run
    scripts (SGD 1.5e-5 CIFAR, Adam 1.5e-6 Tiny, SGD 2.5e-6 CelebA/ToxiGen; 10 epochs)."""
    Config = GAConfig
    required_splits = ("forget",)
    presets = make_presets(
        paper_code={"cifar100": dict(_SGD, lr=1.5e-5, forget_batch_size=128),
                    "tinyimagenet": dict(_SGD, optimizer="adam", lr=1.5e-6, forget_batch_size=128),
                    "celeba": dict(_SGD, lr=2.5e-6, forget_batch_size=32),
                    "toxigen": dict(_SGD, lr=2.5e-6, forget_batch_size=64)},
        original=every(train_mode=True),
        digits=dict(_SGD, lr=5e-2, epochs=7, forget_batch_size=32))

    def run(self, model, splits, config, *, device, seed, out_dir=None, progress=True, loop_args):
        params = trainable_params(model)
        opt = make_optimizer(params, config)
        stream = self.stream(model, splits.source("forget"), config.forget_batch_size, "forget", seed, device)

        def step(i, batch):
            self.set_epoch_lr(opt, config, i, len(stream))
            ce = mean_ce(model, batch)
            self.descend(opt, params, -ce, config)
            return -ce, [ce]

        return self.loop(stream, config.epochs, step, {"model": model, "optimizer": opt}, loop_args,
                         ["forget_ce"], device=device)
