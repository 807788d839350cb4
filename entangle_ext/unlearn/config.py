"""Hyperparameters of the two-stage method as dataclasses (docs/algorithm.md §8).

`UnlearnConfig.preset(name, recipe=...)` returns the published setting for "cifar100",
"tinyimagenet", "celeba", "toxigen", plus "digits" (the CPU miniature used by `entangle_ext.demo`).

``recipe="reference"`` (default) follows the authors' reference implementation, its formulas and
its loops; ``recipe="paper"`` switches the documented differences to the paper's text
(docs/algorithm.md §7):

=========================  ===============================  ==============================
difference                 reference                        paper
=========================  ===============================  ==============================
W2 scope (Stage 2)         per forget minibatch             whole forget set (one segment)
mean term in L̃_f           mean(−ℓ)                         mean(+ℓ)
Stage 2 momentum           v ← m·v + g_adj                  none (v = g_adj)
Stage 1 dual update        g before the Adam step           g re-evaluated after the step
Stage 1 forget order       first pass's order, cycled       reshuffled every pass
Gram ridge (projection)    1e-8 per parameter tensor        none (pseudo-inverse, rcond)
ToxiGen penalty            on the unclipped CE              on the clipped CE
=========================  ===============================  ==============================

Every config is checked by its ``validate()`` (types and choices from the field annotations,
then ranges), which runs at construction and again at the entry of `unlearn`, `stage1` and
`stage2`, so fields assigned after construction are checked too.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Literal, Optional, Tuple, Union

from .fields import (HISTOGRAM_BINS_MAX, HISTOGRAM_BINS_RULE, MOMENTUM_RULE, Select, StrictFields, at_least,
                     check_curve_fields, check_fields, check_seed, check_stage_switches, field_values, require)

__all__ = ["Stage1Config", "Stage2Config", "UnlearnConfig", "PRESETS", "RECIPES", "RECIPE_OF_HPARAMS", "Recipe",
           "DualUpdate", "W2Scope", "ForgetOrder", "PenaltyOn", "MicroBatch"]

Recipe = Literal["reference", "paper"]
DualUpdate = Literal["pre", "post"]          # Stage 1: g before / after the Adam step
W2Scope = Literal["minibatch", "forget_set"]  # Stage 2: W2² per forget minibatch / over all of them
ForgetOrder = Literal["cycle", "reshuffle"]   # Stage 1: replay the first pass / reshuffle each pass
PenaltyOn = Literal["ce", "clipped"]          # Stage 1: ToxiGen penalty on the unclipped / clipped CE
Amp = Literal["bf16", "auto"]
#: A run config's ``channels_last`` (entangle_ext/unlearn/memory_format.py).
ChannelsLast = Literal["auto", True, False]
Stage1Until = Optional[Literal["forget_margin"]]       # Stage 1 stopping rule (None: the fixed budget)
Stage2Until = Optional[Literal["adjacent_recovered"]]  # Stage 2 stopping rule (None: the fixed budget)
MicroBatch = Union[int, Literal["auto"], None]   # Stage 2: samples per forward pass / auto / one pass
RECIPES = typing.get_args(Recipe)
RECIPE_OF_HPARAMS = {"paper_code": "reference", "original": "paper"}
"""hparams family (``entangle_ext.unlearn(..., hparams=)``) → `UnlearnConfig` recipe: the released
code's loops, or the paper's own text."""


# ------------------------------------------------------------------------------- configs
@dataclass
class Stage1Config(StrictFields):
    """Stage 1, augmented Lagrangian: min −L_f(θ) s.t. L_rem(θ) = L_rem(θ0) (docs/algorithm.md §2).

    Attributes:
        lr: Adam learning rate (no schedule), >= 0.
        remote_batch_size, forget_batch_size: minibatch sizes (samples) of the D_rem loader (one
            epoch = the step budget) and of the cycling D_f loader.
        clip: c > 0; forget samples with CE ≥ c (nats) pass no gradient (their value still counts).
        confidence_penalty: ToxiGen variant: the per-sample forget objective becomes
            clippedCE − penalty_factor/(CE + penalty_eps).
        penalty_eps: the 1e-3 of that penalty (> 0); penalty_factor: its κ (>= 0; 1.0 in the
            reference ToxiGen run).
        penalty_on: "ce" (reference: the penalty on the unclipped CE, so its gradient reaches
            every forget sample) or "clipped" (no penalty gradient for CE ≥ c).
        forget_order: "cycle" (reference: the forget loader's first shuffled pass is replayed in
            the same order on every later pass) or "reshuffle" (a new order each pass).
        mu: penalty weight μ > 0 of the augmented Lagrangian; lambda_init: initial multiplier λ.
        epochs: passes over the D_rem loader (the paper: 1).
        max_steps: None, or a cap (>= 1) on the number of Stage-1 steps.
        dual_update: "pre" (reference: λ += μ·g with g from before the step) or "post" (paper:
            g re-evaluated on the same remote batch after the step); docs/algorithm.md §6.
        adam_betas, adam_eps: Adam constants (PyTorch defaults).
        until: None (default: the paper's fixed budget) or "forget_margin" (ours, opt-in; needs
            ``UnlearnConfig.eval_every > 0``): stop at the first curve probe where a share >=
            ``margin_fraction`` of the forget *train* subsample has CE >= ``margin`` and the
            constraint violation |g| <= ``violation_tol`` nats, else at the budget
            (docs/algorithm.md "Curves, certificate and stopping rules (ours)").
        margin: m in nats (> 0) of that rule and of the certificate; None = log C + 1 (C classes).
        margin_fraction: q in (0, 1] of the rule (default 0.9). violation_tol: >= 0, nats.
    Raises (construction and `validate`): TypeError for a wrong field type, ValueError for a
        value outside its choices or range.
    """
    lr: float = 2.5e-6
    remote_batch_size: int = 128
    forget_batch_size: int = 16
    clip: float = 10.0
    confidence_penalty: bool = False
    penalty_eps: float = 1e-3
    penalty_factor: float = 1.0
    penalty_on: PenaltyOn = "ce"
    forget_order: ForgetOrder = "cycle"
    mu: float = 10.0
    lambda_init: float = 0.0
    epochs: int = 1
    max_steps: Optional[int] = None
    dual_update: DualUpdate = "pre"
    adam_betas: Tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    until: Stage1Until = None
    margin: Optional[float] = None
    margin_fraction: float = 0.9
    violation_tol: float = 0.1

    def __post_init__(self):
        self.validate()

    def validate(self) -> "Stage1Config":
        """Check every field (see the class docstring); returns self."""
        check_fields(self)
        at_least(self, 1, "remote_batch_size", "forget_batch_size", "epochs")
        at_least(self, 0, "lr", "adam_eps", "penalty_factor")
        require(self, self.max_steps is None or self.max_steps >= 1, "max_steps", "None or >= 1")
        for n in ("clip", "penalty_eps", "mu"):
            require(self, getattr(self, n) > 0, n, "> 0")
        require(self, all(0 <= b < 1 for b in self.adam_betas), "adam_betas", "in [0, 1)")
        require(self, self.margin is None or self.margin > 0, "margin", "None or > 0")
        require(self, 0 < self.margin_fraction <= 1, "margin_fraction", "in (0, 1]")
        at_least(self, 0, "violation_tol")
        return self


@dataclass
class Stage2Config(StrictFields):
    """Stage 2, W-PGD (docs/algorithm.md §3).

    Attributes:
        alpha: weight α ∈ [0, 1] of W2² in L̃_f = (1−α)·mean term + α·W2².
        lr: plain SGD learning rate; momentum: m of v ← m·v + g_adj, in [0, 1); use_momentum:
            False = paper.
        epochs: passes E over the D_adj loader (0 = no step).
        adjacent_batch_size: D_adj minibatch (samples).
        forget_batch_size, forget_batch_limit: g_f sums over up to ``limit`` forget minibatches
            (a fresh pass of the forget loader each step; not used with ``w2_scope="forget_set"``,
            which takes every batch of the pass).
        remote_batch_size, remote_batch_limit: same for g_rem.
        w2_scope: "minibatch" (reference: W2² per forget minibatch, summed, over up to
            ``forget_batch_limit`` minibatches) or "forget_set" (paper text: one W2² over the whole
            forget set, every batch of a fresh pass each step: |D_f| / forget_batch_size batches
            per step instead of ``forget_batch_limit``; where ``micro_batch="auto"`` is one pass (off the
            CPU, several ranks) it then makes none larger than forget_batch_size × forget_batch_limit).
        forget_mean_sign: -1 (reference: mean(−ℓ)) or +1 (paper: mean(+ℓ)).
        micro_batch: max samples (>= 1) per forward/backward pass when accumulating g_f / g_rem;
            None = one pass over all the concatenated batches (fewest passes, most memory);
            "auto" (default) = bounded on CPU, one pass on other devices and under several ranks
            (`auto_micro_batch` in ``entangle_ext/unlearn/losses.py``): on CPU a pass whose largest
            activation outgrows the L3 cache is slow. Measured on a 2-core AMD EPYC (32 MiB L3),
            ResNet-18 at 32×32 (256 KiB per sample in the largest activation), fwd+bwd per
            sample: 18 ms in passes of 32 to 96 samples, 21.6 ms at 128, 25.7 ms at 256; the
            Stage-2 step of bench/bench_unlearn.py (CPU defaults): 0.93-0.99x the naive
            transcription in one pass, 1.06-1.13x in passes of 32 or 64. So "auto" takes as many
            samples as keep that activation within 16 MiB (64 here; the digits MLP: one pass).
            Any micro-batch gives the same gradient up to float round-off (docs/algorithm.md §3).
        rcond: relative eigenvalue cutoff of the pseudo-inverse in the projection
            (docs/algorithm.md §5), in [1e-15, 1); None = the projection operator's own default.
        gram_ridge: ρ >= 0 added to the diagonal of the projection's Gram matrix once per
            parameter tensor (T·ρ in all; reference: 1e-8), passed to the projection operator as
            ``ridge`` where it supports it; None = no ridge (paper: the pseudo-inverse).
        basis_every: r >= 1 (ours, not in the paper or the reference code; docs/algorithm.md §3,
            "basis_every (ours)"): recompute the projection basis g_f, g_rem (with the forget
            objective, W2² and CE values logged with it) at steps 0, r, 2r, ... only and project
            the steps in between onto the cached one; the forget/remote streams advance one pass
            per refresh. 1 (default, every recipe and preset) = the reference: a new basis every
            step. r > 1 cuts Stage 2's forget/remote passes about r-fold and changes the algorithm
            (method "two_stage_basis4" reports it as its own row).
        until: None (default: the fixed budget) or "adjacent_recovered" (ours, opt-in; needs
            ``UnlearnConfig.eval_every > 0``): stop at the first curve probe where the adjacent
            *train* subsample's accuracy is at most ``recover_delta`` below the original model's
            on the same subsample and the W2 distance of the forget-loss profile to θ̄ is
            <= ``drift_eps`` nats, else at the budget.
        recover_delta: δ >= 0 (accuracy fraction, default 0.02). drift_eps: ε >= 0 in nats
            (default 0.1), also the certificate's bound on |L̃_f(θ) − L̃_f(θ̄)|.
    Raises (construction and `validate`): TypeError for a wrong field type, ValueError for a
        value outside its choices or range.
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
    w2_scope: W2Scope = "minibatch"
    forget_mean_sign: Literal[-1, 1] = -1
    micro_batch: MicroBatch = "auto"
    rcond: Optional[float] = None
    gram_ridge: Optional[float] = 1e-8
    basis_every: int = 1
    until: Stage2Until = None
    recover_delta: float = 0.02
    drift_eps: float = 0.1

    def __post_init__(self):
        self.validate()

    def validate(self) -> "Stage2Config":
        """Check every field (see the class docstring); returns self."""
        check_fields(self)
        require(self, 0.0 <= self.alpha <= 1.0, "alpha", "in [0, 1]")
        at_least(self, 1, "adjacent_batch_size", "forget_batch_size", "forget_batch_limit",
                  "remote_batch_size", "remote_batch_limit", "basis_every")
        at_least(self, 0, "epochs", "lr")
        require(self, 0 <= self.momentum < 1, "momentum", MOMENTUM_RULE)
        require(self, self.micro_batch in (None, "auto") or self.micro_batch >= 1, "micro_batch",
                 "None, \"auto\" or >= 1")
        require(self, self.rcond is None or 1e-15 <= self.rcond < 1, "rcond",
                 "None or in [1e-15, 1)")
        require(self, self.gram_ridge is None or self.gram_ridge >= 0, "gram_ridge", "None or >= 0")
        at_least(self, 0, "recover_delta", "drift_eps")
        return self


@dataclass
class UnlearnConfig(StrictFields):
    """Full configuration of `entangle_ext.unlearn`.

    Attributes:
        stage1, stage2: the stage hyperparameters.
        recipe: "reference" or "paper" (see the module docstring); informational once applied.
        seed: seeds torch/numpy/random and every data-order stream; an int in [-2**63, 2**64 - 1]
            (torch.manual_seed's range).
        deterministic: `torch.use_deterministic_algorithms(True)` (+ cuDNN deterministic).
        log_every: steps (>= 1) between host reads of the logged values (progress bar, history,
            non-finite check).
        checkpoint_every: steps (>= 0) between mid-stage checkpoints (0 = only after each stage);
            needs out_dir.
        eval_batch_size: batch size (>= 1) of the evaluation / c0 passes.
        run_stage1, run_stage2: skip a stage (e.g. α-ablations from a saved Stage-1 model); not
            both (ValueError: nothing would run).
        histogram_bins: bins (1 to 10,000) of the forget-loss histogram PNG.
        amp: None, "bf16" or "auto": "bf16" runs every forward pass under `torch.autocast` with
            bfloat16 (parameters, gradients, optimizer state, λ/c0/μ and the W2 / projection
            arithmetic stay float32; losses are computed in float32); "auto" is "bf16" where the
            run's device has bfloat16 matrix units and None elsewhere (`resolve_amp` of
            entangle_ext/unlearn/precision.py). Only a float32 model is autocast ("bf16" and "auto"
            run as None for a float64 / float16 / bfloat16 model); the report's "amp" and its
            config say which ran. The ``cifar100`` / ``cpu`` variant of
            `entangle_ext.settings` uses "auto".
        channels_last: "auto" (default), True or False (ours, an engineering choice): True passes
            every 4-D floating input of the run (evaluations, both stages, probes) to the model in
            ``torch.channels_last`` memory format, which oneDNN's CPU convolutions run faster
            (a Stage-2 step of the ``cifar100`` / ``cpu`` model 1.3x on an AVX-512 CPU; parameters
            and gradients keep their layout, only the convolutions' rounding changes); "auto" is
            True on a CPU device for a model with a `torch.nn.Conv2d` whose pre-flight logits on
            channels-last inputs equal those on contiguous ones, False otherwise (a model that
            fails on them, e.g. with a ``.view`` of an activation, falls back to False); True
            raises ValueError for such a model (`resolve_channels_last` of
            entangle_ext/unlearn/memory_format.py). The report's "channels_last" says which ran.
        eval_every: steps (>= 0) between curve probes of each stage (0 = off, the default; a
            probe also runs at each stage's end); curve_samples: size (>= 1) of the seeded
            subsample of each train split the probes evaluate (docs/algorithm.md "Curves,
            certificate and stopping rules (ours)"). A stopping rule (``stage1.until``,
            ``stage2.until``) needs eval_every > 0.
        select: None (default: the run returns its final state) or "first_within" (ours, opt-in;
            needs eval_every > 0): the run returns the first probed state of any stage whose forget
            train-subsample accuracy is <= ``select_forget_acc`` and whose adjacent and remote
            train-subsample accuracies are at most ``select_delta`` below the original model's,
            evaluated again under the tag "selected" (the report's "final"; with an out dir also
            ``selected_model.pt``); none within: the final state, with a `SelectionWarning`. A
            resume may not change the three fields (docs/algorithm.md "Curves, certificate and
            stopping rules (ours)").
        select_forget_acc: the forget bound, a fraction in [0, 1]; None = 1/C (chance level, C
            classes). select_delta: δ in [0, 1] (accuracy fraction, default 0.02).
    Raises (construction and `validate`): TypeError for a wrong field type, ValueError for a
        value outside its choices or range (nested stage configs included).
    """
    budget_fields: ClassVar[Tuple[str, ...]] = ("stage1.epochs", "stage1.max_steps", "stage2.epochs")
    stage1: Stage1Config = field(default_factory=Stage1Config)
    stage2: Stage2Config = field(default_factory=Stage2Config)
    recipe: Recipe = "reference"
    seed: int = 0
    deterministic: bool = False
    log_every: int = 10
    checkpoint_every: int = 0
    eval_batch_size: int = 512
    run_stage1: bool = True
    run_stage2: bool = True
    histogram_bins: int = 40
    amp: Optional[Amp] = None
    channels_last: ChannelsLast = "auto"
    eval_every: int = 0
    curve_samples: int = 256
    select: Select = None
    select_forget_acc: Optional[float] = None
    select_delta: float = 0.02

    def __post_init__(self):
        self.validate()

    def validate(self) -> "UnlearnConfig":
        """Check every field and both stage configs (see the class docstring); returns self."""
        check_fields(self)
        self.stage1.validate()
        self.stage2.validate()
        at_least(self, 1, "log_every", "eval_batch_size")
        require(self, 1 <= self.histogram_bins <= HISTOGRAM_BINS_MAX, "histogram_bins", HISTOGRAM_BINS_RULE)
        at_least(self, 0, "checkpoint_every")
        check_curve_fields(self)
        check_seed(self)
        check_stage_switches(self)
        return self

    def with_recipe(self, recipe: Recipe) -> "UnlearnConfig":
        """Return a copy with the reference/paper differences (module docstring) set for ``recipe``.

        Raises ValueError for an unknown recipe.
        """
        if recipe not in RECIPES:
            raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
        paper = recipe == "paper"
        s1 = dataclasses.replace(self.stage1, dual_update="post" if paper else "pre",
                                 forget_order="reshuffle" if paper else "cycle",
                                 penalty_on="clipped" if paper else "ce")
        s2 = dataclasses.replace(self.stage2, w2_scope="forget_set" if paper else "minibatch",
                                 forget_mean_sign=1 if paper else -1, use_momentum=not paper,
                                 gram_ridge=None if paper else 1e-8)
        return dataclasses.replace(self, stage1=s1, stage2=s2, recipe=recipe)

    @classmethod
    def preset(cls, name: str, recipe: Recipe = "reference", *,
               stage1: Optional[Dict[str, Any]] = None, stage2: Optional[Dict[str, Any]] = None,
               **overrides) -> "UnlearnConfig":
        """The hyperparameters of one paper setting (docs/algorithm.md §8) or of the digits demo.

        Args:
            name: "cifar100", "tinyimagenet", "celeba", "toxigen" or "digits".
            recipe: "reference" or "paper" (docs/algorithm.md §7).
            stage1, stage2: overrides of `Stage1Config` / `Stage2Config` fields, applied after the
                recipe (so they win over it), e.g. ``preset("digits", stage1={"lr": 1e-3})``.
            overrides: top-level UnlearnConfig fields (e.g. seed=1).
        Raises:
            ValueError: unknown preset, recipe or stage field, or an override out of range;
            TypeError: an override of the wrong type.
        """
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
        s1, s2 = PRESETS[name]
        top = field_values(cls, overrides, "UnlearnConfig.preset", _STAGE_HINT)
        cfg = cls(stage1=Stage1Config(**s1), stage2=Stage2Config(**s2), **top).with_recipe(recipe)
        for attr, changes in (("stage1", stage1), ("stage2", stage2)):
            if changes is not None:
                current = getattr(cfg, attr)
                changes = field_values(type(current), changes, f"UnlearnConfig.preset({attr}=...)")
                setattr(cfg, attr, dataclasses.replace(current, **changes))
        return cfg.validate()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "UnlearnConfig":
        """Inverse of `to_dict` (also after a JSON round trip); validates. TypeError for a ``d``
        (or a ``"stage1"`` / ``"stage2"`` entry) that is not a dict; ValueError for unknown keys."""
        d = field_values(cls, d, "UnlearnConfig.from_dict")
        s1 = field_values(Stage1Config, d.pop("stage1", {}), "UnlearnConfig.from_dict (stage1)")
        s2 = field_values(Stage2Config, d.pop("stage2", {}), "UnlearnConfig.from_dict (stage2)")
        if "adam_betas" in s1 and isinstance(s1["adam_betas"], list):
            s1["adam_betas"] = tuple(s1["adam_betas"])
        return cls(stage1=Stage1Config(**s1), stage2=Stage2Config(**s2), **d)


_STAGE_HINT = " (a stage's fields, e.g. epochs or lr, go in stage1={...} / stage2={...})"

# (Stage1 kwargs, Stage2 kwargs) per setting; sources in docs/algorithm.md §8.
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
