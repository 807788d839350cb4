"""The method plug of every run (docs/algorithm.md §10): the registry of unlearning methods
(`register_method`, `get_method`, `available_methods`), the base class `UnlearningMethod` a method
subclasses, and `MethodConfig`, the fields every baseline's config has. It sits below the run
(`entangle_ext.unlearn`), which looks a method up here; the methods themselves
(`entangle_ext.methods`) register from above when the package is imported."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, List, Optional, Sequence, Tuple, Type

import torch

from .checkpoint import optimizer_entry
from .fields import (HISTOGRAM_BINS_MAX, HISTOGRAM_BINS_RULE, Select, StrictFields, at_least, check_curve_fields,
                     check_fields, check_seed, field_values, require)
from .data import BatchStream, Splits, has_batchnorm, require_graph
from .distributed import current
from .loop import StageLoop
from .config import Amp, ChannelsLast
from .precision import amp_scope, model_dtype

__all__ = ["METHODS", "HPARAMS", "PAPER_SETTINGS", "register_method", "get_method", "available_methods",
           "warm_imports", "MethodConfig", "UnlearningMethod"]

METHODS: Dict[str, Type["UnlearningMethod"]] = {}
"""Registered methods by name, in registration order (baselines, then the two-stage family)."""

HPARAMS = ("paper_code", "original")
"""Preset families: what the paper's released code runs / the baseline authors' own defaults."""

PAPER_SETTINGS = ("cifar100", "tinyimagenet", "celeba", "toxigen")
"""The paper's settings; every method also has a "digits" preset (our values for the CPU miniature)."""


def warm_imports() -> None:
    """Import what the first optimizer of a process imports (``torch._dynamo``: seconds on a
    loaded CPU), so that the first method timed in a process is not charged for it."""
    import torch._dynamo  # noqa: F401


def register_method(name: str) -> Callable[[type], type]:
    """Class decorator: register an `UnlearningMethod` subclass under ``name`` (sets ``cls.name``).
    Raises ValueError when the name is taken."""
    def deco(cls):
        if name in METHODS:
            raise ValueError(f"method {name!r} is already registered")
        cls.name = name
        METHODS[name] = cls
        return cls
    return deco


def available_methods() -> List[str]:
    """Names of all registered methods (baselines and the two-stage family)."""
    return list(METHODS)


def get_method(name: str) -> Type["UnlearningMethod"]:
    """The method class registered as ``name``. Raises ValueError listing every name otherwise."""
    if not isinstance(name, str) or name not in METHODS:
        raise ValueError(f"unknown unlearning method {name!r}; choose from {available_methods()}")
    return METHODS[name]


@dataclass
class MethodConfig(StrictFields):
    """Fields every baseline has. Validated like `UnlearnConfig`: at construction and again at
    the entry of `entangle_ext.unlearn` (types from the annotations, then ranges).

    Attributes:
        seed: seeds torch/numpy/random and every data stream of the run; an int in [-2**63,
            2**64 - 1] (torch.manual_seed's range).
        log_every: steps (>= 1) between host reads of the logged values (history, progress bar,
            non-finite check).
        checkpoint_every: steps (>= 0) between mid-run checkpoints (0 = only at the end); needs
            out_dir.
        eval_batch_size: batch size (>= 1) of the evaluations.
        histogram_bins: bins (1 to 10,000) of the forget-loss histogram PNG under out_dir (as
            `UnlearnConfig.histogram_bins`; a resume may change it).
        eval_every, curve_samples: the curve probes, as `UnlearnConfig`'s (0 = off, default).
        select, select_forget_acc, select_delta: checkpoint selection among the probes, as
            `UnlearnConfig`'s (None = off, default).
        amp: None (default: the parameters' dtype), "bf16" or "auto" (bf16 where the device has
            bfloat16 matrix units), as `UnlearnConfig.amp`: every forward pass of the run (the
            method's steps, its evaluations and probes) under `torch.autocast` with bfloat16; parameters, gradients and optimizer state keep the parameters'
            dtype and every loss is computed in float32 (``loss_logits`` of entangle_ext/unlearn/batch.py).
            Retrain's training from scratch follows its recipe's own ``amp`` (`TrainRecipe.amp`).
            Only a float32 model is autocast: for another dtype the run (and its report) has None.
        channels_last: "auto" (default), True or False, as `UnlearnConfig.channels_last`: the
            memory format of 4-D floating inputs in every forward pass of the run (Retrain's
            training included).
        budget_fields (class attribute, not a field): the dotted names of the fields that count
            training passes (e.g. ``("epochs",)``); `entangle_ext.compare`'s ``budget`` scales
            them. Empty: no training loop (e.g. SSD).
    Raises: TypeError for a wrong field type, ValueError for a value outside its choices/range.
    """
    budget_fields: ClassVar[Tuple[str, ...]] = ()
    seed: int = 0
    log_every: int = 10
    checkpoint_every: int = 0
    eval_batch_size: int = 512
    histogram_bins: int = 40
    eval_every: int = 0
    curve_samples: int = 256
    select: Select = None
    select_forget_acc: Optional[float] = None
    select_delta: float = 0.02
    amp: Optional[Amp] = None
    channels_last: ChannelsLast = "auto"

    def __post_init__(self):
        self.validate()

    def validate(self):
        """Check every field; returns self."""
        check_fields(self)
        at_least(self, 1, "log_every", "eval_batch_size")
        require(self, 1 <= self.histogram_bins <= HISTOGRAM_BINS_MAX, "histogram_bins", HISTOGRAM_BINS_RULE)
        at_least(self, 0, "checkpoint_every")
        check_curve_fields(self)
        check_seed(self)
        self.check_ranges()
        return self

    def check_ranges(self) -> None:
        """Range checks of a subclass's own fields (called by `validate`)."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict):
        """Inverse of `to_dict` (also after a JSON round trip); validates. TypeError for a ``d``
        that is not a dict; ValueError for unknown keys."""
        return cls(**field_values(cls, d, f"{cls.__name__}.from_dict"))

    def replace(self, **changes):
        """A validated copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)


class UnlearningMethod:
    """Base class of a registered unlearning method.

    Class attributes: ``name`` (set by `register_method`), ``Config`` (its configuration
    dataclass), ``presets`` = {setting: {"paper_code": {field: value}, "original": {...}}}
    (overrides of the ``Config`` defaults; sources in docs/algorithm.md §10) and
    ``required_splits`` (the train splits its objective reads; the run refuses a `Splits`
    without one of them before any compute).
    ``uses_model_fn`` (True for Retrain only, which builds a fresh model with it).
    Instances carry ``num_classes`` (C, probed by the run) and ``model_fn`` (Retrain only).
    """
    name: ClassVar[str] = ""
    Config: ClassVar[type] = MethodConfig
    presets: ClassVar[Dict[str, Dict[str, Dict[str, Any]]]] = {}
    required_splits: ClassVar[Tuple[str, ...]] = ("forget", "adjacent", "remote")
    uses_model_fn: ClassVar[bool] = False

    def __init__(self, num_classes: Optional[int] = None, model_fn: Optional[Callable[[], Any]] = None):
        self.num_classes, self.model_fn = num_classes, model_fn

    @classmethod
    def check_arguments(cls, setting: Optional[str] = None, hparams: str = "paper_code",
                        model_fn: Optional[Callable[[], Any]] = None) -> None:
        """Check the run arguments besides the config, whether or not they are used (an explicit
        or resumed config makes ``setting`` / ``hparams`` unused).

        Raises:
            ValueError: ``hparams`` not in `HPARAMS`; a ``setting`` without a preset of this
                method; a ``model_fn`` for a method that does not use one (all but Retrain).
            TypeError: a ``model_fn`` that is not callable.
        """
        if hparams not in HPARAMS:
            raise ValueError(f"hparams must be one of {HPARAMS}, got {hparams!r}")
        if setting is not None and setting not in cls.presets:
            raise ValueError(f"method {cls.name!r} has no preset for setting {setting!r}; "
                             f"choose from {sorted(cls.presets)}")
        if model_fn is None:
            return
        if not cls.uses_model_fn:
            users = [n for n, m in METHODS.items() if m.uses_model_fn]
            raise ValueError(f"model_fn is used by method {' / '.join(map(repr, users))} only (it builds the "
                             f"fresh model); method {cls.name!r} takes none: drop model_fn=")
        if not callable(model_fn):
            raise TypeError(f"model_fn must be a callable returning a fresh torch.nn.Module, got "
                            f"{type(model_fn).__name__}")

    @classmethod
    def config_for(cls, setting: Optional[str] = None, hparams: str = "paper_code", **overrides):
        """``Config`` with the ``hparams`` preset of ``setting`` (None: the defaults) and
        ``overrides``. Raises ValueError for an unknown setting or hparams (`check_arguments`)."""
        cls.check_arguments(setting, hparams)
        values = dict(cls.presets[setting][hparams]) if setting is not None else {}
        return cls.Config(**{**values, **overrides})

    @classmethod
    def resolve_config(cls, config, setting: Optional[str], hparams: str, ckpt: Optional[Dict[str, Any]] = None):
        """The config a run of this method uses (not yet validated): ``config`` itself (exactly a
        ``cls.Config``, after ``adapt_config`` where the method has one), else the one stored in
        the checkpoint ``ckpt`` being resumed, else the ``hparams`` preset of ``setting`` (None:
        the defaults). Raises TypeError for a config of another type, ValueError for an unknown
        setting/hparams (checked also when they are unused)."""
        cls.check_arguments(setting, hparams)
        if config is None:
            return cls.Config.from_dict(ckpt["config"]) if ckpt is not None else cls.config_for(setting, hparams)
        adapt = getattr(cls, "adapt_config", None)
        if adapt is not None:
            config = adapt(config)
        if type(config) is not cls.Config:   # a subclass is another method's config (e.g. SalUn's of RL)
            raise TypeError(f"method {cls.name!r} takes a {cls.Config.__module__}.{cls.Config.__qualname__} "
                            f"config (or None for its preset), got {type(config).__name__}")
        return config

    @classmethod
    def splits_needed(cls, config) -> Tuple[str, ...]:
        """The train splits a run with ``config`` reads (default: ``required_splits``); the run
        refuses a `Splits` without one of them before any compute."""
        return cls.required_splits

    @classmethod
    def stage_keys(cls) -> Tuple[Any, ...]:
        """The keys of the method's stages, in run order, as its checkpoints record them
        (default: one stage, the method's name)."""
        return (cls.name,)

    @classmethod
    def last_stage(cls, config) -> Any:
        """The key of the last stage a run with ``config`` runs (default: the last of
        `stage_keys`): a checkpoint at its end is a finished run (`check_changes_apply`)."""
        return cls.stage_keys()[-1]

    @classmethod
    def check_model(cls, config, model) -> None:
        """What the method asks of ``model`` beyond the lifecycle's own checks, run before the model
        is moved or any file is written (default: nothing). Raises ValueError."""

    def execute(self, run) -> Dict[str, Any]:
        """The method's part of a run (``run``: the `Run` of ``entangle_ext/unlearn/run.py``, made by
        `entangle_ext.unlearn`, after θ0 was evaluated): take the stages with ``run.stage``,
        evaluate with ``run.evaluate_after``; return the report entries the method adds
        (``steps``, and for the two-stage family ``c0`` and ``lambda_final``).

        Default (every baseline): one stage named after the method that calls `run` (in train
        mode when the config has ``train_mode``), timed as ``"unlearn"`` and checkpointed as
        ``checkpoints/done.pt``, then the evaluation ``"final"``."""
        cfg, model = run.config, run.model

        def go(loop_args):
            model.train(bool(getattr(cfg, "train_mode", False)))
            try:
                with amp_scope(run.amp):
                    return self.run(model, run.splits, cfg, device=run.device, seed=cfg.seed, out_dir=run.out,
                                    progress=run.progress, loop_args=loop_args)
            finally:
                model.eval()
        run.stage(self.name, go, timing="unlearn", tag="done")
        run.evaluate_after(self.name, "final")
        return {"steps": {self.name: run.stage_steps(self.name)}}

    def run(self, model: torch.nn.Module, splits: Splits, config, *, device: torch.device, seed: int,
            out_dir=None, progress: bool = True, loop_args: Dict[str, Any]) -> List[Dict[str, float]]:
        """Unlearn in place; returns the per-step history records. Implemented by each baseline
        (the two-stage family overrides `execute` instead). ``loop_args``: the `StageLoop`
        keywords of the run (`Run.loop_args`), which `loop` passes on. A method without per-step
        records (Retrain) returns a `StageResult` instead, whose ``steps`` the report counts."""
        raise NotImplementedError

    # ------------------------------------------------------------------ helpers for run()
    def stream(self, model: torch.nn.Module, data, batch_size: int, name: str, seed: int, device,
               cls=BatchStream, shuffle: bool = True) -> BatchStream:
        """A seeded stream named ``"<method>/<name>"`` over ``data`` (a `Source`, e.g.
        ``splits.source("forget")`` or `retain_set`, so the splits' collate function is kept),
        shuffled unless ``shuffle`` is False; its floating inputs are cast to ``model``'s dtype
        (`model_dtype`), as in the two-stage family's streams."""
        return cls(data, batch_size, shuffle=shuffle, seed=seed, name=f"{self.name}/{name}", device=device,
                   input_dtype=model_dtype(model), training=True, fold_tail=has_batchnorm(model))

    @staticmethod
    def set_epoch_lr(opt: torch.optim.Optimizer, cfg, step: int, steps_per_epoch: int) -> None:
        """lr of the epoch containing ``step``: cfg.lr · cfg.lr_decay^epoch (a pure function of the
        step, so a resumed run needs no scheduler state)."""
        lr = cfg.lr * cfg.lr_decay ** (step // steps_per_epoch)
        for group in opt.param_groups:
            group["lr"] = lr

    @staticmethod
    def descend(opt: torch.optim.Optimizer, params: Sequence[torch.Tensor], loss: torch.Tensor,
                cfg, before_step: Optional[Callable[[], None]] = None) -> None:
        """zero_grad → loss.backward() → gradients averaged over the ranks (several processes) →
        ``before_step()`` → gradient clipping → opt.step(). ValueError for a ``loss`` without an
        autograd graph (`require_graph`)."""
        opt.zero_grad(set_to_none=True)
        require_graph(loss).backward()
        current().average_grads_(params)
        if before_step is not None:
            before_step()
        if cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()

    @staticmethod
    def step_along(opt: torch.optim.Optimizer, params: Sequence[torch.Tensor], direction: Sequence[torch.Tensor],
                   cfg) -> None:
        """One optimizer step with ``.grad = direction`` (gradient clipping applied); .grad cleared."""
        for p, d in zip(params, direction):
            p.grad = d.to(p.dtype)
        if cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def loop(self, stream, epochs: int, step, objects: Dict[str, Any], loop_args: Dict[str, Any],
             keys: Sequence[str] = (), device=None, stage: Optional[str] = None):
        """Run ``step`` over ``epochs`` passes of ``stream`` with a `StageLoop` (stage id
        ``stage`` or the method name); resumes from ``loop_args["resume_state"]`` when it belongs
        to that stage (an optimizer among ``objects`` gets its saved state back but keeps the
        hyperparameters it was built with, i.e. the run's config: `optimizer_entry`). Returns the
        history records."""
        objects = {k: optimizer_entry(v) if isinstance(v, torch.optim.Optimizer) else v for k, v in objects.items()}
        la = dict(loop_args)
        stage = stage or self.name
        resume = la.pop("resume_state", None)
        if resume is not None and resume.get("stage") != stage:
            resume = None
        loop = StageLoop(stage, stage, list(keys), **la)
        _, history = loop.run(stream, epochs, step, objects=objects, resume_state=resume, device=device)
        return history
