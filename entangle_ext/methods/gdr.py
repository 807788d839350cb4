"""GDR-GMA: gradient rectification of conflicting retain/forget gradients, per parameter tensor,
plus a memory of past forget gradients (RUIYUN-ML/GDR-GMA; docs/algorithm.md §10). The
rectifications are projections computed by `entangle_ext.project_orthogonal_`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch
import torch.nn.functional as F

from ..projection import project_orthogonal_
from ..unlearn.fields import require
from ..unlearn.losses import grads_of, mean_ce, trainable_params
from .base import (Optimizer, TrainConfig, UnlearningMethod, ZipStream, make_optimizer, make_presets,
                   register_method, retain_set)

__all__ = ["GDR", "GDRConfig", "rectify_", "MemoryBank"]

Rectify = Literal["upstream", "symmetric"]


@dataclass
class GDRConfig(TrainConfig):
    """Defaults: RUIYUN-ML/GDR-GMA (AdamW lr 1e-4 with PyTorch's default weight decay 0.01,
    10 epochs, batch 256, train mode).

    Attributes (besides `TrainConfig`):
        gamma, epsilon: the forget weight λ = sigmoid(−γ·(L_retain − ε)) (γ > 0, ε ≥ 0; the
            original hard-codes 100 and 0.02).
        rectify: "upstream" (the original code: x' = x − (⟨x,y⟩/‖y‖²)·y, then
            y' = y − (⟨x,y⟩/‖x‖²)·x' with the rectified x') or "symmetric" (each against the
            other's original gradient: x' ⊥ y and y' ⊥ x).
        memory: the GMA memory bank (from the second epoch, the last tensor's forget gradient is
            also rectified against the mean of the conflicting stored ones).
    """
    optimizer: Optimizer = "adamw"
    lr: float = 1e-4
    momentum: float = 0.0
    weight_decay: float = 0.01
    train_mode: bool = True
    gamma: float = 100.0
    epsilon: float = 0.02
    rectify: Rectify = "upstream"
    memory: bool = True

    def check_ranges(self) -> None:
        super().check_ranges()
        require(self, self.gamma > 0, "gamma", "> 0")
        require(self, self.epsilon >= 0, "epsilon", ">= 0")


@torch.no_grad()
def rectify_(x: Sequence[torch.Tensor], y: Sequence[torch.Tensor], mode: Rectify = "upstream") -> torch.Tensor:
    """In place, per tensor pair (x_t, y_t) with ⟨x_t, y_t⟩ < 0 (conflict): x_t ← x_t − a·y_t,
    a = ⟨x,y⟩/‖y‖² (x_t projected off y_t by `project_orthogonal_`), and y_t ← y_t − b·x_t (mode
    "symmetric", b = ⟨x,y⟩/‖x‖², original x_t) or y_t ← y_t − b·x'_t (mode "upstream", the
    rectified x'_t). Pairs without conflict (or with a zero tensor) are left bit-identical. After
    it ⟨x'_t, y'_t⟩ ≥ 0 in both modes. Tensors: matching shapes/dtypes/devices, contiguous.
    Returns the number of conflicting tensors (0-d int64)."""
    n = torch.zeros((), dtype=torch.long, device=x[0].device)
    for xt, yt in zip(x, y):
        x0, y0 = xt.clone(), yt.clone()
        a = project_orthogonal_([xt], [[y0]])[0]
        b = project_orthogonal_([yt], [[x0]])[0]
        if mode == "upstream":
            yt.add_(y0 * (a * b).to(yt.dtype))
        conflict = a < 0
        xt.copy_(torch.where(conflict, xt, x0))
        yt.copy_(torch.where(conflict, yt, y0))
        n += conflict.long()
    return n


class MemoryBank:
    """The last ``size`` forget gradients of one tensor (flattened), for GMA; a checkpoint object."""

    def __init__(self, size: int):
        self.size, self.grads = int(size), []

    def update(self, g: torch.Tensor) -> None:
        self.grads = (self.grads + [g.detach().reshape(-1).clone()])[-self.size:]

    def conflicting_mean(self, t: torch.Tensor) -> torch.Tensor:
        """Mean of the stored gradients with negative cosine to ``t`` (zeros when none), shaped
        like ``t``. (The original sums them into its first stored tensor in place; not here.)"""
        if not self.grads:
            return torch.zeros_like(t)
        G = torch.stack(self.grads)
        w = (F.cosine_similarity(G, t.reshape(1, -1), dim=1) < 0).to(G.dtype)
        return ((w @ G) / w.sum().clamp_min(1)).view_as(t)

    def state_dict(self) -> dict:
        return {"size": self.size, "grads": [g.clone() for g in self.grads]}

    def load_state_dict(self, s: dict) -> None:
        self.size, self.grads = int(s["size"]), [g.clone() for g in s["grads"]]


_REF = dict(optimizer="adamw", lr=1e-4, weight_decay=0.01, epochs=10, train_mode=True)


@register_method("gdr")
class GDR(UnlearningMethod):
    """Each step takes one forget and one retain batch (the epoch ends with the shorter stream):
    x = ∇CE(retain), y = ∇(−CE(forget)); the last tensor's y goes into the memory bank; `rectify_`;
    from the second epoch the last tensor's y' is also rectified against the bank's conflicting
    mean; the step direction is (1−λ)·x' + λ·y', λ = sigmoid(−γ(CE_retain − ε)).
    "paper_code" presets: the reference run scripts (the same loop; ToxiGen lr 2e-5, 3 epochs)."""
    Config = GDRConfig
    presets = make_presets(
        paper_code={"cifar100": dict(_REF, batch_size=128, forget_batch_size=128),
                    "tinyimagenet": dict(_REF, batch_size=128, forget_batch_size=128),
                    "celeba": dict(_REF, batch_size=128, forget_batch_size=32),
                    "toxigen": dict(_REF, lr=2e-5, epochs=3, batch_size=64, forget_batch_size=64)},
        original={},
        digits=dict(lr=1e-3, weight_decay=0.0, epochs=10, batch_size=64, forget_batch_size=32))

    def run(self, model, splits, config, *, device, seed, out_dir=None, progress=True, loop_args):
        params = trainable_params(model)
        opt = make_optimizer(params, config)
        forget = self.stream(model, splits.source("forget"), config.forget_batch_size, "forget", seed, device)
        stream = ZipStream({"forget": forget, "retain": self.stream(model, retain_set(splits), config.batch_size,
                                                                    "retain", seed, device)}, length="min")
        bank = MemoryBank(len(forget))

        def step(i, b):
            self.set_epoch_lr(opt, config, i, len(stream))
            ce_r = mean_ce(model, b["retain"])   # global means: λ below is the same on every rank
            x = grads_of(ce_r, params)
            ce_f = mean_ce(model, b["forget"])
            y = grads_of(-ce_f, params)
            bank.update(y[-1])
            rectify_(x, y, config.rectify)
            if config.memory and i >= len(stream):
                with torch.no_grad():
                    m = bank.conflicting_mean(y[-1])
                    rectify_([y[-1]], [m], "symmetric")   # only y[-1] (the first argument) is kept
            lam = torch.sigmoid(-config.gamma * (ce_r.detach() - config.epsilon))
            self.step_along(opt, params, [(1 - lam) * xt + lam * yt for xt, yt in zip(x, y)], config)
            return ce_r, [ce_f, lam]

        return self.loop(stream, config.epochs, step, {"model": model, "optimizer": opt, "bank": bank},
                         loop_args, ["forget_ce", "lambda"], device=device)
