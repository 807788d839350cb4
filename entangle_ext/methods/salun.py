"""SalUn: a weight-saliency mask from the forget gradient, then masked random-label training; the
masked-out weights stay exactly at θ0 (Fan et al., Unlearn-Saliency; docs/algorithm.md §10)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Literal, Optional, Sequence

import torch

from ..unlearn.fields import require
from ..unlearn.losses import grads_of, mean_ce, trainable_params
from ..unlearn.precision import optimizer_tensor
from .base import ZipStream, every, make_optimizer, make_presets, register_method
from .rl import RandomLabel, RLConfig

__all__ = ["SalUn", "SalUnConfig", "saliency_mask", "MaskedUpdate"]


@dataclass
class SalUnConfig(RLConfig):
    """`RLConfig` (defaults: Unlearn-Saliency, SGD lr 0.013, momentum 0.9, weight decay 5e-4,
    10 epochs, batch 256, never-true labels) plus

    Attributes:
        mask_fraction: share of weights (element mode) or tensors (tensor mode) that train, (0, 1].
        mask_granularity: "element" (original): |Σ_batches ∇(−CE)| ranked over every scalar of
            every trainable tensor, the top ⌊fraction·P⌋ train; "tensor" (reference code): tensors
            ranked by the mean over batches of mean |∇CE|, the top ⌈fraction·T⌉ train whole.
        mask_batches: forget batches of the saliency pass (None = one full pass; reference: 50).
        objective: "rl" (original: random labels on D_f with the retain set, `RandomLabel`) or
            "ga" (reference code: β_adj·CE(D_adj) + β_rem·CE(D_rem) − CE(D_f), true labels, one
            batch of each per step, the longest stream sets the epoch, the others restart).
        adjacent_batch_size: D_adj batch of the "ga" objective (None = ``batch_size``, which is
            the D_rem batch there).
        beta_adjacent, beta_remote: β_adj, β_rem ≥ 0 of the "ga" objective.
    """
    lr: float = 0.013
    mask_fraction: float = 0.5
    mask_granularity: Literal["element", "tensor"] = "element"
    mask_batches: Optional[int] = None
    objective: Literal["rl", "ga"] = "rl"
    adjacent_batch_size: Optional[int] = None
    beta_adjacent: float = 1.0
    beta_remote: float = 1.0

    def check_ranges(self) -> None:
        super().check_ranges()
        require(self, 0 < self.mask_fraction <= 1, "mask_fraction", "in (0, 1]")
        require(self, self.mask_batches is None or self.mask_batches >= 1, "mask_batches", "None or >= 1")
        require(self, self.adjacent_batch_size is None or self.adjacent_batch_size >= 1,
                 "adjacent_batch_size", "None or >= 1")
        require(self, self.beta_adjacent >= 0, "beta_adjacent", ">= 0")
        require(self, self.beta_remote >= 0, "beta_remote", ">= 0")


def saliency_mask(model, params: Sequence[torch.Tensor], batches, fraction: float,
                  granularity: str) -> List[torch.Tensor]:
    """Boolean masks (True = trainable), one per tensor of ``params``, from the forget
    ``batches`` (an iterable of batches; gradients taken in the model's current mode).

    "element": s = |Σ_b ∇ mean CE_b| (the sign of the original's ∇(−CE) does not matter), the
    top ⌊fraction·P⌋ scalars over all tensors (`torch.topk`; exactly that many). "tensor": per
    tensor the mean over batches of mean|∇ mean CE_b|, the top ⌈fraction·T⌉ tensors.
    """
    acc, score, n = None, None, 0
    for b in batches:
        g = grads_of(mean_ce(model, b), params)
        acc = [x.detach().clone() for x in g] if acc is None else [a + x for a, x in zip(acc, g)]
        s = torch.stack([x.abs().mean() for x in g])
        score, n = (s if score is None else score + s), n + 1
    if n == 0:
        raise ValueError("the saliency pass needs at least one forget batch")
    if granularity == "tensor":
        k = max(1, math.ceil(fraction * len(params)))
        top = torch.topk(score / n, k).indices.tolist()
        return [torch.full_like(p, i in top, dtype=torch.bool) for i, p in enumerate(params)]
    flat = torch.cat([a.abs().reshape(-1) for a in acc])
    keep = torch.zeros(flat.numel(), dtype=torch.bool, device=flat.device)
    keep[torch.topk(flat, int(flat.numel() * fraction)).indices] = True
    return [m.view_as(p) for m, p in zip(keep.split([p.numel() for p in params]), params)]


class MaskedUpdate:
    """Keeps the masked-out entries (mask False) of ``params`` bit-identical to ``theta0``:
    `zero_grads` before the optimizer step, `restore` after it (weights reset to θ0 with
    `torch.where`, and the optimizer's per-parameter state — momentum, Adam moments — zeroed
    there), so neither momentum nor weight decay can move them."""

    def __init__(self, params, mask, theta0, opt: torch.optim.Optimizer):
        self.params, self.mask, self.theta0, self.opt = params, mask, theta0, opt

    def zero_grads(self) -> None:
        for p, m in zip(self.params, self.mask):
            if p.grad is not None:
                p.grad.masked_fill_(~m, 0)

    @torch.no_grad()
    def restore(self) -> None:
        for p, m, p0 in zip(self.params, self.mask, self.theta0):
            t = optimizer_tensor(self.opt, p)   # the float32 master copy of a half parameter
            t.copy_(torch.where(m, t, p0.to(t.dtype)))
            if t is not p:
                p.copy_(t)
            for v in self.opt.state.get(t, {}).values():
                if isinstance(v, torch.Tensor) and v.shape == p.shape:
                    v.masked_fill_(~m, 0)


_REF = dict(objective="ga", mask_granularity="tensor", mask_batches=50, optimizer="adamw", weight_decay=0.05,
            momentum=0.0, grad_clip=1.0, epochs=10)


@register_method("salun")
class SalUn(RandomLabel):
    """Saliency mask (`saliency_mask`, in eval mode, on a forget stream of ``forget_batch_size``;
    kept as ``self.mask``) → masked training (`MaskedUpdate` around each optimizer step) with the
    random-label step of `RandomLabel` ("rl") or the reference code's ascent objective ("ga").
    "paper_code" presets: the reference run scripts (whole-tensor mask, "ga", AdamW); there the
    masked tensors also stay fixed (the reference's AdamW decay moved them slightly)."""
    Config = SalUnConfig
    presets = make_presets(
        paper_code={"cifar100": dict(_REF, lr=1e-5, beta_remote=2.0, batch_size=256, adjacent_batch_size=64,
                                     forget_batch_size=64),
                    "tinyimagenet": dict(_REF, lr=2e-5, batch_size=128, adjacent_batch_size=128,
                                         forget_batch_size=128),
                    "celeba": dict(_REF, lr=2e-5, batch_size=128, adjacent_batch_size=32, forget_batch_size=32),
                    "toxigen": dict(_REF, lr=1e-6, epochs=2, mask_fraction=0.3, batch_size=64,
                                    adjacent_batch_size=64, forget_batch_size=64)},
        original=every(label_mode="uniform", train_mode=True),
        digits=dict(optimizer="adam", lr=1e-3, weight_decay=0.0, epochs=5, batch_size=64, forget_batch_size=32))

    def run(self, model, splits, config, *, device, seed, out_dir=None, progress=True, loop_args):
        params = trainable_params(model)
        mode = model.training
        model.eval()
        f = self.stream(model, splits.source("forget"), config.forget_batch_size, "mask", seed, device)
        self.mask = mask = saliency_mask(model, params, f.fetch_pass(0, config.mask_batches or len(f)),
                             config.mask_fraction, config.mask_granularity)
        model.train(mode)
        theta0 = [p.detach().clone() for p in params]
        opt = make_optimizer(params, config)
        masked = MaskedUpdate(params, mask, theta0, opt)
        objects = {"model": model, "optimizer": opt, "mask": mask, "theta0": theta0}
        if config.objective == "rl":
            stream = self.rl_stream(model, splits, config, seed, device)
            step = self.rl_step(model, params, opt, config, stream, len(splits.source("forget").dataset), seed,
                                before_step=masked.zero_grads, after_step=masked.restore)
            return self.loop(stream, config.epochs, step, objects, loop_args, device=device)
        stream = ZipStream({n: self.stream(model, splits.source(n), bs, n, seed, device) for n, bs in (
            ("forget", config.forget_batch_size), ("adjacent", config.adjacent_batch_size or config.batch_size),
            ("remote", config.batch_size))})

        def step(i, b):
            self.set_epoch_lr(opt, config, i, len(stream))
            ce_f = mean_ce(model, b["forget"])
            loss = config.beta_adjacent * mean_ce(model, b["adjacent"]) \
                + config.beta_remote * mean_ce(model, b["remote"]) - ce_f
            self.descend(opt, params, loss, config, masked.zero_grads)
            masked.restore()
            return loss, [ce_f]

        return self.loop(stream, config.epochs, step, objects, loop_args, ["forget_ce"], device=device)
