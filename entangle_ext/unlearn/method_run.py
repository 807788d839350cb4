"""What `entangle_ext.unlearn(..., method=<baseline>)` does around a method's ``run``: resolve the
config (explicit, preset of a setting, or from a checkpoint), evaluate θ0, time the unlearning,
evaluate the result, and write the same report, table and checkpoints as the two-stage driver
(docs/algorithm.md §10)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Type, Union

import torch

from .checkpoint import (Checkpointer, check_resume, load_resume, preserved_global_state, restore_objects,
                                  seed_everything, set_rng_state, splits_fingerprint,
                                  fingerprint_entry)
from .data import Splits
from .distributed import scope
from .evaluate import evaluate
from .lock import OutDirLock
from .loop import check_final_losses
from .inputs import check_model_and_splits, model_device, preflight, require_trainable
from .report import UnlearnResult, build_report, format_table, write_report
from .method import UnlearningMethod, warm_imports

__all__ = ["run_method", "resolve_config"]


def resolve_config(cls: Type[UnlearningMethod], config, setting: Optional[str], hparams: str,
                   ckpt: Optional[Dict[str, Any]] = None):
    """The method's config: ``config`` itself (exactly a ``cls.Config``), else the one stored in the
    checkpoint being resumed, else the ``hparams`` preset of ``setting`` (None: the defaults).
    Raises TypeError for a config of another type, ValueError for an unknown setting/hparams
    (checked also when they are unused)."""
    cls.check_arguments(setting, hparams)
    if config is None:
        if ckpt is not None:
            return cls.Config.from_dict(ckpt["config"])
        return cls.config_for(setting, hparams)
    adapt = getattr(cls, "adapt_config", None)
    if adapt is not None:
        config = adapt(config)
    if type(config) is not cls.Config:   # a subclass is another method's config (e.g. SalUn's of RL)
        raise TypeError(f"method {cls.name!r} takes a {cls.Config.__module__}.{cls.Config.__qualname__} "
                        f"config (or None for its preset), got {type(config).__name__}")
    return config


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _unlearn(cls, model, splits, config, ckpt: Dict[str, Any], saver: Checkpointer, *, num_classes: int, device,
             out, progress, model_fn) -> Tuple[List[Dict[str, float]], float]:
    """The method's run (or the finished one of the checkpoint): (history, seconds of unlearning)."""
    if ckpt.get("stage_done"):
        restore_objects({"model": model}, ckpt)
        return list(ckpt.get("history", [])), float(ckpt.get("unlearn_s", 0.0))
    method = cls(num_classes=num_classes, model_fn=model_fn)
    model.train(bool(getattr(config, "train_mode", False)))
    t = time.perf_counter()
    try:
        history = method.run(model, splits, config, device=device, seed=config.seed, out_dir=out, progress=progress,
                             loop_args=dict(log_every=config.log_every, progress=progress,
                                            checkpoint_every=config.checkpoint_every, checkpoint_fn=saver,
                                            resume_state=ckpt or None))
    finally:
        model.eval()
    _sync(device)
    seconds = time.perf_counter() - t
    saver.save("done", {"stage": cls.name, "stage_done": True, "step": len(history), "model": model.state_dict(),
                        "history": history, "unlearn_s": seconds})
    return history, seconds


def _checked(cls, splits, config, ckpt, *, setting, hparams, seed, allow_config_change: bool):
    """(validated config, splits fingerprint, accepted config changes of a resume or None): the
    checks of `run_method` that need no model, in the two-stage driver's order."""
    config = resolve_config(cls, config, setting, hparams, ckpt)
    config = (config if seed is None else config.replace(seed=seed)).validate()
    if not isinstance(splits, Splits):
        raise TypeError("splits must be an entangle_ext.Splits")
    splits.check(cls.required_splits, by=f"method {cls.name!r}")
    fingerprint = splits_fingerprint(splits)
    changes = None if ckpt is None else check_resume(ckpt, fingerprint, config.to_dict(),
                                                     allow_config_change=allow_config_change)
    return config, fingerprint, changes


def run_method(cls: Type[UnlearningMethod], model: torch.nn.Module, splits: Splits, config=None, *,
               setting: Optional[str] = None, hparams: str = "paper_code",
               model_fn: Optional[Callable[[], torch.nn.Module]] = None, seed: Optional[int] = None,
               device: Optional[Union[str, torch.device]] = None, out_dir=None, resume=None,
               allow_config_change: bool = False, progress: bool = True,
               on_checked: Optional[Callable[[], None]] = None) -> UnlearnResult:
    """Run the baseline ``cls`` on ``model`` (in place) and report it like the two-stage driver.

    Report: ``method``, ``hparams`` and ``setting`` (of the preset used; None for an explicit
    or resumed config), ``config``, ``num_classes``, ``steps``
    ({method: steps}), ``timings_s`` (``unlearn`` = wall clock of the method, evaluation
    excluded; ``eval_original``, ``eval_final``), ``evals`` ({"original", "final"}: {split: {"acc",
    "loss", "n", ...}}), ``fingerprint`` ({"splits": `splits_fingerprint`}), ``resume`` (None, or
    {"from": checkpoint path, "config_changes": {field: [checkpoint value, new value]}}),
    ``checkpoint``; files under ``out_dir`` as `entangle_ext.unlearn`.
    Randomness (data order, random labels, Retrain's initialisation) is seeded from ``seed``, which
    replaces ``config.seed`` when given (None keeps it); every global setting the run changes is restored (as `entangle_ext.unlearn`: generators,
    deterministic/cuDNN flags, threads, environment).
    Under several ranks as `entangle_ext.unlearn` (docs/algorithm.md §11). ``on_checked`` is
    called once the config, splits and model have passed their checks, before any training.
    ``resume`` / ``allow_config_change``: as `entangle_ext.unlearn` (the same checks, `load_resume`
    and `check_resume` of ``entangle_ext/unlearn/checkpoint.py``).

    Raises:
        TypeError: a config of another method, a non-Module ``model``, a non-`Splits` ``splits``,
            a ``model_fn`` that is not callable (or, for Retrain, returns no Module).
        ValueError: an unknown setting/hparams (also when a config is given), a ``model_fn`` for
            a method other than Retrain, a missing split of ``cls.required_splits``, an empty
            split, bad labels, no trainable parameters, a non-finite loss of the original model
            on any split (names the split and the sample indices; raised before any training), a
            checkpoint of another method, a resume whose splits differ, or whose config differs
            without ``allow_config_change``; OutDirInUseError (a ValueError) when another live
            run holds ``out_dir`` (after the checks, before any training); NonFiniteLossError (a
            ValueError) for a NaN/Inf loss during unlearning (names the step) or in the final
            evaluation (the run diverged).
    """
    warm_imports()
    check_model_and_splits(model, splits, "unlearn")
    cls.check_arguments(setting, hparams, model_fn)
    lock = OutDirLock(out_dir)   # taken once the checks passed (re-entrant under `entangle_ext.unlearn`)
    with lock, preserved_global_state(), scope(model) as (d, model):
        ckpt = load_resume(resume, cls.name)
        from_preset = config is None and ckpt is None
        config, fingerprint, changes = _checked(cls, splits, config, ckpt, setting=setting, hparams=hparams,
                                                seed=seed, allow_config_change=allow_config_change)
        require_trainable(model)
        device = model_device(model, device)
        model.to(device).eval()
        C = preflight(model, splits, device)
        lock.acquire(d)   # one live run per out dir: OutDirInUseError before any training
        if on_checked is not None:   # `entangle_ext.unlearn`'s reused-out-dir warning
            on_checked()
        seed_everything(config.seed)   # after the checks, as in the two-stage driver
        if ckpt is not None and "rng" in ckpt:
            set_rng_state(ckpt["rng"])
        resumed = None if ckpt is None else {"from": ckpt.get("path"), "config_changes": changes}
        ckpt = ckpt or {}
        evals: Dict[str, Dict[str, dict]] = dict(ckpt.get("evals", {}))
        timings: Dict[str, float] = {k: v for k, v in ckpt.get("timings", {}).items() if k.startswith("eval_")}

        def ev(tag):
            t = time.perf_counter()
            evals[tag] = evaluate(model, splits, device=device, batch_size=config.eval_batch_size,
                                  num_classes=C, check_finite=tag == "original")
            timings[f"eval_{tag}"] = time.perf_counter() - t

        if "original" not in evals:
            ev("original")
        out = Path(out_dir) if out_dir is not None else None
        saver = Checkpointer(out, {"method": cls.name, "config": config.to_dict(), "evals": evals,
                                   "fingerprint": fingerprint_entry(fingerprint)},
                             dynamic=lambda: {"timings": dict(timings)})   # a resume reports them
        saver.last_path = ckpt.get("path")   # until this run writes one: the one resumed from
        history, timings["unlearn"] = _unlearn(cls, model, splits, config, ckpt, saver, num_classes=C,
                                               device=device, out=out, progress=progress, model_fn=model_fn)
        ev("final")
        check_final_losses(cls.name, evals["final"], len(history), saver.last_path)
        report = build_report(config=config.to_dict(), num_classes=C, c0=None, lam=None, history=history,
                              timings=timings, evals=evals, checkpoint=saver.last_path)
        report.update(method=cls.name, hparams=hparams if from_preset else None,
                      setting=setting if from_preset else None, steps={cls.name: len(history)},
                      world_size=d.world, fingerprint=saver.common["fingerprint"], resume=resumed)
        if out is not None and d.is_main:
            out.mkdir(parents=True, exist_ok=True)
            write_report(out, report, history, evals, bins=config.histogram_bins, num_classes=C)
        table = format_table(evals)
        if progress and d.is_main:
            print(table)
        return UnlearnResult(model=model, report=report, history=history, table=table)
