"""SCRUB: the student (θ, starting at θ0) moves away from the frozen original teacher on D_f and
stays close to it, and correct, on the retain set (Kurmanji et al., 2023; docs/algorithm.md §10)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Tuple

import torch
import torch.nn.functional as F

from ..unlearn.fields import at_least, require
from ..unlearn.data import split_batch
from ..unlearn.distributed import current
from ..unlearn.model_copy import copy_model
from ..unlearn.losses import loss_logits, trainable_params
from .base import TrainConfig, UnlearningMethod, every, make_optimizer, make_presets, register_method, retain_set

__all__ = ["SCRUB", "SCRUBConfig", "distill_kl", "frozen_copy"]


class _DistillKL(torch.autograd.Function):
    """Per-sample KL(p ‖ q), p = softmax(t/T), q = softmax(s/T), (B, C) → (B,), with the exact
    gradient (q − p)/T with respect to the student logits s. p and q come from one softmax
    implementation, so where the student's logits equal the teacher's bitwise (θ = θ0) the
    gradient is exactly 0 (autograd of ``kl_div(log_softmax(s), softmax(t))`` gives round-off
    there, ~1e-17, which Adam's normalisation blows up into lr-sized steps in a direction that
    depends on the summation order: another CPU ISA or a split over ranks)."""

    @staticmethod
    def forward(ctx, s, t, T: float):
        log_q, log_p = F.log_softmax(s / T, dim=1), F.log_softmax(t / T, dim=1)
        p = log_p.exp()
        ctx.T = T
        ctx.save_for_backward(log_q, p)
        # p = 0 (teacher logit -inf) contributes 0, whatever log_q is
        return torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p)).sum(1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        log_q, p = ctx.saved_tensors
        return grad.unsqueeze(1) * (log_q.exp() - p) / ctx.T, None, None


def distill_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """KL(softmax(t/T) ‖ softmax(s/T))·T², averaged over the batch (the repdistiller ``DistillKL``
    used by SCRUB; over the global batch under several ranks, `Dist.means`), for (B, C) logits
    s (student) and t (teacher, detached); 0-d, in nats. Teacher logits of −inf give zero target
    mass. The gradient with respect to s is the exact (softmax(s/T) − softmax(t/T))·T/B, which is
    exactly zero where s equals t: SCRUB's first max step starts at θ = θ0, a stationary point
    of the KL, and takes no step there instead of following round-off (docs/algorithm.md §10).
    Not twice differentiable."""
    T = float(temperature)
    kl = _DistillKL.apply(student_logits, teacher_logits.detach(), T)
    return current().means(kl)[0] * (T * T)


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``model`` in eval mode with ``requires_grad=False`` everywhere (a teacher)."""
    t = copy_model(model, "SCRUB distils from a frozen copy of the original model (its teacher)").eval()
    for p in t.parameters():
        p.requires_grad_(False)
    return t


@dataclass
class SCRUBConfig(TrainConfig):
    """Defaults: SCRUB's large-scale setting (SGD lr 5e-4, momentum 0.9, weight decay 5e-4,
    3 epochs, retain batch 128, forget batch 32; its lr decay milestones 3, 5, 9 never fire in 3
    epochs).

    Attributes (besides `TrainConfig`):
        msteps: epochs (from the first) that start with a max pass over D_f.
        alpha, gamma: weights of the KL and the CE in the min steps (≥ 0).
        temperature: T > 0 of the distillation KL (the reference code: 1).
    """
    lr: float = 5e-4
    epochs: int = 3
    batch_size: int = 128
    forget_batch_size: int = 32
    msteps: int = 2
    budget_fields: ClassVar[Tuple[str, ...]] = ("epochs", "msteps")
    alpha: float = 0.001
    gamma: float = 0.99
    temperature: float = 4.0

    def check_ranges(self) -> None:
        super().check_ranges()
        at_least(self, 0, "msteps", "alpha", "gamma")
        require(self, self.temperature > 0, "temperature", "> 0")


_ADAM = dict(optimizer="adam", momentum=0.0, weight_decay=0.0, alpha=0.1, temperature=1.0, train_mode=False)


@register_method("scrub")
class SCRUB(UnlearningMethod):
    """Per epoch e: if e < msteps, a max pass over the forget stream (each batch ascends
    KL(teacher ‖ student)); then min steps over the retain stream (D_adj ∪ D_rem), each descending
    γ·CE + α·KL(teacher ‖ student). The teacher is `frozen_copy` of θ0 (``self.teacher``).
    "paper_code" presets: the reference run scripts (Adam, T = 1)."""
    Config = SCRUBConfig
    presets = make_presets(
        paper_code={"cifar100": dict(_ADAM, lr=5e-5, epochs=10, msteps=5, gamma=0.9, batch_size=128,
                                     forget_batch_size=192),
                    "tinyimagenet": dict(_ADAM, lr=5e-5, epochs=5, msteps=5, gamma=0.5, lr_decay=0.3,
                                         batch_size=128, forget_batch_size=128),
                    "celeba": dict(_ADAM, lr=1e-5, weight_decay=5e-4, epochs=5, msteps=3, gamma=0.9,
                                   batch_size=128, forget_batch_size=32),
                    "toxigen": dict(_ADAM, lr=1e-5, weight_decay=5e-4, epochs=5, msteps=3, gamma=0.9,
                                    batch_size=64, forget_batch_size=64)},
        original=every(train_mode=True),
        digits=dict(_ADAM, lr=3e-3, epochs=5, msteps=3, alpha=0.5, gamma=1.0, batch_size=64, forget_batch_size=32))

    def run(self, model, splits, config, *, device, seed, out_dir=None, progress=True, loop_args):
        params = trainable_params(model)
        self.teacher = teacher = frozen_copy(model)
        opt = make_optimizer(params, config)
        retain = self.stream(model, retain_set(splits), config.batch_size, "retain", seed, device)
        forget = self.stream(model, splits.source("forget"), config.forget_batch_size, "forget", seed, device)
        T, last_max = config.temperature, [torch.zeros((), device=device)]

        def kl(batch):
            inputs, y = split_batch(batch)
            with torch.no_grad():
                t = loss_logits(teacher, inputs)
            s = loss_logits(model, inputs)
            return distill_kl(s, t, T), s, y

        def step(i, batch):
            epoch, pos = divmod(i, len(retain))
            self.set_epoch_lr(opt, config, i, len(retain))
            if pos == 0 and epoch < config.msteps:
                for fb in forget.epoch_batches(epoch):
                    d, _, _ = kl(fb)
                    self.descend(opt, params, -d, config)
                    last_max[0] = d.detach()
            d, s, y = kl(batch)
            ce = current().means(F.cross_entropy(s, y, reduction="none"))[0]
            loss = config.gamma * ce + config.alpha * d
            self.descend(opt, params, loss, config)
            return loss, [ce, d, last_max[0]]

        return self.loop(retain, config.epochs, step, {"model": model, "optimizer": opt, "teacher": teacher},
                         loop_args, ["retain_ce", "retain_kl", "forget_kl"], device=device)
