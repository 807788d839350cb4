"""The step loop every stage runs (Stage 1, Stage 2, and any other unlearning method written as
a step function): epochs over a driving minibatch stream, a tqdm progress bar, device-side
logging with a host read every ``log_every`` steps (also where non-finite losses are detected),
a checkpoint every ``checkpoint_every`` steps, and resume from such a checkpoint.

A stage is written as::

    loop = StageLoop(1, "stage 1 (AL)", ["violation", "lambda"], log_every=..., progress=...)
    steps, history = loop.run(stream, epochs, step_fn,
                              objects={"model": model, "optimizer": opt, ...},
                              resume_state=resume_state)

where ``step_fn(step, batch)`` takes one optimisation step on one batch of ``stream`` and
returns ``(loss, [value, ...])``: 0-d device tensors, one value per key, read back only at log
points. ``objects`` are what a checkpoint stores and a resume restores (see
`entangle_ext.unlearn.checkpoint.capture_state`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .checkpoint import capture_state, restore_state
from .data import BatchStream

__all__ = ["StageLoop", "StageResult", "NonFiniteLossError", "StepFn"]

StepFn = Callable[[int, Any], Tuple[torch.Tensor, Sequence[torch.Tensor]]]


class NonFiniteLossError(ValueError):
    """A stage produced a NaN/Inf loss. Attributes: stage (1/2, or a method name), step (first bad
    step, 0-based within the stage), checkpoint (path of the last good checkpoint or None)."""

    def __init__(self, stage, step: int, checkpoint: Optional[str]):
        self.stage, self.step, self.checkpoint = stage, step, checkpoint
        where = f"; last good checkpoint: {checkpoint}" if checkpoint else \
            " (no checkpoint was written: pass out_dir / checkpoint_every to keep one)"
        super().__init__(f"non-finite loss in Stage {stage} at step {step}; stopped{where}")


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
            them with ``torch.save``). ``checkpoint_fn.last_path`` (if any) is reported on error.
        progress: show the tqdm bar.
        extra: plain values stored in every checkpoint of this stage (e.g. Stage 1's c0).
    """

    def __init__(self, stage, desc: str, keys: List[str], *,
                 postfix: Optional[Callable[[Dict[str, float]], Dict[str, str]]] = None,
                 log_every: int = 10, checkpoint_every: int = 0,
                 checkpoint_fn: Optional[Callable[[int, Dict[str, Any]], Optional[str]]] = None,
                 progress: bool = True, extra: Optional[Dict[str, Any]] = None):
        if int(log_every) < 1:
            raise ValueError(f"log_every must be >= 1, got {log_every}")
        self.stage, self.desc, self.keys = stage, desc, list(keys)
        self.postfix = postfix or (lambda last: {"loss": f"{last['loss']:.3f}"})
        self.log_every, self.checkpoint_every = int(log_every), int(checkpoint_every or 0)
        self.checkpoint_fn, self.progress = checkpoint_fn, progress
        self.extra = dict(extra or {})

    def run(self, stream: BatchStream, epochs: int, step_fn: StepFn, *,
            objects: Dict[str, Any], resume_state: Optional[Dict[str, Any]] = None,
            device: Optional[torch.device] = None) -> Tuple[int, List[Dict[str, float]]]:
        """Run ``epochs`` passes over ``stream`` (one step per batch), from ``resume_state``'s step
        when given (its run objects restored first). Returns (steps taken in total, history).

        Raises:
            NonFiniteLossError: a loss or logged value became NaN/Inf (the first bad step; no
                checkpoint is written after it).
        """
        start, history = 0, []
        if resume_state is not None:
            for name, obj in objects.items():
                restore_state(obj, resume_state[name])
            start, history = int(resume_state["step"]), list(resume_state.get("history", []))
        total = len(stream) * epochs
        mon = _Monitor(self.stage, self.keys, device or torch.device("cpu"), start, history)
        bar = _bar(total, start, self.desc, self.progress)
        try:
            step = start
            while step < total:
                epoch, pos = divmod(step, len(stream))
                for batch in stream.epoch_batches(epoch, pos):
                    loss, values = step_fn(step, batch)
                    mon.record(step, loss, values)
                    step += 1
                    self._end_step(step, total, mon, bar, objects)
                mon.flush()
        except _NonFinite as bad:
            raise NonFiniteLossError(self.stage, bad.step,
                                     getattr(self.checkpoint_fn, "last_path", None)) from None
        finally:
            bar.close()
        return step, mon.history

    def _end_step(self, step: int, total: int, mon: _Monitor, bar, objects) -> None:
        """Progress bar; at log points (and at a checkpoint or the last step) the host read that
        also detects non-finite values; a checkpoint every ``checkpoint_every`` steps."""
        bar.update(1)
        ckpt_now = self.checkpoint_fn is not None and self.checkpoint_every > 0 \
            and step % self.checkpoint_every == 0
        if step % self.log_every == 0 or step == total or ckpt_now:
            bar.set_postfix(refresh=False, **self.postfix(mon.flush()))
        if ckpt_now and step < total:
            state = {name: capture_state(obj) for name, obj in objects.items()}
            self.checkpoint_fn(step, {"stage": self.stage, "step": step,
                                      "history": list(mon.history), **self.extra, **state})


def _bar(total: int, initial: int, desc: str, progress: bool):
    from tqdm.auto import tqdm
    return tqdm(total=total, initial=initial, desc=desc, disable=not progress, leave=True,
                dynamic_ncols=True)
