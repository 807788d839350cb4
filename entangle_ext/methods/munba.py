"""MUNBa: retain and forget objectives weighted by the two-player Nash bargaining solution of
their 2×2 gradient Gram (Wu & Harandi, 2025; docs/algorithm.md §10)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ..unlearn.data import stream_seed, split_batch
from ..unlearn.distributed import current
from ..unlearn.losses import grads_of, loss_logits, mean_ce, trainable_params
from .base import TrainConfig, UnlearningMethod, ZipStream, make_optimizer, make_presets, register_method, retain_set
from .rl import LabelMode, random_labels

__all__ = ["MUNBa", "MUNBaConfig", "gram", "bargaining_weights"]


@dataclass
class MUNBaConfig(TrainConfig):
    """Defaults: JingWu321/MUNBa (SGD lr 0.01, momentum 0.9, weight decay 5e-4, 10 epochs,
    batch 256, gradient clipping at 1, train mode, retain-only steps once D_f is exhausted).

    Attributes (besides `TrainConfig`):
        label_mode: random forget labels, "uniform" over all classes (both codes) or "never_true".
        forget_cycle: restart the forget stream when exhausted (reference code) instead of
            taking retain-only steps (original).
        grad_clip: as `TrainConfig`, but applied to the bargaining steps only (the retain-only
            steps are not clipped, as in the original).
    """
    grad_clip: Optional[float] = 1.0
    train_mode: bool = True
    label_mode: LabelMode = "uniform"
    forget_cycle: bool = False


def gram(vectors: Sequence[Sequence[torch.Tensor]]) -> torch.Tensor:
    """k×k Gram matrix, float64, of k vectors each given as a list of tensors (concatenated
    implicitly: ⟨u, v⟩ = Σ_t ⟨u_t, v_t⟩). Returned on the tensors' device, no host sync."""
    k = len(vectors)
    G = torch.zeros((k, k), dtype=torch.float64, device=vectors[0][0].device)
    for i in range(k):
        for j in range(i, k):
            G[i, j] = G[j, i] = sum((a.double() * b.double()).sum() for a, b in zip(vectors[i], vectors[j]))
    return G


def bargaining_weights(G: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MUNBa's closed-form weights from the 2×2 Gram G = [[g11, g12], [g12, g22]] (retain, forget):
    α0 = √((g11·g22 − g12·√(g11·g22)) / (g11²·g22 − g11·g12² + 1e-8)),
    α1 = (1 − g11·α0²)/(g12·α0 + 1e-8), the positive solution of α ⊙ (Gα) = 1 (the bargaining
    condition). Returns (α0, α1, ok) as 0-d tensors; where not both positive (ok False) the
    weights fall back to (1, 0.1) as in both codes. No host sync."""
    g11, g12, g22 = G[0, 0], G[0, 1], G[1, 1]
    num = g11 * g22 - g12 * torch.sqrt(torch.clamp(g11 * g22, min=0))
    a0 = torch.sqrt(torch.clamp(num / (g11 * g11 * g22 - g11 * g12 * g12 + 1e-8), min=0))
    a1 = (1 - g11 * a0 * a0) / (g12 * a0 + 1e-8)
    ok = (a0 > 0) & (a1 > 0)
    return torch.where(ok, a0, 1.0), torch.where(ok, a1, 0.1), ok


_REF = dict(optimizer="sgd", momentum=0.9, weight_decay=5e-4, grad_clip=1.0, train_mode=False, forget_cycle=True)


@register_method("munba")
class MUNBa(UnlearningMethod):
    """Each step: one retain batch (driving stream, D_adj ∪ D_rem) and one forget batch with
    random labels; g_r = ∇CE_r, g_f = ∇CE_f(random labels); (α0, α1) = `bargaining_weights`
    (`gram` of g_r, g_f); the step direction is α0·g_r + α1·g_f (= ∇(α0·L_r + α1·L_f)), clipped.
    Without a forget batch: a plain retain step, not clipped (the original clips only the
    bargaining steps). "paper_code" presets: the reference run scripts
    (forget stream restarted; lr 1e-2 / 1e-3 / 1e-3 / 1e-5, epochs 5 / 5 / 5 / 3)."""
    Config = MUNBaConfig
    presets = make_presets(
        paper_code={"cifar100": dict(_REF, lr=1e-2, epochs=5, batch_size=128, forget_batch_size=128),
                    "tinyimagenet": dict(_REF, lr=1e-3, epochs=5, batch_size=128, forget_batch_size=128),
                    "celeba": dict(_REF, lr=1e-3, epochs=5, batch_size=128, forget_batch_size=32),
                    "toxigen": dict(_REF, lr=1e-5, epochs=3, batch_size=64, forget_batch_size=64)},
        original={},
        digits=dict(lr=3e-2, epochs=10, batch_size=64, forget_batch_size=32, forget_cycle=True))

    def run(self, model, splits, config, *, device, seed, out_dir=None, progress=True, loop_args):
        params = trainable_params(model)
        opt = make_optimizer(params, config)
        forget = self.stream(model, splits.source("forget"), config.forget_batch_size, "forget", seed, device)
        stream = ZipStream({"retain": self.stream(model, retain_set(splits), config.batch_size, "retain", seed, device),
                            "forget": forget}, length="retain", cycle=config.forget_cycle)
        one = torch.ones((), dtype=torch.float64, device=device)
        unclipped = dataclasses.replace(config, grad_clip=None)

        def step(i, b):
            self.set_epoch_lr(opt, config, i, len(stream))
            ce_r = mean_ce(model, b["retain"])
            if b["forget"] is None:   # a retain-only step (forget_cycle=False): unclipped, as in the original
                self.step_along(opt, params, grads_of(ce_r, params), unclipped)
                return ce_r, [ce_r, torch.zeros_like(ce_r), one, one]
            inputs, y = split_batch(b["forget"])
            gen = torch.Generator().manual_seed(stream_seed(seed, "munba/labels", i))
            # the labels one process draws for the whole forget batch (this rank's part of them:
            # ``span``), and the mean over the global batch (docs/algorithm.md §11)
            span = forget.shard_span((i % len(stream)) % len(forget))
            labels = random_labels(y, int(self.num_classes), config.label_mode, gen, span=span)
            l_f = current().means(F.cross_entropy(loss_logits(model, inputs), labels, reduction="none"))[0]
            g_r, g_f = grads_of(ce_r, params), grads_of(l_f, params)
            a0, a1, _ = bargaining_weights(gram([g_r, g_f]))
            self.step_along(opt, params, [a0.to(r.dtype) * r + a1.to(r.dtype) * f for r, f in zip(g_r, g_f)], config)
            return a0 * ce_r.detach() + a1 * l_f.detach(), [ce_r, l_f, a0, a1]

        return self.loop(stream, config.epochs, step, {"model": model, "optimizer": opt}, loop_args,
                         ["retain_ce", "forget_rl_ce", "alpha0", "alpha1"], device=device)
