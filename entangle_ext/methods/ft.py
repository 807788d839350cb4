"""FT: fine-tune on the retain set D_adj ∪ D_rem with cross-entropy (docs/algorithm.md §10)."""
from __future__ import annotations

from ..unlearn.losses import mean_ce, trainable_params
from .base import TrainConfig, UnlearningMethod, every, make_optimizer, make_presets, register_method, retain_set

__all__ = ["FineTune"]

_ADAM = dict(optimizer="adam", momentum=0.0, weight_decay=0.0, epochs=10, train_mode=False)


@register_method("ft")
class FineTune(UnlearningMethod):
    """Minimise the mean CE over minibatches of D_adj ∪ D_rem (``config.epochs`` passes).

    Config: `TrainConfig`; its defaults are Unlearn-Sparse FT's (SGD lr 0.01, momentum 0.9, weight
    decay 5e-4, 10 epochs, batch 256), in eval mode; the "original" presets add train mode as that
    code runs. "paper_code" presets: the reference run scripts (Adam, lr 2.5e-5 / 5e-5 / 2.5e-5 /
    2.5e-5, 10 epochs, eval mode).
    """
    Config = TrainConfig
    required_splits = ("adjacent", "remote")
    presets = make_presets(
        paper_code={"cifar100": dict(_ADAM, lr=2.5e-5, batch_size=128),
                    "tinyimagenet": dict(_ADAM, lr=5e-5, batch_size=128),
                    "celeba": dict(_ADAM, lr=2.5e-5, batch_size=128),
                    "toxigen": dict(_ADAM, lr=2.5e-5, batch_size=64)},
        original=every(train_mode=True),
        digits=dict(_ADAM, lr=1e-3, epochs=5, batch_size=64, forget_batch_size=32))

    def run(self, model, splits, config, *, device, seed, out_dir=None, progress=True, loop_args):
        params = trainable_params(model)
        opt = make_optimizer(params, config)
        stream = self.stream(model, retain_set(splits), config.batch_size, "retain", seed, device)

        def step(i, batch):
            self.set_epoch_lr(opt, config, i, len(stream))
            loss = mean_ce(model, batch)
            self.descend(opt, params, loss, config)
            return loss, []

        return self.loop(stream, config.epochs, step, {"model": model, "optimizer": opt}, loop_args,
                         device=device)
