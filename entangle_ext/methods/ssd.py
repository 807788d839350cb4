"""SSD: selective synaptic dampening — no training; the weights much more important to D_f than
to the whole training set are shrunk (Foster et al., 2024; docs/algorithm.md §10)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import torch

from ..unlearn.fields import require
from ..unlearn.data import union_source
from ..unlearn.losses import grads_of, mean_ce, trainable_params
from .base import MethodConfig, UnlearningMethod, every, make_presets, register_method

__all__ = ["SSD", "SSDConfig", "dampen_"]


@dataclass
class SSDConfig(MethodConfig):
    """Defaults: the original (if-loops/selective-synaptic-dampening, ResNet-18 sub-class
    forgetting): λ = 1, α = 10, exponent 1, batch 64.

    Attributes:
        lam: dampening constant λ > 0. alpha: selection weighting α > 0.
        exponent: exponent of the multiplier (λ·I_D/I_f)^exponent, > 0.
        lower_bound: cap of the multiplier (> 0; 1 = weights never grow).
        batch_size: minibatch of the two importance passes (no shuffling).
    """
    lam: float = 1.0
    alpha: float = 10.0
    exponent: float = 1.0
    lower_bound: float = 1.0
    batch_size: int = 64

    def check_ranges(self) -> None:
        for n in ("lam", "alpha", "exponent", "lower_bound"):
            require(self, getattr(self, n) > 0, n, "> 0")
        require(self, self.batch_size >= 1, "batch_size", ">= 1")


@torch.no_grad()
def dampen_(params: Sequence[torch.Tensor], imp_full: Sequence[torch.Tensor], imp_forget: Sequence[torch.Tensor],
            lam: float, alpha: float, exponent: float = 1.0, lower_bound: float = 1.0) -> torch.Tensor:
    """In place: every entry with I_f > α·I_D is multiplied by min(lower_bound, (λ·I_D/I_f)^exponent);
    every other entry is left bit-identical. Importances are tensors shaped like ``params``
    (squared gradients). Returns the number of dampened entries (0-d int64 tensor)."""
    n = torch.zeros((), dtype=torch.long, device=params[0].device)
    for p, d, f in zip(params, imp_full, imp_forget):
        sel = f > alpha * d
        w = torch.clamp((lam * d / f) ** exponent, max=lower_bound)
        p.copy_(torch.where(sel, p * w, p))
        n += sel.sum()
    return n


@register_method("ssd")
class SSD(UnlearningMethod):
    """Diagonal Fisher importances I = (1/B) Σ_b (∇ mean CE_b)², over the batches b of D_f and of
    the full training set D_f ∪ D_adj ∪ D_rem (eval mode, fixed order), then `dampen_`. The two
    passes run as stage loops "ssd/forget" and "ssd/full" (progress bar, non-finite check); they
    are short and are not checkpointed: a resumed SSD run starts again. "paper_code" presets: the
    reference run scripts (Tiny-ImageNet: λ = 10, α = 1, as its script passes them)."""
    Config = SSDConfig
    presets = make_presets(
        paper_code={"cifar100": dict(lam=1.0, alpha=10.0), "tinyimagenet": dict(lam=10.0, alpha=1.0),
                    "celeba": dict(lam=1.0, alpha=10.0), "toxigen": dict(lam=1.0, alpha=50.0)},
        original={**every(lam=1.0, alpha=10.0), "tinyimagenet": dict(alpha=25.0), "celeba": dict(alpha=25.0)},
        digits=dict(lam=1.0, alpha=2.0, batch_size=64))

    def importance(self, model, params, dataset, config, device, seed, name, loop_args) -> List[torch.Tensor]:
        """(1/B) Σ_b (∇ mean CE_b)² over the batches of ``dataset``, one tensor per parameter."""
        stream = self.stream(model, dataset, config.batch_size, name, seed, device, shuffle=False)
        imp = [torch.zeros_like(p) for p in params]

        def step(_, batch):
            loss = mean_ce(model, batch)   # over the global batch (docs/algorithm.md §11)
            g = grads_of(loss, params)
            torch._foreach_addcmul_(imp, g, g)
            return loss, []

        la = dict(loop_args, checkpoint_every=0, checkpoint_fn=None, resume_state=None, probe=None)   # no curves inside
        self.history += self.loop(stream, 1, step, {}, la, device=device, stage=f"ssd/{name}")
        torch._foreach_div_(imp, float(len(stream)))
        return imp

    def run(self, model, splits, config, *, device, seed, out_dir=None, progress=True, loop_args):
        params = trainable_params(model)
        model.eval()
        self.history: List[dict] = []
        i_f = self.importance(model, params, splits.source("forget"), config, device, seed, "forget", loop_args)
        full = union_source([splits.source(n) for n in ("forget", "adjacent", "remote")])
        i_d = self.importance(model, params, full, config, device, seed, "full", loop_args)
        self.dampened = dampen_(params, i_d, i_f, config.lam, config.alpha, config.exponent, config.lower_bound)
        return self.history
