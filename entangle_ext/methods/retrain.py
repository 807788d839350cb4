"""Retrain: train a freshly initialised model on D \\ D_f = D_adj ∪ D_rem only — the gold standard
of the gap metrics (docs/algorithm.md §10)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Tuple

import torch

from ..settings import SETTINGS
from ..train import TrainRecipe, fit
from ..unlearn.checkpoint import seed_everything
from ..unlearn.fields import field_values
from ..unlearn.inputs import state_dict_mismatch
from ..unlearn.module_state import state_module
from ..unlearn.loop import StageResult
from ..unlearn.memory_format import channels_last_active
from .base import MethodConfig, UnlearningMethod, register_method

__all__ = ["Retrain", "RetrainConfig", "reset_parameters_"]


@dataclass
class RetrainConfig(MethodConfig):
    """Attributes: recipe: the `entangle_ext.train.TrainRecipe` of the training from scratch
    (default: ``TrainRecipe()``). `entangle_ext.unlearn` also accepts a bare `TrainRecipe` as the
    config of "retrain". The training runs under the run's ``channels_last`` (this config's own
    field, as every method's; one switch per run). A ``recipe.channels_last`` True / False sets
    it when this config's own is "auto" (so a recipe resolved by `entangle_ext.settings.prepare`,
    or one built with ``channels_last=False``, trains as it says); "auto" in the recipe follows
    the run. Raises ValueError at construction when both are True / False and disagree."""
    recipe: TrainRecipe = field(default_factory=TrainRecipe)
    budget_fields: ClassVar[Tuple[str, ...]] = ("recipe.epochs",)

    def __post_init__(self):
        wanted = getattr(self.recipe, "channels_last", None)
        if isinstance(wanted, bool) and self.channels_last == "auto":   # the recipe's choice is the run's
            self.channels_last = wanted
        super().__post_init__()

    def check_ranges(self) -> None:
        wanted = self.recipe.channels_last
        if isinstance(wanted, bool) and isinstance(self.channels_last, bool) and wanted != self.channels_last:
            raise ValueError(f"RetrainConfig.recipe.channels_last={wanted} disagrees with "
                             f"RetrainConfig.channels_last={self.channels_last}: Retrain trains under the run's "
                             "channels_last; set one of them (or the recipe's to 'auto')")

    @classmethod
    def from_dict(cls, d: dict) -> "RetrainConfig":
        d = field_values(cls, d, "RetrainConfig.from_dict")
        recipe = field_values(TrainRecipe, d.pop("recipe", {}), "RetrainConfig.from_dict (recipe)")
        return cls(recipe=TrainRecipe(**recipe), **d)


def reset_parameters_(model: torch.nn.Module) -> None:
    """Re-initialise the trainable part of ``model`` in place with every module's own
    ``reset_parameters()`` (global torch RNG). Frozen parameters (``requires_grad=False``, e.g. a
    pretrained backbone) keep their values, since the training that follows would never restore
    them: a module whose own parameters are all frozen is not reset at all (its buffers, e.g.
    BatchNorm running statistics, stay too), and in a module with both, the frozen ones are put
    back after its reset. Raises ValueError, before changing anything, when a trainable parameter
    belongs to no module with ``reset_parameters`` (it would keep its trained value: pass
    ``model_fn`` instead)."""
    resettable = [m for m in model.modules() if callable(getattr(m, "reset_parameters", None))]
    covered = {id(p) for m in resettable for p in m.parameters(recurse=False)}
    missing = [n for n, p in model.named_parameters() if id(p) not in covered and p.requires_grad]
    if missing:
        raise ValueError(f"retrain cannot re-initialise {missing[:4]}{' ...' if len(missing) > 4 else ''}: no "
                         "module with reset_parameters() owns them; pass model_fn= (a function building a "
                         "fresh model) to entangle_ext.unlearn")
    for m in resettable:
        own = list(m.parameters(recurse=False))
        frozen = [(p, p.detach().clone()) for p in own if not p.requires_grad]
        if own and len(frozen) == len(own):
            continue
        m.reset_parameters()
        with torch.no_grad():
            for p, value in frozen:
                p.copy_(value)


def _presets():
    out = {name: {"paper_code": {"recipe": s.variants[0].recipe}, "original": {"recipe": s.variants[0].recipe}}
           for name, s in SETTINGS.items()}
    out["cifar100"]["original"] = {"recipe": TrainRecipe("sgd", lr=0.1, epochs=160, batch_size=256, momentum=0.9,
                                                         weight_decay=5e-4, schedule="cosine", augment=True)}
    return out


@register_method("retrain")
class Retrain(UnlearningMethod):
    """A fresh model (``model_fn()``, or ``model`` re-initialised by `reset_parameters_`) trained
    by `entangle_ext.train.train_original` (its `entangle_ext.train.fit`, whose optimizer steps are
    the report's ``steps``) on ``[splits.adjacent, splits.remote]`` — the forget
    split is never read — with ``config.recipe`` and ``config.seed`` (which also seeds the global
    generators just before the fresh weights are drawn); the weights are then loaded
    into ``model`` (updated in place like every method). The caller's weights are restored when the
    run raises (a failed step, non-finite weights, an interrupt): a failed Retrain never leaves a
    re-initialised or half-trained model behind. Presets: the setting's original-model
    recipe (`entangle_ext.settings`, default variant) under both keys; "original" on cifar100 is
    Unlearn-Sparse's retrain (SGD lr 0.1, 160 epochs; its step schedule at epochs 91/136 becomes
    cosine here). A ``model_fn`` that returns anything but a `torch.nn.Module` is a TypeError."""
    Config = RetrainConfig
    required_splits = ("adjacent", "remote")
    uses_model_fn = True
    presets = _presets()

    @staticmethod
    def adapt_config(config):
        """A bare `TrainRecipe` becomes ``RetrainConfig(recipe=...)``."""
        return RetrainConfig(recipe=config) if isinstance(config, TrainRecipe) else config

    def run(self, model, splits, config, *, device, seed, out_dir=None, progress=True, loop_args):
        saved = _saved_state(model)   # the caller's weights come back if anything below raises
        try:
            steps = self._retrain(model, splits, config, device=device, seed=seed, progress=progress)
        except BaseException:         # also KeyboardInterrupt: no re-initialised model left behind
            with torch.no_grad():
                state_module(model).load_state_dict(saved)
            raise
        return StageResult(stage=0, steps=steps)   # no per-step history; the optimizer steps it took

    def _retrain(self, model, splits, config, *, device, seed, progress) -> int:
        seed_everything(seed)   # the initial weights: a function of the seed alone (not of what ran before)
        fresh = self.model_fn() if self.model_fn is not None else None
        if fresh is None:
            reset_parameters_(model)
        elif not isinstance(fresh, torch.nn.Module):
            raise TypeError(f"model_fn must return a fresh torch.nn.Module, it returned {type(fresh).__name__}")
        else:   # before any training: its weights must load into ``model`` afterwards
            # compared (and loaded below) as the modules under any torch.compile wrapper: a compiled
            # model and a plain model_fn() (or the reverse) hold the same entries
            parts = state_dict_mismatch(state_module(fresh).state_dict(), state_module(model).state_dict(),
                                        saved_name="model_fn()'s model", own_name="the model given")
            if parts:
                raise ValueError("model_fn() built a model whose state dict does not fit the given model (another "
                                 "architecture or number of classes), so its retrained weights could not replace "
                                 "the model's: " + "; ".join(parts))
        target = model if fresh is None else fresh
        target.to(device)
        ran = channels_last_active()   # what the run's channels_last resolved to (the config's bool, if any)
        recipe = config.recipe.replace(channels_last=ran)
        steps = fit(target, [splits.source("adjacent"), splits.source("remote")], recipe, device=device,
                    seed=seed, progress=progress, desc="retrain (from scratch)")
        if fresh is not None:
            try:
                state_module(model).load_state_dict(state_module(fresh).state_dict())
            except RuntimeError as exc:
                raise ValueError(f"model_fn() built a model whose state dict does not fit the given model: {exc}") \
                    from None
        if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
            raise ValueError("retraining produced non-finite weights (lower the recipe's learning rate)")
        return steps


def _saved_state(model: torch.nn.Module) -> dict:
    """A detached copy of ``model.state_dict()`` (on the CPU; sharded DTensors copied where they are;
    of a compiled model, its module's: `state_module`)."""
    def copy(v):
        if not isinstance(v, torch.Tensor):
            return v
        return v.detach().clone() if type(v).__name__ == "DTensor" else v.detach().to("cpu", copy=True)
    return {k: copy(v) for k, v in state_module(model).state_dict().items()}
