"""NegGrad+: descend β·CE_retain − (1−β)·CE_forget (Kurmanji et al., SCRUB repository;
docs/algorithm.md §10)."""
from __future__ import annotations

from dataclasses import dataclass

from ..unlearn.fields import require
from ..unlearn.distributed import current
from ..unlearn.losses import per_sample_ce, trainable_params
from .base import (TrainConfig, UnlearningMethod, ZipStream, make_optimizer, make_presets,
                   register_method, retain_set)

__all__ = ["NegGradPlus", "NegGradPlusConfig"]


@dataclass
class NegGradPlusConfig(TrainConfig):
    """Defaults: the SCRUB repository's NegGrad+ (small-scale notebook): SGD lr 0.01 without
    momentum or weight decay, 10 epochs, retain batch 32, forget batch 64, eval mode.

    Attributes (besides `TrainConfig`):
        beta: β ∈ [0, 1], weight of the retain term.
        l2_pull: w ≥ 0 of the pull (w/2)·‖θ − θ0‖² toward the original weights inside the retain
            term (the notebook's ``l2_penalty`` with the training weight decay 5e-4).
    """
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    batch_size: int = 32
    forget_batch_size: int = 64
    beta: float = 0.95
    l2_pull: float = 5e-4

    def check_ranges(self) -> None:
        super().check_ranges()
        require(self, 0.0 <= self.beta <= 1.0, "beta", "in [0, 1]")
        require(self, self.l2_pull >= 0, "l2_pull", ">= 0")


@register_method("neggrad_plus")
class NegGradPlus(UnlearningMethod):
    """Each step, one retain batch (driving stream, D_adj ∪ D_rem) and one forget batch (the
    forget stream restarts when exhausted): loss = β·(CE_r + (w/2)‖θ−θ0‖²) − (1−β)·CE_f.
    Not in the reference code: "paper_code" presets = the original's values."""
    Config = NegGradPlusConfig
    presets = make_presets(paper_code={}, original={},
                           digits=dict(lr=5e-2, epochs=10, batch_size=32, forget_batch_size=32, beta=0.9))

    def run(self, model, splits, config, *, device, seed, out_dir=None, progress=True, loop_args):
        params = trainable_params(model)
        theta0 = [p.detach().clone() for p in params]
        opt = make_optimizer(params, config)
        stream = ZipStream({"retain": self.stream(model, retain_set(splits), config.batch_size, "retain", seed, device),
                            "forget": self.stream(model, splits.source("forget"), config.forget_batch_size, "forget",
                                                  seed, device)}, length="retain")

        def step(i, b):
            self.set_epoch_lr(opt, config, i, len(stream))
            # global means over both global batches (one all-reduce under several ranks)
            ce_r, ce_f = current().means(per_sample_ce(model, b["retain"]), per_sample_ce(model, b["forget"]))
            pull = sum(((p - p0) ** 2).sum() for p, p0 in zip(params, theta0))
            loss = config.beta * (ce_r + 0.5 * config.l2_pull * pull) - (1 - config.beta) * ce_f
            self.descend(opt, params, loss, config)
            return loss, [ce_r, ce_f]

        return self.loop(stream, config.epochs, step, {"model": model, "optimizer": opt, "theta0": theta0},
                         loop_args, ["retain_ce", "forget_ce"], device=device)
