"""The one lifecycle of every run, whatever the method (docs/algorithm.md §2, §3, §10): checks → pre-flight
→ seeding → evaluate θ0 → the method's stages (each timed, checkpointed and resumable) → evaluations →
report, table and files. `run_method` is that lifecycle; `Run` is the state one call carries through it.
A method plugs in with `UnlearningMethod.execute`, which takes its stages with `Run.stage` and evaluates
with `Run.evaluate_after`: the two-stage family takes two (Stage 1, Stage 2), a baseline one."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Type, Union

import torch

from . import curves
from .checkpoint import (Checkpointer, check_resume, fingerprint_entry, load_resume, preserved_global_state,
                         restore_objects, seed_everything, set_rng_state, splits_fingerprint, capture_state)
from .._paths import expand_user
from .data import Splits
from .distributed import current, scope
from .evaluate import evaluate
from .fingerprint import original_state
from .original_eval import evaluate_original
from .final_outputs import keep_outputs
from .inputs import (check_changes_apply, check_model_and_splits, check_resume_arguments, check_resume_model,
                     model_device, preflight, probe_channels_last, require_trainable, training_grad_mode)
from .files import make_out_dir, warn_unwritten_checkpoints
from .lock import OutDirLock
from .memory_format import channels_last_scope
from .loop import check_final_losses
from .method import UnlearningMethod, warm_imports
from .precision import amp_scope, model_dtype, resolve_run_amp
from .certificate import NOT_APPLICABLE, certificate_line
from .selection import StateSelection, check_unchanged, selection_line
from .report import UnlearnResult, build_report, format_table, write_curves_png, write_report

__all__ = ["run_method", "Run"]


def run_method(cls: Type[UnlearningMethod], model: torch.nn.Module, splits: Splits, config=None, *,
               setting: Optional[str] = None, hparams: str = "paper_code",
               model_fn: Optional[Callable[[], torch.nn.Module]] = None, seed: Optional[int] = None,
               device: Optional[Union[str, torch.device]] = None, out_dir=None, resume=None,
               allow_config_change: bool = False, progress: bool = True,
               on_checked: Optional[Callable[[], None]] = None) -> UnlearnResult:
    """Run the registered method ``cls`` (any member of `entangle_ext.available_methods()`) on
    ``model`` in place: what `entangle_ext.unlearn` does after its argument checks, with the same
    arguments, report, files, errors and restored global state (see its docstring).

    Order (every method): load the checkpoint of ``resume`` → resolve and validate the config
    (``cls.resolve_config``; ``seed`` replaces ``config.seed``) → the splits the method needs
    (``cls.splits_needed``) → the splits fingerprint → trainable parameters → device → on a
    resume, `check_resume`, `check_changes_apply` (no config change to a finished run) and
    `check_resume_model` (the checkpoint's model state fits ``model``; nothing is loaded yet) →
    ``cls.check_model`` (the method's own demands) → `preflight` (one batch per split) → what the config's
    ``channels_last`` runs as (`probe_channels_last`; its scope holds for the rest) → lock ``out_dir`` and
    ``on_checked()`` → seed (and deterministic algorithms when the config asks) → evaluate θ0
    (non-finite per-sample losses raise) → ``cls(...).execute(run)`` → `Run.finish`.

    Raises: as `entangle_ext.unlearn` (TypeError / ValueError for bad input, OutDirInUseError,
    NonFiniteLossError, RunInterrupted).
    """
    warm_imports()   # before any clock starts
    check_model_and_splits(model, splits, "unlearn")
    cls.check_arguments(setting, hparams, model_fn)
    check_resume_arguments(resume, allow_config_change)
    out_dir, resume = expand_user(out_dir), expand_user(resume)   # as `entangle_ext.unlearn`: "~" is home
    lock = OutDirLock(out_dir)   # taken once the checks passed (re-entrant under `entangle_ext.unlearn`)
    with lock, preserved_global_state(), training_grad_mode(), scope(model) as (d, model), \
            contextlib.ExitStack() as stack:
        ckpt = load_resume(resume, cls.name)
        preset = {"hparams": hparams, "setting": setting} if config is None and ckpt is None else \
            {"hparams": None, "setting": None}
        config = cls.resolve_config(config, setting, hparams, ckpt)
        config = (config if seed is None else dataclasses.replace(config, seed=seed)).validate()
        splits.check(cls.splits_needed(config), by=f"method {cls.name!r}")
        warn_unwritten_checkpoints(config, out_dir)
        fingerprint = splits_fingerprint(splits)
        require_trainable(model)
        device = model_device(model, device)
        if getattr(config, "amp", None) is not None:   # kept as what runs here: report, checkpoints, resume
            # ("auto" as this device and dtype run it; "bf16" stays only for a float32 model)
            config = dataclasses.replace(config, amp=resolve_run_amp(config.amp, device, model_dtype(model)))
        changes = None if ckpt is None else check_resume(ckpt, fingerprint, config.to_dict(),
                                                         allow_config_change=allow_config_change)
        if ckpt is not None:   # before anything is loaded into the model: a refused resume leaves it untouched
            check_unchanged(changes)   # (a selection's fields: their own message first)
            check_changes_apply(ckpt, changes, cls.last_stage(config))
            check_resume_model(ckpt, model)
        cls.check_model(config, model)
        model.to(device).eval()
        amp = config.amp if hasattr(config, "amp") else None
        num_classes = preflight(model, splits, device, amp)
        channels_last = probe_channels_last(getattr(config, "channels_last", False), model, splits, device, amp)
        stack.enter_context(channels_last_scope(channels_last))   # every forward pass from here on
        lock.acquire(d)   # one live run per out dir: OutDirInUseError before any training
        if on_checked is not None:   # `entangle_ext.unlearn`'s reused-out-dir warning
            on_checked()
        seed_everything(config.seed, bool(getattr(config, "deterministic", False)))
        if ckpt is not None and "rng" in ckpt:
            set_rng_state(ckpt["rng"])
        run = Run(cls.name, model, splits, config, device=device, num_classes=num_classes, out_dir=out_dir,
                  ckpt=ckpt, progress=progress, fingerprint=fingerprint, stages=cls.stage_keys(), amp=amp,
                  changes=changes)
        run.channels_last = channels_last
        if "original" not in run.evals:   # a fresh run: θ0's state (a CLI --resume checks it) and evaluations
            run.done["original_state"] = original_state(model)
            evaluate_original(run)   # (inside a comparison, a copy of the first run's: `original_eval_scope`)
            run.probe_original()
        extras = cls(num_classes=num_classes, model_fn=model_fn).execute(run)
        run.restore_selected()
        resumed = None if ckpt is None else {"from": ckpt.get("path"), "config_changes": changes}
        return run.finish(extras, resumed=resumed, preset=preset)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Run:
    """One run's state: its evaluations, timings, step history, checkpoints and resume point.

    ``stages`` are the keys of the method's stages in the order they run (the two-stage family:
    1, 2; a baseline: its name); a checkpoint records the key of the stage it was written in
    (``"stage"``) and whether that stage had finished (``"stage_done"``), so a resumed run skips
    the finished stages and continues the interrupted one. ``done`` ({"history": records of the
    completed stages, plus what a stage's ``results`` added, e.g. "lambda_final"}), the
    evaluations and the timings so far go into every checkpoint, so a resumed run reports the
    whole run, including the time its earlier processes spent.
    """

    def __init__(self, method: str, model: torch.nn.Module, splits: Splits, config, *, device: torch.device,
                 num_classes: int, out_dir, ckpt: Optional[Dict[str, Any]], progress: bool,
                 fingerprint: Dict[str, Any], stages: Sequence[Any], amp: Optional[str] = None,
                 changes: Optional[Dict[str, Any]] = None):
        self.method, self.model, self.splits, self.config, self.device = method, model, splits, config, device
        self.fingerprint = fingerprint   # the splits' (`splits_fingerprint`)
        self.num_classes, self.progress, self.amp, self.stages = num_classes, progress, amp, tuple(stages)
        self.channels_last = False   # what the config's channels_last runs as (set by run_method)
        self.out = make_out_dir(out_dir) if out_dir is not None else None
        self.ckpt = ckpt or {}
        self.evals: Dict[str, Dict[str, dict]] = dict(self.ckpt.get("evals", {}))
        self.done: Dict[str, Any] = copy.deepcopy(self.ckpt.get("done", {"history": [], "lambda_final": None}))
        self.timings: Dict[str, float] = dict(self.ckpt.get("timings", {}))
        if "done" not in self.ckpt and self.ckpt.get("stage_done"):
            # a baseline's end-of-run checkpoint of the earlier lifecycle: its history at the top
            # (in a mid-stage checkpoint that key is the stage loop's own, which it resumes from)
            self.done["history"] = list(self.ckpt.get("history", []))
        if "unlearn_s" in self.ckpt:
            self.timings.setdefault("unlearn", float(self.ckpt["unlearn_s"]))
        self._running: Optional[tuple] = None   # (name, start, seconds before this process)
        self._stage_timings: List[str] = []
        self._at: Any = None   # the key of the stage whose end the model is at (None: not at an end)
        self._probe: Optional[curves.StageProbe] = None   # the curve probe of the running stage
        self._curve_probe: Optional[curves.CurveProbe] = None
        self.saver = Checkpointer(self.out, {"method": method, "config": config.to_dict(), "evals": self.evals,
                                             "done": self.done, "fingerprint": fingerprint_entry(fingerprint)},
                                  dynamic=lambda: {"timings": self._timings_now()})
        self.saver.last_path = self.ckpt.get("path")   # until this run writes one: the one resumed from
        check_unchanged(changes)
        self.selection = None if getattr(config, "select", None) is None else \
            StateSelection(config, num_classes, self.done, self.saver.common, self.ckpt, model)
        stage = self.ckpt.get("stage")
        # how many of ``stages`` the checkpoint has finished (a sub-stage key of a method's own
        # loops, e.g. "ssd/select", belongs to its first unfinished stage)
        self._finished = 0 if stage not in self.stages else \
            self.stages.index(stage) + bool(self.ckpt.get("stage_done"))

    @property
    def history(self) -> List[Dict[str, float]]:
        """The per-step records of the completed stages (of every process of a resumed run)."""
        return self.done["history"]

    def _timings_now(self) -> Dict[str, float]:
        t = dict(self.timings)
        if self._running is not None:
            name, start, before = self._running
            t[name] = before + time.perf_counter() - start
        return t

    def _timed(self, name: str, fn):
        """Run fn, adding its wall time (seconds, device work included) to ``timings[name]`` (a
        resumed stage keeps the time it took before the interruption)."""
        self._running = (name, time.perf_counter(), self.timings.get(name, 0.0))
        try:
            out = fn()
            _sync(self.device)
            return out
        finally:
            self.timings.update(self._timings_now())
            self._running = None

    def evaluate(self, tag: str, check_finite: bool = False) -> None:
        """Evaluate the model on every split under ``evals[tag]`` (timed as ``eval_<tag>``)."""
        self.timings.pop(f"eval_{tag}", None)
        with keep_outputs(self) as outputs:   # inside `compare`: its metrics may reuse them (`FinalOutputs`)
            self.evals[tag] = self._timed(f"eval_{tag}", lambda: evaluate(
                self.model, self.splits, device=self.device, batch_size=self.config.eval_batch_size,
                num_classes=self.num_classes, check_finite=check_finite, amp=self.amp, outputs=outputs))

    def evaluate_after(self, key, tag: str) -> None:
        """`evaluate` under ``tag`` unless it is already there (a resumed run) or the model is not
        at the end of stage ``key`` (a resume past it)."""
        if tag not in self.evals and self._at == key:
            self.evaluate(tag)

    def constraint_target(self) -> float:
        """c0 = the original model's mean CE on the remote train set (nats), the Stage-1
        constraint target; kept in every checkpoint. ValueError if not finite."""
        c0 = self.ckpt["c0"] if "c0" in self.ckpt else self.evals["original"]["remote"]["loss"]
        if not math.isfinite(c0):
            raise ValueError(f"the original model's mean cross-entropy on the remote train set (c0, the "
                             f"Stage-1 constraint target) is {c0}: the model produces non-finite logits "
                             "before unlearning starts")
        self.saver.common["c0"] = c0
        return c0

    def loop_args(self, key) -> Dict[str, Any]:
        """The `StageLoop` keywords of stage ``key``: logging and checkpoint intervals, the
        checkpoint writer, the progress flag and the checkpoint to continue from (the one
        resumed from while it was written inside this stage, else None)."""
        ck = self.ckpt
        inside = bool(ck) and not ck.get("stage_done") and (ck.get("stage") == key or ck.get("stage") not in self.stages)
        la = dict(log_every=self.config.log_every, checkpoint_every=self.config.checkpoint_every,
                  checkpoint_fn=self.saver, resume_state=ck if inside else None, progress=self.progress)
        if self._probe is not None:
            la.update(probe=self._probe, probe_every=self.config.eval_every)
        return la

    @property
    def curves_on(self) -> bool:
        """Whether the config asks for curves (``eval_every > 0``)."""
        return int(getattr(self.config, "eval_every", 0) or 0) > 0

    @property
    def curve_probe(self) -> curves.CurveProbe:
        """The run's `CurveProbe` (``entangle_ext/unlearn/curves.py``; built on first use)."""
        if self._curve_probe is None:
            self._curve_probe = curves.CurveProbe(self.model, self.splits, samples=self.config.curve_samples,
                                                  seed=self.config.seed, device=self.device,
                                                  batch_size=self.config.eval_batch_size)
        return self._curve_probe

    @property
    def curve_origin(self) -> Optional[Dict[str, Any]]:
        """The original model's curve record (global step 0), None when the run (or the checkpoint
        it resumed) was started without curves."""
        first = self.done.get("curves") or [None]
        return first[0] if first[0] is not None and first[0]["stage"] == "original" else None

    def probe_original(self) -> None:
        """With curves on: the original model's curve record (stage "original", step 0), kept in
        ``done["curves"]`` (hence in every checkpoint)."""
        if self.curves_on:
            with amp_scope(self.amp):   # as every later probe (inside the stages' autocast)
                rec = {"kind": "curve", "stage": "original", "step": 0, "global_step": 0, **self.curve_probe.measure()}
            self.done["curves"] = [rec]

    def _start_probe(self, key, probe_kw: Optional[Dict[str, Any]], rule) -> None:
        """The `StageProbe` of stage ``key`` (None with curves off), its global-step offset = the
        steps of the stages before it; ``rule`` = (name, predicate) or None."""
        self._probe = None
        if not self.curves_on:
            return
        kw = dict(probe_kw or {})
        name, pred = rule if rule is not None else (None, None)
        observe = None if self.selection is None else \
            (lambda rec: self.selection.observe(rec, self.model, self.curve_origin))
        self._probe = curves.StageProbe(lambda: self.curve_probe.measure(**kw), stage=key,
                                        offset=len(self.done["history"]), rule=pred, rule_name=name,
                                        observe=observe)

    def restore_selected(self) -> None:
        """After the method's stages, with ``config.select`` and a kept state: the model takes that
        state and is evaluated under "selected" (the report's "final"); a baseline's own end
        evaluation "final" is kept as "end" (its stage's end state, as a stage-end row)."""
        if self.selection is not None and self.selection.restore(self.model):
            if "final" in self.evals:
                self.evals["end"] = self.evals.pop("final")
            self.evaluate("selected")

    def _end_probe(self, steps: int) -> None:
        """The stage's end record when its loop did not write one (a stage without a probed loop), then
        the stage's records join ``done["curves"]``; the rule that ended it into ``done["stopped"]``."""
        p = self._probe
        if p is not None:
            if not p.records or p.records[-1]["step"] != steps:
                p(steps, final=True)
            self.done["curves"] = list(self.done.get("curves", [])) + p.records

    def stage(self, key, fn: Callable[[Dict[str, Any]], Any], *, timing: str, tag: str,
              keep: Optional[Callable[[Any], Dict[str, Any]]] = None,
              results: Optional[Callable[[Any], Dict[str, Any]]] = None,
              probe_kw: Optional[Dict[str, Any]] = None,
              rule: Optional[tuple] = None) -> Any:
        """Run stage ``key`` (one of ``stages``) unless the checkpoint resumed from finished it.

        ``fn(loop_args)`` runs the stage (``loop_args``: `loop_args` of ``key``) and returns its
        history (a list of records) or a `StageResult`; its wall time is ``timings[timing]``
        (a key of the report's ``timings_s``; the stages' times add up to ``"unlearn"``). Then the
        checkpoint ``checkpoints/<tag>.pt`` is written with the model, the stage's step count and
        ``keep(result)`` (objects a later resume needs), after ``results(result)`` was merged into
        ``done`` (what the report needs, e.g. λ). Returns ``fn``'s result, or None for a finished
        stage (whose model is restored from the checkpoint when it was written at that stage's end).

        With curves on (``config.eval_every > 0``) the stage's loop gets a `StageProbe`
        (``entangle_ext/unlearn/curves.py``) measuring with ``probe_kw`` (`CurveProbe.measure`'s
        keywords) and stopping when ``rule`` = (name, predicate on a curve record) holds; its
        records join ``done["curves"]``, and ``done["stopped"]`` names what ended the stage
        ({"rule": name or "budget", "step": steps}).
        """
        self._stage_timings.append(timing)
        if self.stages.index(key) < self._finished:
            if self.ckpt.get("stage") == key:
                restore_objects({"model": self.model}, self.ckpt)
                self._at = key
            return None
        self._start_probe(key, probe_kw, rule)
        out = self._timed(timing, lambda: fn(self.loop_args(key)))
        history, steps = (out, len(out)) if isinstance(out, list) else (out.history, out.steps)
        self._end_probe(steps)
        p, self._probe = self._probe, None
        self.done.setdefault("stopped", {})[curves.stage_label(key)] = {
            "rule": p.rule_name if p is not None and p.stopped_at is not None else "budget", "step": steps}
        self.done["history"] = self.done["history"] + history
        if results is not None:
            self.done.update(results(out))
        self.saver.save(tag, {"stage": key, "stage_done": True, "step": steps, "model": capture_state(self.model),
                              **(keep(out) if keep is not None else {})})
        self._at = key
        return out

    def stage_steps(self, key) -> int:
        """The steps stage ``key`` took (this process, or the one whose checkpoint it resumed):
        what `stage` recorded under ``done["stopped"]``, else (a checkpoint written before that
        record) the number of its history records."""
        rec = self.done.get("stopped", {}).get(curves.stage_label(key))
        return int(rec["step"]) if rec is not None else len(self.history)

    def finish(self, extras: Dict[str, Any], *, resumed: Optional[Dict[str, Any]],
               preset: Dict[str, Any]) -> UnlearnResult:
        """Table, report (and its files under out_dir; rank 0) and the `UnlearnResult`; prints the
        table when progress is on. ``extras``: the method's report entries (``c0``,
        ``lambda_final``, ``steps``); ``preset``: {"hparams", "setting"} of the preset the config
        came from (None values otherwise); ``resumed``: the report's ``resume`` entry."""
        history = self.history
        cert = extras.get("certificate", NOT_APPLICABLE)
        table = format_table(self.evals) + ("\n" + certificate_line(cert) if cert.get("applies") else "")
        report = build_report(config=self.config.to_dict(), num_classes=self.num_classes, c0=extras.get("c0"),
                              lam=extras.get("lambda_final"), history=history, timings=self._timings_now(),
                              evals=self.evals, checkpoint=self.saver.last_path)
        if "steps" in extras:
            report["steps"] = extras["steps"]
        done_stops = self.done.get("stopped", {})
        report.update(amp=self.amp, channels_last=self.channels_last, curves=list(self.done.get("curves", [])),
                      certificate=cert, curves_png=None,
                      stopped={k: done_stops.get(k, {"rule": "budget", "step": n}) for k, n in report["steps"].items()})
        report.update(method=self.method, fingerprint=self.saver.common["fingerprint"], resume=resumed,
                      world_size=current().world, **preset)
        report["selected"] = None if self.selection is None else self.selection.entry()
        if "final" not in report["evals"] or "selected" in self.evals:   # the kept state is the final one
            report["evals"]["final"] = copy.deepcopy(report["evals"]["selected" if "selected" in self.evals
                                                                     else list(self.evals)[-1]])
        if report["selected"] is not None:
            table += "\n" + selection_line(report["selected"])
        check_final_losses(self.method, report["evals"]["final"], len(history), self.saver.last_path)
        tm = report["timings_s"]
        tm["unlearn"] = sum(tm.get(name, 0.0) for name in dict.fromkeys(self._stage_timings))
        if self.out is not None and current().is_main:
            if self.selection is not None:
                report["selected"]["model_file"] = self.selection.save(self.out)
            write_report(self.out, report, history + report["curves"], self.evals,
                         bins=self.config.histogram_bins, num_classes=self.num_classes)
            write_curves_png(self.out, report, self.evals)
        if self.progress and current().is_main:
            print(table)
        return UnlearnResult(model=self.model, report=report, history=history, table=table)
