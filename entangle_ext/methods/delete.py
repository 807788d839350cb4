"""DELETE: distil the original model into itself on D_f with the true-class logit of the teacher
masked out (Zhou et al., CVPR 2025, shaaaaron/DELETE; docs/algorithm.md §10)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..unlearn.data import split_batch
from ..unlearn.distributed import current
from ..unlearn.losses import loss_logits, trainable_params
from .base import TrainConfig, UnlearningMethod, make_optimizer, make_presets, register_method
from .scrub import frozen_copy

__all__ = ["DELETE", "DELETEConfig", "delete_targets"]


@dataclass
class DELETEConfig(TrainConfig):
    """Defaults: shaaaaron/DELETE on CIFAR-100 (SGD lr 5e-5, momentum 0.9, no weight decay,
    20 epochs, forget batch 128, train mode)."""
    lr: float = 5e-5
    weight_decay: float = 0.0
    epochs: int = 20
    forget_batch_size: int = 128
    train_mode: bool = True


def delete_targets(teacher_logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """softmax over the classes other than the true one: (B, C) teacher logits with logit y_i set
    to −inf (the original: −1e10), then softmax; row i has exactly zero mass on y_i. Needs C ≥ 2."""
    masked = teacher_logits.detach().scatter(1, y.view(-1, 1), float("-inf"))
    return F.softmax(masked, dim=1)


@register_method("delete")
class DELETE(UnlearningMethod):
    """Forget set only: each step minimises KL(`delete_targets`(teacher(x), y) ‖ student(x)) on a
    forget batch, the teacher a `frozen_copy` of θ0. Not in the reference code: "paper_code"
    presets = the original's values (CIFAR-100; Tiny-ImageNet: batch 64; CelebA and ToxiGen have
    no published values and use the CIFAR-100 ones)."""
    Config = DELETEConfig
    required_splits = ("forget",)
    presets = make_presets(paper_code={"tinyimagenet": dict(forget_batch_size=64)},
                           original={"tinyimagenet": dict(forget_batch_size=64)},
                           digits=dict(epochs=10, forget_batch_size=32))

    def run(self, model, splits, config, *, device, seed, out_dir=None, progress=True, loop_args):
        if int(self.num_classes) < 2:
            raise ValueError("DELETE needs at least 2 classes (it moves the mass off the true class)")
        params = trainable_params(model)
        self.teacher = teacher = frozen_copy(model)
        opt = make_optimizer(params, config)
        stream = self.stream(model, splits.source("forget"), config.forget_batch_size, "forget", seed, device)

        def step(i, batch):
            self.set_epoch_lr(opt, config, i, len(stream))
            inputs, y = split_batch(batch)
            with torch.no_grad():
                t = loss_logits(teacher, inputs)
            # KL per sample, then its mean over the global batch ("batchmean"; docs/algorithm.md §11)
            kl = F.kl_div(F.log_softmax(loss_logits(model, inputs), dim=1), delete_targets(t, y),
                          reduction="none").sum(1)
            loss = current().means(kl)[0]
            self.descend(opt, params, loss, config)
            return loss, []

        return self.loop(stream, config.epochs, step, {"model": model, "optimizer": opt, "teacher": teacher},
                         loop_args, device=device)
