"""`entangle_ext.unlearn`: evaluate the original model → Stage 1 → evaluate → Stage 2 → evaluate
→ report (docs/algorithm.md §2, §3)."""
from __future__ import annotations

import copy
import dataclasses
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Union

import torch

from .checkpoint import (Checkpointer, check_resume, load_resume, preserved_global_state, restore_objects,
                         seed_everything, set_rng_state, splits_fingerprint,
                         fingerprint_entry)
from .config import UnlearnConfig
from .data import Splits
from .distributed import current, scope, unwrap
from .evaluate import evaluate
from .inputs import check_model_and_splits, model_device, preflight, require_trainable, training_flags_kept
from .lock import OutDirLock
from .loop import check_final_losses
from .method import get_method
from .method_run import run_method
from .report import UnlearnResult, build_report, format_table, write_report
from .stages import stage1, stage2

__all__ = ["unlearn", "UnlearnResult", "OutDirReusedWarning"]


def unlearn(model: torch.nn.Module, splits: Splits, config: Optional[UnlearnConfig] = None, *,
            method: str = "two_stage", setting: Optional[str] = None, hparams: str = "paper_code",
            model_fn=None, seed: Optional[int] = None, device: Optional[Union[str, torch.device]] = None,
            out_dir: Optional[Union[str, Path]] = None,
            resume: Optional[Union[str, Path, Dict[str, Any]]] = None,
            allow_config_change: bool = False, inplace: bool = True,
            progress: bool = True) -> UnlearnResult:
    """Run the two-stage method (docs/algorithm.md §2, §3), or the baseline ``method``, on ``model``
    and report the three splits.

    Hyperparameters: ``config``; else the preset of ``setting`` (e.g. ``setting="digits"``); with
    neither, ``UnlearnConfig()`` = the CIFAR-100 preset (ResNet-18 scale: Stage-1 lr 2.5e-6,
    Stage-2 lr 2e-5 for 6 epochs of at most 10 forget/remote batches), which may change a small
    or different model very little: pass ``setting=`` or a config for anything else
    (docs/algorithm.md §8).

    Steps: evaluate θ0 on all splits (c0 = its remote-train mean CE; a non-finite per-sample loss
    stops here, naming the split and samples) → `stage1` (augmented Lagrangian) → evaluate →
    `stage2` (W-PGD) → evaluate → table, JSON report, histogram PNG.

    Args:
        model: a `torch.nn.Module` classifier returning (B, C) logits (tensor, tuple or object
            with ``.logits``); moved to ``device`` (it stays there); in eval mode during the run
            (a baseline may train some steps in train mode), and every submodule's ``training``
            flag is set back to what it was when ``unlearn`` returns or raises. float32/float64,
            or float16/bfloat16 (two-stage family: float32 master weights, optimizer state, λ,
            c0, μ; a baseline's torch optimizer updates the weights in their own dtype); floating
            inputs are cast to the model's dtype; any memory format (e.g. channels_last).
        splits: `Splits` (forget/adjacent/remote train + optional held-out; Datasets or
            DataLoaders; ``adjacent`` may be None when ``config.run_stage2`` is False).
        config: `UnlearnConfig` (None: the preset of ``setting``, else ``UnlearnConfig()``, i.e.
            the CIFAR-100 hyperparameters, see above); validated here, so fields assigned after
            construction are checked too. For a baseline ``method``: that method's Config (None:
            its preset, docs/algorithm.md §10).
        method: a name of `entangle_ext.available_methods()`: "two_stage" (this method),
            its ablations "no_w2", "pgd_mean", "stage1_only", "two_stage_basis4" (rewrite the UnlearnConfig), or a
            baseline (run by `entangle_ext.methods.run_method`; same report structure).
        setting, hparams: when ``config`` is None, the preset of that setting ("digits",
            "cifar100", ...) in the family "paper_code" (the released code; recipe "reference")
            or "original" (the baseline authors' defaults; the paper's recipe for the two-stage
            family). Both are checked even when a config (or a resumed one) leaves them unused.
        model_fn: "retrain" only (a ValueError for any other method): a callable building a
            fresh `torch.nn.Module` (None: Retrain re-initialises ``model``).
        seed: the run's seed, replacing ``config.seed`` (of an explicit, preset or resumed
            config; None keeps it): data order, random labels, re-initialisation, every stream.
        device: "cpu"/"cuda"/torch.device (default: the model's device).
        out_dir: writes ``report.json``, ``forget_loss_hist.png``, ``history.json`` and
            ``checkpoints/`` (after each stage, every ``config.checkpoint_every`` steps, and on
            Ctrl-C / SIGTERM). A directory that already holds a run (its report.json or
            checkpoints/) is overwritten, with an `OutDirReusedWarning`, unless ``resume`` is given.
            One live run per dir: the run locks it (``OUT/.entangle_ext.lock``, an OS lock that
            ends with the process, so a killed run leaves no stale lock) from its checks to its
            return, and a second run into a locked dir raises `OutDirInUseError`.
        resume: checkpoint path / out dir / loaded dict; continues from that point (``config``
            None: the checkpoint's config), for every method. The checkpoint must have been
            written by ``method`` itself (not by another member of the two-stage family, nor a
            baseline), the splits must be those of the checkpoint, and the config too (except
            logging/checkpoint intervals, histogram bins, run_stage2); ``report["resume"]``
            records where the run resumed from.
        allow_config_change: accept a config that differs from the checkpoint's (the differences
            are recorded in ``report["resume"]["config_changes"]``) and apply it from the resume
            point on (run objects saved in the checkpoint, e.g. optimizer state, a SalUn mask,
            keep their saved values; optimizer hyperparameters are the new config's).
        inplace: True (default): ``model`` itself is updated (its weights change); False: a deep
            copy is unlearned and returned, ``model`` is left untouched (not for FSDP models,
            which cannot be copied). When the call raises, ``model`` (with inplace=True) holds
            the weights of the last step taken — its original weights when no step was taken
            (the checks, pre-flight and evaluations change nothing) — and a checkpoint (with
            ``out_dir``) is what resumes; Retrain, whose steps train a re-initialised model,
            restores the original weights instead.
        progress: tqdm bars (rank 0 only under several ranks).
    Several processes (``torchrun``; docs/algorithm.md §11): when `torch.distributed` is
    initialised with more than one rank, every rank calls ``unlearn`` with the same arguments and
    a DDP-wrapped, plain (replicated; broadcast from rank 0) or FSDP (``fully_shard``) model; the
    batch sizes of the config are global, the result equals one process's with the same seed (up
    to round-off), only rank 0 writes files and prints, and a resume needs the same number of
    ranks.
    Global state: the run seeds python/numpy/torch from ``config.seed`` (or ``seed``) and may switch
    deterministic algorithms on; every global setting it changes (generators, deterministic and
    cuDNN flags, thread count, CUBLAS_WORKSPACE_CONFIG) is restored on return, also on error.
    Returns:
        `UnlearnResult` (model, report, history, table); ``report["method"]``,
        ``report["evals"]["final"]`` (the last evaluation), ``report["timings_s"]["unlearn"]``
        (seconds of unlearning, evaluation excluded) and ``report["hparams"]`` /
        ``report["setting"]`` (the preset the config came from; None for an explicit or resumed
        config) exist for every method.
    Warns:
        OutDirReusedWarning (a UserWarning, ``entangle_ext.OutDirReusedWarning``): ``out_dir``
            already holds a run and no ``resume`` is given; it names what is overwritten.
            Emitted after the config, splits and model have passed their checks (a call that
            raises for bad input does not also warn), before any training.
    Raises:
        TypeError: ``model`` is not a `torch.nn.Module`, ``splits`` not a `Splits` (checked first);
            a ``model_fn`` that is not callable or (Retrain) returns no `torch.nn.Module`.
        ValueError: an unknown method, setting or hparams (checked before anything else, also
            when a config is given), ``model_fn`` for a method other than "retrain",
            missing/empty splits, labels outside the model's classes or not integer,
            non-finite losses of the original model (every method, before any training; names
            split and samples), non 2-D logits, a split whose inputs the model cannot take (wrong
            feature width, integer features; names the split, the input shape and dtype), a
            ``device`` this process cannot use (e.g. "cuda" without a GPU), no trainable parameters (also a model without
            any parameter), an invalid config, a resume from a checkpoint of another method
            (names both), or whose splits or config differ (TypeError for a wrong field type).
        OutDirInUseError (a ValueError; ``entangle_ext.OutDirInUseError``): another
            live run (another process, or another thread) holds ``out_dir``; raised after the
            input checks, before any training or file written; names its pid, host, start time
            and command.
        NonFiniteLossError (a ValueError; ``entangle_ext.NonFiniteLossError``): NaN/Inf loss;
            names the stage and step; the last good checkpoint is kept (without one, the message
            says why none was written and what keeps one). Also when the final evaluation gives
            a NaN/Inf loss on a split (the weights diverged after the last checked step; no
            report is written).
        RunInterrupted (a KeyboardInterrupt; ``entangle_ext.RunInterrupted``): Ctrl-C / SIGTERM
            during a stage; a checkpoint of the last completed step is written (with out_dir) and
            the message gives the call that resumes.
    """
    check_model_and_splits(model, splits, "unlearn")
    spec = get_method(method)
    spec.check_arguments(setting, hparams, model_fn)
    if not inplace:
        model = _copy(model)
    # warned once the configuration and splits are known to be valid, at the caller's line
    warn = _reuse_warning(out_dir, sys._getframe(1)) if resume is None else None
    lock = OutDirLock(out_dir)

    def checked():   # the checks passed: lock the out dir (one live run per dir), then warn
        lock.acquire()
        if warn is not None:
            warn()
    with lock, training_flags_kept(model):
        if not spec.two_stage:
            return run_method(spec, model, splits, config, setting=setting, hparams=hparams, model_fn=model_fn,
                              seed=seed, device=device, out_dir=out_dir, resume=resume,
                              allow_config_change=allow_config_change, progress=progress, on_checked=checked)
        # the preset family and setting the config came from, reported as a baseline's are
        preset = {"hparams": hparams, "setting": setting} if config is None and resume is None else \
            {"hparams": None, "setting": None}
        if config is not None or resume is None:
            config = spec.two_stage_config(config, setting, hparams)
        return _two_stage(model, splits, config, method=method, seed=seed, device=device, out_dir=out_dir,
                          resume=resume, allow_config_change=allow_config_change, progress=progress,
                          on_checked=checked, preset=preset)


def _two_stage(model, splits: Splits, config, *, method: str, seed, device, out_dir, resume,
               allow_config_change: bool, progress: bool,
               on_checked: Optional[Callable[[], None]] = None,
               preset: Dict[str, Any]) -> UnlearnResult:
    """The two-stage family's run (`unlearn` after the dispatch on ``method``); ``preset``:
    {"hparams", "setting"} of the preset the config came from (None values otherwise)."""
    with preserved_global_state(), scope(model) as (_, model):
        ckpt = load_resume(resume, method)
        config = _resolve_config(config, ckpt, seed)
        required = ("forget", "remote") + (("adjacent",) if config.run_stage2 else ())
        splits.check(required, by=f"method {method!r}")
        fingerprint = splits_fingerprint(splits)
        changes = None if ckpt is None else check_resume(
            ckpt, fingerprint, config.to_dict(), allow_config_change=allow_config_change)
        require_trainable(model)
        device = model_device(model, device)
        model.to(device).eval()
        num_classes = preflight(model, splits, device, config.amp)
        if on_checked is not None:
            on_checked()
        seed_everything(config.seed, config.deterministic)
        if ckpt is not None and "rng" in ckpt:
            set_rng_state(ckpt["rng"])
        run = _Run(model, splits, config, device, num_classes, out_dir, ckpt, progress, fingerprint, method)
        if "original" not in run.evals:
            run.evaluate("original", check_finite=True)
        c0 = run.constraint_target()
        run.stage1(c0)
        run.stage2()
        resumed = None if ckpt is None else {"from": ckpt.get("path"), "config_changes": changes}
        return run.finish(c0, resumed, preset)


class OutDirReusedWarning(UserWarning):
    """`unlearn` was given an ``out_dir`` that already holds a run, and no ``resume``: the run's
    files there are overwritten. Silence it with ``warnings.filterwarnings("ignore",
    category=entangle_ext.OutDirReusedWarning)``."""


_RUN_FILES = ("report.json", "history.json", "forget_loss_hist.png", "checkpoints")


def _reuse_warning(out_dir, frame) -> Optional[Callable[[], None]]:
    """A callable that emits `OutDirReusedWarning` (rank 0 only), attributed to ``frame``'s line,
    when ``out_dir`` holds a previous run's files; None when there is nothing to warn about. It is
    called after the run's configuration and splits have been checked, so a call that is refused
    does not also warn."""
    if out_dir is None or (torch.distributed.is_available() and torch.distributed.is_initialized()
                           and torch.distributed.get_rank() != 0):
        return None
    out = Path(out_dir)
    found = [n + ("/" if (out / n).is_dir() else "") for n in _RUN_FILES if (out / n).exists()]
    if not found:
        return None
    state = "a finished run" if "report.json" in found else "an unfinished run"
    msg = (f"{out} already holds {state}; this run overwrites its {', '.join(found)}. To continue "
           f"that run instead, pass resume={str(out)!r} (command line: --resume {out})")
    # no module_globals: linecache would ask the module's loader for the source, which fails for
    # a `python -m` __main__ frame (ImportError "loader ... cannot handle __main__")
    where = dict(filename=frame.f_code.co_filename, lineno=frame.f_lineno,
                 module=frame.f_globals.get("__name__"),
                 registry=frame.f_globals.setdefault("__warningregistry__", {}))
    return lambda: warnings.warn_explicit(msg, OutDirReusedWarning, **where)


def _copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``model`` (of the module a DDP wrapper holds); ValueError for FSDP."""
    model = unwrap(model)
    if any(type(p).__name__ == "DTensor" for p in model.parameters()):
        raise ValueError("inplace=False needs a copy of the model, and an FSDP (fully_shard) model "
                         "cannot be copied: pass inplace=True")
    return copy.deepcopy(model)


def _resolve_config(config, ckpt, seed: Optional[int] = None) -> UnlearnConfig:
    if config is None:
        config = UnlearnConfig.from_dict(ckpt["config"]) if ckpt is not None else UnlearnConfig()
    if not isinstance(config, UnlearnConfig):
        raise TypeError(f"config must be an entangle_ext.UnlearnConfig, got {type(config).__name__}")
    if seed is not None:
        config = dataclasses.replace(config, seed=seed)
    return config.validate()


class _Run:
    """One `unlearn` call: its evaluations, timings, step history, checkpoints and resume point.

    ``done`` is what the completed stages hand to the report ({"history": records of the
    completed stages, "lambda_final"}); it and the evaluations go into every checkpoint, with
    the timings so far, so a resumed run reports the whole run.
    """

    def __init__(self, model, splits, config: UnlearnConfig, device, num_classes: int, out_dir,
                 ckpt: Optional[Dict[str, Any]], progress: bool, fingerprint, method: str = "two_stage"):
        self.model, self.splits, self.config, self.device = model, splits, config, device
        self.method = method
        self.num_classes, self.progress = num_classes, progress
        self.out = Path(out_dir) if out_dir is not None else None
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
        self.ckpt = ckpt or {}
        self.evals: Dict[str, Dict[str, dict]] = dict(self.ckpt.get("evals", {}))
        self.done: Dict[str, Any] = copy.deepcopy(self.ckpt.get("done", {"history": [],
                                                                          "lambda_final": None}))
        self.timings: Dict[str, float] = dict(self.ckpt.get("timings", {}))
        self._running: Optional[tuple] = None   # (name, start, seconds before this process)
        self.saver = Checkpointer(self.out, {"method": method, "config": config.to_dict(),
                                             "evals": self.evals, "done": self.done,
                                             "fingerprint": fingerprint_entry(fingerprint)},
                                  dynamic=lambda: {"timings": self._timings_now()})
        self.saver.last_path = self.ckpt.get("path")   # until this run writes one: the one resumed from
        # stages completed by the checkpoint we resume from
        self.done_stage = 0 if not self.ckpt else \
            self.ckpt["stage"] if self.ckpt.get("stage_done") else self.ckpt["stage"] - 1

    def _timings_now(self) -> Dict[str, float]:
        t = dict(self.timings)
        if self._running is not None:
            name, start, before = self._running
            t[name] = before + time.perf_counter() - start
        return t

    def _timed(self, name: str, fn):
        """Run fn, adding its wall time (seconds) to ``timings[name]`` (a resumed stage keeps the
        time it took before the interruption)."""
        self._running = (name, time.perf_counter(), self.timings.get(name, 0.0))
        try:
            return fn()
        finally:
            self.timings.update(self._timings_now())
            self._running = None

    def evaluate(self, tag: str, check_finite: bool = False) -> None:
        self.timings.pop(f"eval_{tag}", None)
        self.evals[tag] = self._timed(f"eval_{tag}", lambda: evaluate(
            self.model, self.splits, device=self.device, batch_size=self.config.eval_batch_size,
            num_classes=self.num_classes, check_finite=check_finite, amp=self.config.amp))

    def constraint_target(self) -> float:
        """c0 = the original model's mean CE on the remote train set (nats); ValueError if not finite."""
        c0 = self.ckpt["c0"] if "c0" in self.ckpt else self.evals["original"]["remote"]["loss"]
        if not math.isfinite(c0):
            raise ValueError(f"the original model's mean cross-entropy on the remote train set (c0, the "
                             f"Stage-1 constraint target) is {c0}: the model produces non-finite logits "
                             "before unlearning starts")
        self.saver.common["c0"] = c0
        return c0

    def _loop_args(self, stage: int) -> Dict[str, Any]:
        resume = self.ckpt if self.ckpt.get("stage") == stage and not self.ckpt.get("stage_done") else None
        return dict(device=self.device, seed=self.config.seed, log_every=self.config.log_every,
                    checkpoint_every=self.config.checkpoint_every, checkpoint_fn=self.saver,
                    resume_state=resume, progress=self.progress, amp=self.config.amp)

    def stage1(self, c0: float) -> None:
        """Run (or take from the checkpoint) Stage 1, then evaluate."""
        if self.config.run_stage1 and self.done_stage < 1:
            r = self._timed("stage1", lambda: stage1(
                self.model, self.splits, self.config.stage1, c0=c0,
                eval_batch_size=self.config.eval_batch_size, **self._loop_args(1)))
            self.done["history"] = self.done["history"] + r.history
            self.done["lambda_final"] = float(r.lam)
            self.saver.save("stage1_done", {"stage": 1, "stage_done": True, "step": r.steps,
                                            "model": self.model.state_dict(),
                                            "lagrangian": r.lagrangian.state_dict()})
        elif self.done_stage >= 1 and self.ckpt.get("stage") == 1:
            restore_objects({"model": self.model}, self.ckpt)
        if self.config.run_stage1 and "stage1" not in self.evals and self.done_stage < 2:
            self.evaluate("stage1")

    def stage2(self) -> None:
        """Run (or take from the checkpoint) Stage 2, then evaluate."""
        if self.config.run_stage2 and self.done_stage < 2:
            r = self._timed("stage2", lambda: stage2(
                self.model, self.splits, self.config.stage2,
                eval_batch_size=self.config.eval_batch_size, **self._loop_args(2)))
            self.done["history"] = self.done["history"] + r.history
            self.saver.save("stage2_done", {"stage": 2, "stage_done": True, "step": r.steps,
                                            "model": self.model.state_dict()})
        elif self.done_stage >= 2:
            restore_objects({"model": self.model}, self.ckpt)
        if self.config.run_stage2 and "stage2" not in self.evals:
            self.evaluate("stage2")

    def finish(self, c0: float, resumed: Optional[Dict[str, Any]], preset: Dict[str, Any]) -> UnlearnResult:
        """Table, report (and its files under out_dir); prints the table when progress is on."""
        history = self.done["history"]
        table = format_table(self.evals)
        report = build_report(config=self.config.to_dict(), num_classes=self.num_classes, c0=c0,
                              lam=self.done["lambda_final"], history=history,
                              timings=self._timings_now(), evals=self.evals,
                              checkpoint=self.saver.last_path)
        report["fingerprint"] = self.saver.common["fingerprint"]
        report["resume"] = resumed
        report.update(preset)
        last = next(t for t in ("stage2", "stage1", "original") if t in report["evals"])
        report["method"], report["evals"]["final"] = self.method, copy.deepcopy(report["evals"][last])
        check_final_losses(self.method, report["evals"]["final"], len(history), self.saver.last_path)
        tm = report["timings_s"]
        tm["unlearn"] = tm.get("stage1", 0.0) + tm.get("stage2", 0.0)
        report["world_size"] = current().world
        if self.out is not None and current().is_main:
            write_report(self.out, report, history, self.evals,
                         bins=self.config.histogram_bins, num_classes=self.num_classes)
        if self.progress and current().is_main:
            print(table)
        return UnlearnResult(model=self.model, report=report, history=history, table=table)
