"""The two-stage method and its ablations (docs/algorithm.md §10): "two_stage" (Stage 1 + Stage 2),
"no_w2" (α = 0, the paper's "w/o W2" row), "pgd_mean" (Stage 2 with α = 0 and no Stage 1: the
projection with the plain mean forget term), "stage1_only", and "two_stage_basis4" (ours, not
the paper's: Stage 2 with ``basis_every=4``, docs/algorithm.md §3 "basis_every (ours)"). They run
through the one run lifecycle (`entangle_ext.unlearn`, ``entangle_ext/unlearn/run.py``) with an
`UnlearnConfig`, taking its two stages (`TwoStage.execute`); each ablation only rewrites that
config."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

import torch

from ..unlearn import curves
from ..unlearn.certificate import certificate
from ..unlearn.inputs import require_one_dtype, require_trainable
from ..unlearn.config import PRESETS, RECIPE_OF_HPARAMS, UnlearnConfig
from ..unlearn.stage1_al import stage1
from ..unlearn.stages import stage2
from .base import UnlearningMethod, register_method

__all__ = ["TwoStage", "NoW2", "PGDMean", "Stage1Only", "TwoStageBasis4", "RECIPE_OF_HPARAMS"]

def _preset_name(setting: str) -> str:
    if setting in PRESETS:
        return setting
    from ..settings import get_setting   # ValueError listing the settings for an unknown name
    return get_setting(setting).preset


@register_method("two_stage")
class TwoStage(UnlearningMethod):
    """Stage 1 (augmented Lagrangian) then Stage 2 (W-PGD), docs/algorithm.md §2, §3.
    Presets: `UnlearnConfig.preset(setting, recipe)` with recipe "reference" ("paper_code") or
    "paper" ("original")."""
    Config = UnlearnConfig
    presets = {name: {h: {"recipe": r} for h, r in RECIPE_OF_HPARAMS.items()} for name in PRESETS}

    @staticmethod
    def transform(config: UnlearnConfig) -> UnlearnConfig:
        """The method's rewrite of a two-stage config (a copy; identity here)."""
        return config

    @classmethod
    def check_arguments(cls, setting: Optional[str] = None, hparams: str = "paper_code", model_fn=None) -> None:
        """As `UnlearningMethod.check_arguments`; ``setting`` may be any name of the settings
        registry (`entangle_ext.settings`) or of `PRESETS`."""
        super().check_arguments(None, hparams, model_fn)
        if setting is not None:
            _preset_name(setting)

    @classmethod
    def config_for(cls, setting: Optional[str] = None, hparams: str = "paper_code", **overrides) -> UnlearnConfig:
        """The ``hparams`` recipe of ``setting``'s preset (None: ``UnlearnConfig()``), with top-level
        ``overrides``, rewritten by `transform`. Raises ValueError for an unknown setting/hparams."""
        cls.check_arguments(setting, hparams)
        recipe = RECIPE_OF_HPARAMS[hparams]
        cfg = UnlearnConfig(**overrides).with_recipe(recipe) if setting is None else \
            UnlearnConfig.preset(_preset_name(setting), recipe=recipe, **overrides)
        return cls.transform(cfg)

    @classmethod
    def resolve_config(cls, config, setting: Optional[str], hparams: str, ckpt: Optional[Dict[str, Any]] = None):
        """As `UnlearningMethod.resolve_config`: ``config`` rewritten by `transform` (it must be an
        `UnlearnConfig`: TypeError otherwise), else the resumed checkpoint's config (already
        rewritten when it was written), else `config_for` ``setting`` / ``hparams``."""
        cls.check_arguments(setting, hparams)
        if config is None:
            return UnlearnConfig.from_dict(ckpt["config"]) if ckpt is not None else cls.config_for(setting, hparams)
        if not isinstance(config, UnlearnConfig):
            raise TypeError(f"method {cls.name!r} takes an entangle_ext.UnlearnConfig (or None for its preset), "
                            f"got {type(config).__name__}")
        return cls.transform(config)

    @classmethod
    def splits_needed(cls, config: UnlearnConfig) -> Tuple[str, ...]:
        """forget and remote (Stage 1 and Stage 2's projection), adjacent when Stage 2 runs."""
        return ("forget", "remote") + (("adjacent",) if config.run_stage2 else ())

    @classmethod
    def stage_keys(cls) -> Tuple[int, ...]:
        return (1, 2)

    @classmethod
    def last_stage(cls, config: UnlearnConfig) -> int:
        """2, or 1 for a config without Stage 2 (``run_stage2=False``)."""
        return 2 if config.run_stage2 else 1

    @classmethod
    def check_model(cls, config: UnlearnConfig, model) -> None:
        """With Stage 2: one dtype for every trainable parameter's gradient (`require_one_dtype`)."""
        if config.run_stage2:
            require_one_dtype(require_trainable(model), model)

    def execute(self, run) -> Dict[str, Any]:
        """c0 (`Run.constraint_target`) → Stage 1 (`stage1`, checkpoint ``stage1_done``, with the
        augmented Lagrangian's state) → evaluate "stage1" → Stage 2 (`stage2`, ``stage2_done``)
        → evaluate "stage2"; a stage the config switches off is skipped. With curves on, each
        stage's probe also measures the forget-margin share and the constraint violation (Stage
        1) and the W2 drift to θ̄ (Stage 2), and the opt-in stopping rules (``stage1.until``,
        ``stage2.until``) are checked there. Returns c0, the final λ and the certificate
        (``entangle_ext/unlearn/certificate.py``). Raises ValueError when a rule needs the
        original model's curve record and the resumed checkpoint was written without curves."""
        cfg = run.config
        c0 = run.constraint_target()
        margin = cfg.stage1.margin if cfg.stage1.margin is not None else curves.default_margin(run.num_classes)

        def loop_args(la):
            return dict(la, device=run.device, seed=cfg.seed, amp=run.amp, eval_batch_size=cfg.eval_batch_size)
        if cfg.run_stage1:
            run.stage(1, lambda la: stage1(run.model, run.splits, cfg.stage1, c0=c0, **loop_args(la)),
                      timing="stage1", tag="stage1_done", keep=lambda r: {"lagrangian": r.lagrangian.state_dict()},
                      results=lambda r: {"lambda_final": float(r.lam)},
                      probe_kw=dict(margin=margin, origin=run.curve_origin), rule=_stage1_rule(run))
            run.evaluate_after(1, "stage1")
        if cfg.run_stage2:
            run.stage(2, lambda la: stage2(run.model, run.splits, cfg.stage2, **loop_args(la)),
                      timing="stage2", tag="stage2_done", probe_kw=_stage2_probe_kw(run, margin),
                      rule=_stage2_rule(run))
            run.evaluate_after(2, "stage2")
        return {"c0": c0, "lambda_final": run.done.get("lambda_final"),
                "certificate": certificate(run.evals, margin=margin, eps=cfg.stage2.drift_eps)}


def _stage1_rule(run):
    """("forget_margin", predicate) when ``stage1.until`` asks for it, else None."""
    s1 = run.config.stage1
    if s1.until is None:
        return None
    _origin_for(run, "stage1.until")
    return s1.until, curves.forget_margin_rule(s1.margin_fraction, s1.violation_tol)


def _stage2_rule(run):
    """("adjacent_recovered", predicate) when ``stage2.until`` asks for it, else None."""
    s2 = run.config.stage2
    if s2.until is None:
        return None
    origin = _origin_for(run, "stage2.until")
    return s2.until, curves.adjacent_recovered_rule(origin["adjacent_acc"], s2.recover_delta, s2.drift_eps)


def _origin_for(run, field: str):
    return curves.require_origin(run.curve_origin, f"{field}={getattr(run.config, field.split('.')[0]).until!r}")


def _stage2_probe_kw(run, margin: float):
    """Stage 2's probe keywords: the margin, the origin record and w2_ref, θ̄'s per-sample forget
    CE on the curve subsample (from the evaluation of the Stage-2 entry model); {} with curves off."""
    if not run.curves_on:
        return {}
    entry = run.evals.get("stage1" if "stage1" in run.evals else "original", {}).get("forget", {})
    kw = dict(margin=margin, origin=run.curve_origin)
    if entry.get("losses"):
        idx = run.curve_probe.indices["forget"]
        kw["w2_ref"] = torch.tensor(entry["losses"], dtype=torch.float64)[idx]
    return kw


@register_method("no_w2")
class NoW2(TwoStage):
    """Both stages with α = 0 in Stage 2 (no Wasserstein-2 term)."""

    @staticmethod
    def transform(config):
        return dataclasses.replace(config, stage2=dataclasses.replace(config.stage2, alpha=0.0))


@register_method("pgd_mean")
class PGDMean(TwoStage):
    """Stage 2 only, α = 0: projected descent on D_adj keeping the mean forget loss and the remote
    loss to first order, without Stage 1."""

    @staticmethod
    def transform(config):
        return dataclasses.replace(config, run_stage1=False,
                                   stage2=dataclasses.replace(config.stage2, alpha=0.0))


@register_method("stage1_only")
class Stage1Only(TwoStage):
    """Stage 1 only (the augmented-Lagrangian ascent), no Stage 2."""
    required_splits = ("forget", "remote")

    @staticmethod
    def transform(config):
        return dataclasses.replace(config, run_stage2=False)


@register_method("two_stage_basis4")
class TwoStageBasis4(TwoStage):
    """Both stages, Stage 2 with ``basis_every=4`` (ours, not in the paper or the reference code):
    the forget/remote gradients g_f, g_rem of the projection are recomputed every 4th step and
    reused in between (about 4x fewer forget/remote passes; a different algorithm, its own row)."""

    @staticmethod
    def transform(config):
        return dataclasses.replace(config, stage2=dataclasses.replace(config.stage2, basis_every=4))
