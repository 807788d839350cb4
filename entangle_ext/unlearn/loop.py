"""The step loop every stage runs (Stage 1, Stage 2, and any other unlearning method written as
a step function): epochs over a driving minibatch stream, a tqdm progress bar, device-side
logging with a host read every ``log_every`` steps (also where non-finite losses are detected),
a checkpoint every ``checkpoint_every`` steps, resume from such a checkpoint, and interrupts
(Ctrl-C / SIGTERM / SIGHUP) that end the run at a step boundary with a checkpoint of the last completed step.

A stage is written as::

    loop = StageLoop(1, "stage 1 (AL)", ["violation", "lambda"], log_every=..., progress=...)
    steps, history = loop.run(stream, epochs, step_fn,
                              objects={"model": model, "optimizer": opt, ...},
                              resume_state=resume_state)

where ``step_fn(step, batch)`` takes one optimisation step on one batch of ``stream`` and
returns ``(loss, [value, ...])``: 0-d device tensors, one value per key, read back only at log
points. ``objects`` are what a checkpoint stores and a resume restores (see `capture_state` in
``entangle_ext/unlearn/checkpoint.py``). A step function changes ``objects`` (optimizer step,
multiplier update, stream position, ...) only inside ``with updating():``, after its forward
passes: a KeyboardInterrupt raised before (e.g. from the model's code) leaves them at the last
completed step, which is then checkpointed; one raised inside stops without a checkpoint.

Under several ranks (docs/algorithm.md §11) only rank 0 shows the bar; the logged values are the
same on every rank, so all stop at the same non-finite step; a signal is acted on at the next log
point (``log_every``), where the ranks agree on it, so that they checkpoint the same step.
"""
from __future__ import annotations

import contextlib
import math
import signal
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .._signals import STOP_SIGNALS, signal_name
from .checkpoint import capture_state, restore_objects
from .data import BatchStream
from .distributed import Dist, current

__all__ = ["StageLoop", "StageResult", "NonFiniteLossError", "RunInterrupted", "StepFn", "updating",
           "no_checkpoint_note"]

StepFn = Callable[[int, Any], Tuple[torch.Tensor, Sequence[torch.Tensor]]]


class NonFiniteLossError(ValueError):
    """A stage produced a NaN/Inf loss. Attributes: stage (1/2, or a method name), step (first bad
    step, 0-based within the stage), checkpoint (path of the last good checkpoint or None). Without
    a checkpoint the message says why none was written (``note``) and what keeps one.
    Importable as ``entangle_ext.NonFiniteLossError``."""

    def __init__(self, stage, step: int, checkpoint: Optional[str], note: Optional[str] = None, *,
                 message: Optional[str] = None):
        self.stage, self.step, self.checkpoint = stage, step, checkpoint
        where = f"; last good checkpoint: {checkpoint}" if checkpoint else \
            f" ({note or 'no checkpoint was written'})"
        label = f"Stage {stage}" if isinstance(stage, int) else str(stage)   # a baseline: its name
        super().__init__(message or f"non-finite loss in {label} at step {step}; stopped{where}")


def check_final_losses(method: str, final: Dict[str, dict], step: int, checkpoint: Optional[str]) -> None:
    """`NonFiniteLossError` when a split's mean loss in the final evaluation (``final`` =
    {split: {"loss", ...}}) is NaN/Inf: the weights left float range although no checked training
    loss was non-finite (e.g. gradient ascent whose logits overflow after its last step)."""
    bad = sorted(n for n, r in final.items() if not math.isfinite(float(r.get("loss", 0.0))))
    if bad:
        raise NonFiniteLossError(method, step, checkpoint, message=(
            f"non-finite loss in {method}: the unlearned model's loss on {', '.join(map(repr, bad))} is "
            f"NaN/Inf after its last step ({step}); the run diverged (its logits overflow) although no "
            "checked training loss was non-finite" + (f"; last checkpoint: {checkpoint}" if checkpoint else "")))


class RunInterrupted(KeyboardInterrupt):
    """A stage was interrupted (Ctrl-C / SIGINT, SIGTERM, SIGHUP, or a KeyboardInterrupt raised in a step).

    Attributes: stage, step (steps completed), signal (its name, or "KeyboardInterrupt"),
    checkpoint (path of the checkpoint of the last completed step, None without out_dir),
    resume (the call that continues the run, or None). Without a checkpoint the message says why
    none was written (``note``). Importable as ``entangle_ext.RunInterrupted``.
    """

    def __init__(self, stage, step: int, signal_name: str, checkpoint: Optional[str],
                 resume: Optional[str], note: Optional[str] = None):
        self.stage, self.step, self.signal = stage, step, signal_name
        self.checkpoint, self.resume = checkpoint, resume
        if checkpoint is None:
            tail = note or "no checkpoint was written"
        else:
            tail = f"checkpoint of the last completed step: {checkpoint}"
            if resume:
                tail += f"; continue with {resume}"
        super().__init__(f"{signal_name} during Stage {stage} after {step} completed steps; {tail}")


def no_checkpoint_note(checkpoint_fn, checkpoint_every: int) -> str:
    """Why a stage that stopped has no checkpoint to go back to, and what keeps one: the
    checkpoint writer's own account (``checkpoint_fn.no_checkpoint_note(checkpoint_every)``, e.g.
    `Checkpointer`: no out_dir, or no stage finished and ``checkpoint_every`` is 0), else a
    generic one."""
    if checkpoint_fn is None:
        return "no checkpoint was written: this stage runs without checkpoints"
    explain = getattr(checkpoint_fn, "no_checkpoint_note", None)
    return explain(checkpoint_every) if explain is not None else "no checkpoint was written"


class _Forced(KeyboardInterrupt):
    """A second Ctrl-C while the first is pending: stop at once, no checkpoint (the step in
    progress may be half done)."""


@contextlib.contextmanager
def updating():
    """Wrap the part of a step function that changes the run objects: a KeyboardInterrupt raised
    inside (the step is half done) stops the run without writing a checkpoint."""
    try:
        yield
    except KeyboardInterrupt as exc:
        if isinstance(exc, _Forced):
            raise
        raise _Forced("KeyboardInterrupt while a step was updating the run state: stopped "
                      "without a checkpoint of it") from exc


class _Interrupts:
    """Defers SIGINT/SIGTERM/SIGHUP to the end of the current step (main thread only; elsewhere
    signals cannot arrive). A SIGHUP the process ignores (``nohup``) stays ignored. A second SIGINT
    while one is pending raises `_Forced` at once."""

    SIGNALS = STOP_SIGNALS
    KEEP_IGNORED = tuple(getattr(signal, n) for n in ("SIGHUP",) if hasattr(signal, n))

    def __init__(self):
        self.signum: Optional[int] = None
        self._old: Dict[int, Any] = {}

    def __enter__(self) -> "_Interrupts":
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                try:
                    if s in self.KEEP_IGNORED and signal.getsignal(s) is signal.SIG_IGN:
                        continue
                    self._old[s] = signal.signal(s, self._handler)
                except (ValueError, OSError):   # e.g. an embedded interpreter
                    pass
        return self

    def _handler(self, signum, _frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise _Forced("second interrupt: stopped at once, without a checkpoint")
        self.signum = signum

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        self._old.clear()


@dataclass
class StageResult:
    """Outcome of one stage: ``steps`` taken in total, the per-step ``history`` (list of dicts of
    floats), and stage state (Stage 1: ``lam`` (λ, 0-d device tensor), ``c0`` (float, nats) and
    the ``lagrangian`` (`AugmentedLagrangian`); Stage 2: ``momentum`` (list of tensors shaped like
    the trainable parameters))."""
    stage: int
    steps: int
    history: List[Dict[str, float]] = field(default_factory=list)
    lam: Optional[torch.Tensor] = None
    c0: Optional[float] = None
    momentum: Optional[List[torch.Tensor]] = None
    lagrangian: Any = None


class _NonFinite(Exception):
    def __init__(self, step):
        self.step = step


class _Monitor:
    """Per-step device-side scalars; host reads only at flush (every log_every steps)."""

    def __init__(self, stage, keys: List[str], device, start_step: int, history: List[dict]):
        self.stage, self.keys = stage, keys
        self.pending: List[torch.Tensor] = []
        self.pending_steps: List[int] = []
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)
        self.step_t = torch.full((), start_step, dtype=torch.long, device=device)
        self.history: List[Dict[str, float]] = list(history)

    def record(self, step: int, loss: torch.Tensor, values: Sequence[torch.Tensor]) -> None:
        vals = torch.stack([v.detach().double().reshape(()) for v in [loss, *values]])
        bad = ~torch.isfinite(vals).all()
        self.first_bad = torch.where((self.first_bad < 0) & bad, self.step_t, self.first_bad)
        self.step_t += 1
        self.pending.append(vals)
        self.pending_steps.append(step)

    def flush(self) -> Optional[Dict[str, float]]:
        """Host read. Returns the last record; raises _NonFinite(step) after a non-finite value."""
        if not self.pending:
            return self.history[-1] if self.history else None
        rows = torch.stack(self.pending).tolist()
        first_bad = int(self.first_bad)
        for st, row in zip(self.pending_steps, rows):
            self.history.append({"stage": self.stage, "step": st,
                                 **dict(zip(["loss"] + self.keys, row))})
        self.pending, self.pending_steps = [], []
        if first_bad >= 0:
            raise _NonFinite(first_bad)
        return self.history[-1]


class StageLoop:
    """Runs one stage's steps with progress bar, logging, checkpoints and resume.

    Args:
        stage: stage id written into history records and checkpoints (1, 2 or a method name).
        desc: progress-bar label.
        keys: names of the values ``step_fn`` returns after the loss (history columns).
        postfix: ``postfix(last_record) -> dict`` shown on the bar at log points (default: loss).
        log_every: steps between host reads (history, bar postfix, non-finite check), >= 1.
        checkpoint_every, checkpoint_fn: every that many steps (not at the last one) call
            ``checkpoint_fn(step, state)`` with ``state`` = {"stage", "step", "history", one entry
            per run object, ``extra``}; the entries are live references (``state_dict()``), so
            ``checkpoint_fn`` must serialise or copy them before returning (`Checkpointer` saves
            them with ``torch.save``). ``checkpoint_fn.last_path`` (if any) is reported on error;
            when it is None, ``checkpoint_fn.no_checkpoint_note(checkpoint_every)`` (if any) says why.
        progress: show the tqdm bar.
        extra: plain values stored in every checkpoint of this stage (e.g. Stage 1's c0).
        probe, probe_every: every ``probe_every`` steps and after the last step, ``probe(step,
            final)`` (final: the budget's last step; before that step's checkpoint); it returning
            True ends the stage after this step (a stopping rule): the bar closes at that step,
            its total still the budget, labelled "<desc> [stopped early]", and (where the bar
            shows) one line on stderr says why: "<desc>: stopped early after step k of n:
            <probe.stop_reason()>". A probe with ``state_dict`` (`StageProbe` of
            ``entangle_ext/unlearn/curves.py``) is saved in every checkpoint as ``"curves"`` and
            restored on resume. None (default): nothing is called.
    """

    def __init__(self, stage, desc: str, keys: List[str], *,
                 postfix: Optional[Callable[[Dict[str, float]], Dict[str, str]]] = None,
                 log_every: int = 10, checkpoint_every: int = 0,
                 checkpoint_fn: Optional[Callable[[int, Dict[str, Any]], Optional[str]]] = None,
                 progress: bool = True, extra: Optional[Dict[str, Any]] = None,
                 probe: Optional[Callable[[int], bool]] = None, probe_every: int = 0):
        if int(log_every) < 1:
            raise ValueError(f"log_every must be >= 1, got {log_every}")
        self.stage, self.desc, self.keys = stage, desc, list(keys)
        self.postfix = postfix or (lambda last: {"loss": f"{last['loss']:.3f}"})
        self.log_every, self.checkpoint_every = int(log_every), int(checkpoint_every or 0)
        self.checkpoint_fn, self.progress = checkpoint_fn, progress
        self.extra = dict(extra or {})
        self.probe, self.probe_every = probe, int(probe_every or 0)

    def run(self, stream: BatchStream, epochs: int, step_fn: StepFn, *,
            objects: Dict[str, Any], resume_state: Optional[Dict[str, Any]] = None,
            device: Optional[torch.device] = None,
            max_steps: Optional[int] = None) -> Tuple[int, List[Dict[str, float]]]:
        """Run ``epochs`` passes over ``stream`` (one step per batch; at most ``max_steps`` steps
        in total when given), from ``resume_state``'s step when given (its run objects restored
        first). Returns (steps taken in total, history).

        Raises:
            ValueError: ``resume_state``'s step lies past this config's steps (a resume that
                shortened the stage: nothing would run, and the run would report the new config).
            NonFiniteLossError: a loss or logged value became NaN/Inf (the first bad step; no
                checkpoint is written after it).
            RunInterrupted (a KeyboardInterrupt): SIGINT/SIGTERM/SIGHUP (acted on at the end of the
                step in progress) or a KeyboardInterrupt raised inside a step; ``checkpoint_fn``
                is called for the last completed step first, whatever ``checkpoint_every``.
        """
        start, history, d = 0, [], current()
        if resume_state is not None:
            restore_objects(objects, resume_state)
            start, history = int(resume_state["step"]), list(resume_state.get("history", []))
            if self.probe is not None and "curves" in resume_state and hasattr(self.probe, "load_state_dict"):
                self.probe.load_state_dict(resume_state["curves"])
        total = len(stream) * epochs
        total = total if max_steps is None else min(total, int(max_steps))
        if start > total:   # (a resume with allow_config_change: nothing would run, the report would lie)
            raise ValueError(f"resume: the checkpoint is at step {start} of {self.desc}, past the {total} steps "
                             f"of this config ({epochs} epoch(s) of {len(stream)} batches"
                             f"{'' if max_steps is None else f', max_steps {max_steps}'}): the shortened "
                             "stage cannot apply; resume from an earlier checkpoint or start a new run")
        mon = _Monitor(self.stage, self.keys, device or torch.device("cpu"), start, history)
        bar = _bar(total, start, self.desc, self.progress and d.is_main)
        step, budget, stopped = start, total, False
        try:
            with _Interrupts() as intr:
                while step < total:
                    epoch, pos = divmod(step, len(stream))
                    for batch in stream.epoch_batches(epoch, pos):
                        try:
                            loss, values = step_fn(step, batch)
                        except KeyboardInterrupt as exc:
                            if isinstance(exc, _Forced):
                                raise
                            raise self._interrupted(step, mon, objects, "KeyboardInterrupt") from None
                        mon.record(step, loss, values)
                        step += 1
                        if self._probed(step, total):   # a stopping rule ended the stage
                            total, stopped = step, True
                        flushed = self._end_step(step, total, mon, bar, objects, stopped)
                        if _stop(intr, d, flushed):
                            raise self._interrupted(step, mon, objects, _signal_name(intr))
                        if step >= total:
                            break
                    mon.flush()
                if _stop(intr, d, True):    # arrived during the last host read
                    raise self._interrupted(step, mon, objects, _signal_name(intr))
        except _NonFinite as bad:
            last = getattr(self.checkpoint_fn, "last_path", None)
            raise NonFiniteLossError(self.stage, bad.step, last, None if last else
                                     no_checkpoint_note(self.checkpoint_fn, self.checkpoint_every)) from None
        finally:
            bar.close()
        if stopped:
            _note(self._stop_message(step, budget), self.progress and d.is_main)
        return step, mon.history

    def _stop_message(self, step: int, budget: int) -> str:
        """The console line of a stage its stopping rule ended after ``step`` of ``budget`` steps:
        which rule and why (the probe's ``stop_reason()``, `StageProbe`'s), else a generic one."""
        why = getattr(self.probe, "stop_reason", None)
        return f"{self.desc}: stopped early after step {step} of {budget}: " + \
            (why() if callable(why) else "its stopping rule held")

    def _probed(self, step: int, total: int) -> bool:
        """Probe after ``step`` steps when one is due (every ``probe_every`` steps, and at the
        last one); whether its stopping rule ends the stage."""
        if self.probe is None or self.probe_every <= 0 or (step % self.probe_every and step != total):
            return False
        return bool(self.probe(step, step == total))

    def _state(self, step: int, mon: "_Monitor", objects) -> Dict[str, Any]:
        state = {name: capture_state(obj) for name, obj in objects.items()}
        if self.probe is not None and hasattr(self.probe, "state_dict"):
            state["curves"] = self.probe.state_dict()
        return {"stage": self.stage, "step": step, "history": list(mon.history), **self.extra, **state}

    def _interrupted(self, step: int, mon: "_Monitor", objects, name: str) -> RunInterrupted:
        """Checkpoint of the last completed ``step`` (after the host read that also checks it is
        finite), then the exception to raise."""
        mon.flush()
        path = None
        if self.checkpoint_fn is not None:
            path = self.checkpoint_fn(step, self._state(step, mon, objects))
        return RunInterrupted(self.stage, step, name, path,
                              getattr(self.checkpoint_fn, "resume_hint", None) if path else None,
                              None if path else no_checkpoint_note(self.checkpoint_fn, self.checkpoint_every))

    def _end_step(self, step: int, total: int, mon: _Monitor, bar, objects, stopped: bool = False) -> bool:
        """Progress bar; at log points (and at a checkpoint or the last step) the host read that
        also detects non-finite values; a checkpoint every ``checkpoint_every`` steps. Returns
        whether this was a log point. ``stopped``: a stopping rule ended the stage at this step
        (the bar keeps the budget as its total; its label gains "[stopped early]")."""
        bar.update(1)
        ckpt_now = self.checkpoint_fn is not None and self.checkpoint_every > 0 \
            and step % self.checkpoint_every == 0
        flushed = step % self.log_every == 0 or step == total or ckpt_now
        if flushed:
            bar.set_postfix(refresh=False, **self.postfix(mon.flush()))
        if stopped:
            bar.set_description_str(f"{self.desc} [stopped early]", refresh=False)
        if ckpt_now and step < total:
            self.checkpoint_fn(step, self._state(step, mon, objects))
        return flushed


def _stop(intr: _Interrupts, d: Dist, log_point: bool) -> bool:
    """Stop for a signal now? One process: as soon as one arrived. Several ranks: at log points,
    when it arrived on any rank (a collective there, so every rank stops after the same step)."""
    if not d.active:
        return intr.signum is not None
    return log_point and d.any(intr.signum is not None)


def _signal_name(intr: _Interrupts) -> str:
    return signal_name(intr.signum) if intr.signum is not None else "signal on another rank"


def _bar(total: int, initial: int, desc: str, progress: bool):
    from .._progress import progress_bar
    return progress_bar(total=total, initial=initial, desc=desc, enabled=progress)


def _note(message: str, progress: bool) -> None:
    from .._progress import progress_note
    progress_note(message, enabled=progress)
