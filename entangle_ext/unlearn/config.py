"""Hyperparameters of the two-stage method (method.md, "Paper settings") as dataclasses.

`UnlearnConfig.preset(name, recipe=...)` returns the published setting for "cifar100",
"tinyimagenet", "celeba", "toxigen", plus "digits" (the CPU miniature used by `entangle_ext.demo`).

``recipe="reference"`` (default) follows the authors' reference implementation;
``recipe="paper"`` switches the four documented differences to the paper's text:

=========================  ==========================  ==============================
difference                 reference                   paper
=========================  ==========================  ==============================
W2 scope (Stage 2)         per forget minibatch        whole forget set (one segment)
mean term in L̃_f           mean(−ℓ)                    mean(+ℓ)
Stage 2 momentum           v ← m·v + g_adj             none (v = g_adj)
Stage 1 dual update        g before the Adam step      g re-evaluated after the step
=========================  ==========================  ==============================
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

__all__ = ["Stage1Config", "Stage2Config", "UnlearnConfig", "PRESETS", "RECIPES"]

RECIPES = ("reference", "paper")


@dataclass
class Stage1Config:
    """Stage 1, augmented Lagrangian: min −L_f(θ) s.t. L_rem(θ) = L_rem(θ0) (method.md).

    Attributes:
        lr: Adam learning rate (no schedule).
        remote_batch_size, forget_batch_size: minibatch sizes (samples) of the D_rem loader (one
            epoch = the step budget) and of the cycling D_f loader.
        clip: c; forget samples with CE ≥ c (nats) pass no gradient (their value still counts).
        confidence_penalty: ToxiGen variant: the per-sample forget objective becomes
            clippedCE − 1/(CE + penalty_eps).
        penalty_eps: the 1e-3 of that penalty.
        mu: penalty weight μ of the augmented Lagrangian; lambda_init: initial multiplier λ.
        epochs: passes over the D_rem loader (method.md: 1).
        dual_update: "pre" (reference: λ += μ·g with g from before the step) or "post" (paper:
            g re-evaluated on the same remote batch after the step).
        adam_betas, adam_eps: Adam constants (PyTorch defaults).
    """
    lr: float = 2.5e-6
    remote_batch_size: int = 128
    forget_batch_size: int = 16
    clip: float = 10.0
    confidence_penalty: bool = False
    penalty_eps: float = 1e-3
    mu: float = 10.0
    lambda_init: float = 0.0
    epochs: int = 1
    dual_update: str = "pre"
    adam_betas: tuple = (0.9, 0.999)
    adam_eps: float = 1e-8

    def __post_init__(self):
        if self.dual_update not in ("pre", "post"):
            raise ValueError(f"Stage1Config.dual_update must be 'pre' or 'post', got {self.dual_update!r}")
        for name in ("remote_batch_size", "forget_batch_size", "epochs"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"Stage1Config.{name} must be >= 1")


@dataclass
class Stage2Config:
    """Stage 2, W-PGD (method.md).

    Attributes:
        alpha: weight α of W2² in L̃_f = (1−α)·mean term + α·W2².
        lr: plain SGD learning rate; momentum: m of v ← m·v + g_adj; use_momentum: False = paper.
        epochs: passes E over the D_adj loader.
        adjacent_batch_size: D_adj minibatch (samples).
        forget_batch_size, forget_batch_limit: g_f sums over up to ``limit`` forget minibatches
            (a fresh pass of the forget loader each step).
        remote_batch_size, remote_batch_limit: same for g_rem.
        w2_scope: "minibatch" (reference: W2² per forget minibatch, summed) or "forget_set"
            (paper: one W2² over all forget samples drawn in the step).
        forget_mean_sign: -1 (reference: mean(−ℓ)) or +1 (paper: mean(+ℓ)).
        micro_batch: max samples per forward/backward pass when accumulating g_f / g_rem; None =
            one pass over all the concatenated batches (fewest passes, most memory).
        rcond: relative cutoff of the pseudo-inverse in the projection.
    """
    alpha: float = 0.5
    lr: float = 2e-5
    momentum: float = 0.9
    use_momentum: bool = True
    epochs: int = 6
    adjacent_batch_size: int = 128
    forget_batch_size: int = 128
    forget_batch_limit: int = 10
    remote_batch_size: int = 512
    remote_batch_limit: int = 10
    w2_scope: str = "minibatch"
    forget_mean_sign: int = -1
    micro_batch: Optional[int] = None
    rcond: float = 1e-10

    def __post_init__(self):
        if self.w2_scope not in ("minibatch", "forget_set"):
            raise ValueError(f"Stage2Config.w2_scope must be 'minibatch' or 'forget_set', got {self.w2_scope!r}")
        if self.forget_mean_sign not in (-1, 1):
            raise ValueError("Stage2Config.forget_mean_sign must be -1 or +1")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"Stage2Config.alpha must be in [0, 1], got {self.alpha}")
        for name in ("adjacent_batch_size", "forget_batch_size", "forget_batch_limit",
                     "remote_batch_size", "remote_batch_limit"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"Stage2Config.{name} must be >= 1")
        if self.epochs < 0:
            raise ValueError("Stage2Config.epochs must be >= 0")
        if self.micro_batch is not None and self.micro_batch < 1:
            raise ValueError("Stage2Config.micro_batch must be None or >= 1")


@dataclass
class UnlearnConfig:
    """Full configuration of `entangle_ext.unlearn`.

    Attributes:
        stage1, stage2: the stage hyperparameters.
        recipe: "reference" or "paper" (see module docstring); informational once applied.
        seed: seeds torch/numpy/random and every data-order stream.
        deterministic: `torch.use_deterministic_algorithms(True)` (+ cuDNN deterministic).
        log_every: steps between host reads of the logged values (tqdm postfix, history, NaN check).
        checkpoint_every: steps between mid-stage checkpoints (0 = only after each stage); needs out_dir.
        eval_batch_size: batch size of the evaluation / c0 passes.
        run_stage1, run_stage2: skip a stage (e.g. α-ablations from a saved Stage-1 model).
        histogram_bins: bins of the forget-loss histogram PNG.
    """
    stage1: Stage1Config = field(default_factory=Stage1Config)
    stage2: Stage2Config = field(default_factory=Stage2Config)
    recipe: str = "reference"
    seed: int = 0
    deterministic: bool = False
    log_every: int = 10
    checkpoint_every: int = 0
    eval_batch_size: int = 512
    run_stage1: bool = True
    run_stage2: bool = True
    histogram_bins: int = 40

    def __post_init__(self):
        if self.recipe not in RECIPES:
            raise ValueError(f"recipe must be one of {RECIPES}, got {self.recipe!r}")
        if self.log_every < 1:
            raise ValueError("log_every must be >= 1")

    def with_recipe(self, recipe: str) -> "UnlearnConfig":
        """Return a copy with the four reference/paper differences set for ``recipe``.

        Raises ValueError for an unknown recipe.
        """
        if recipe not in RECIPES:
            raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
        paper = recipe == "paper"
        s1 = dataclasses.replace(self.stage1, dual_update="post" if paper else "pre")
        s2 = dataclasses.replace(self.stage2, w2_scope="forget_set" if paper else "minibatch",
                                 forget_mean_sign=1 if paper else -1, use_momentum=not paper)
        return dataclasses.replace(self, stage1=s1, stage2=s2, recipe=recipe)

    @classmethod
    def preset(cls, name: str, recipe: str = "reference", **overrides) -> "UnlearnConfig":
        """The hyperparameters of one paper setting (method.md table) or of the digits demo.

        Args:
            name: "cifar100", "tinyimagenet", "celeba", "toxigen" or "digits".
            recipe: "reference" or "paper".
            overrides: top-level UnlearnConfig fields (e.g. seed=1).
        Raises:
            ValueError: unknown preset or recipe.
        """
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
        s1, s2 = PRESETS[name]
        cfg = cls(stage1=Stage1Config(**s1), stage2=Stage2Config(**s2), **overrides)
        return cfg.with_recipe(recipe)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "UnlearnConfig":
        d = dict(d)
        s1 = dict(d.pop("stage1", {}))
        if "adam_betas" in s1:
            s1["adam_betas"] = tuple(s1["adam_betas"])
        return cls(stage1=Stage1Config(**s1), stage2=Stage2Config(**d.pop("stage2", {})), **d)


# (Stage1 kwargs, Stage2 kwargs) per setting; method.md "Paper settings".
PRESETS = {
    "cifar100": (dict(lr=2.5e-6, remote_batch_size=128, forget_batch_size=16),
                 dict(alpha=0.5, lr=2e-5, momentum=0.9, epochs=6, adjacent_batch_size=128,
                      forget_batch_size=128, forget_batch_limit=10,
                      remote_batch_size=512, remote_batch_limit=10)),
    "tinyimagenet": (dict(lr=5e-5, remote_batch_size=128, forget_batch_size=64),
                     dict(alpha=0.5, lr=2e-4, momentum=0.9, epochs=5, adjacent_batch_size=256,
                          forget_batch_size=128, forget_batch_limit=1,
                          remote_batch_size=512, remote_batch_limit=1)),
    "celeba": (dict(lr=2.5e-6, remote_batch_size=128, forget_batch_size=32),
               dict(alpha=0.5, lr=2e-5, momentum=0.9, epochs=6, adjacent_batch_size=32,
                    forget_batch_size=32, forget_batch_limit=10,
                    remote_batch_size=128, remote_batch_limit=10)),
    "toxigen": (dict(lr=2.5e-6, remote_batch_size=64, forget_batch_size=64, clip=5.0,
                     confidence_penalty=True),
                dict(alpha=0.8, lr=1e-5, momentum=0.7, epochs=2, adjacent_batch_size=64,
                     forget_batch_size=64, forget_batch_limit=10,
                     remote_batch_size=64, remote_batch_limit=10)),
    # CPU miniature (sklearn digits, parity labels, 2-layer MLP); tuned for `entangle_ext.demo`,
    # not a paper setting. Stage 1 runs several passes over the small remote set (see demo.py).
    "digits": (dict(lr=3e-4, remote_batch_size=32, forget_batch_size=16, epochs=3),
               dict(alpha=0.5, lr=2e-3, momentum=0.9, epochs=15, adjacent_batch_size=32,
                    forget_batch_size=64, forget_batch_limit=4,
                    remote_batch_size=128, remote_batch_limit=4)),
}
