"""The per-sample values of a run's last evaluation, for the metrics that score its model.

`entangle_ext.compare` scores every unlearned model with `unlearning_metrics`, whose MIA-efficacy
needs `per_sample` values (loss, p_true, correct) of the forget, retain-train and held-out retain
splits: a forward pass over every split, just after the run's own final evaluation passed the same
model over the same splits (on the Tiny-ImageNet ``lite0`` setting ~50 s of one thread each).
Inside a `FinalOutputs` scope a run keeps the logits of each evaluation it makes without
autocast (``amp`` None), in one process, and `FinalOutputs.features` turns the last one into
`per_sample`'s values when that evaluation is of the model being scored (its state-dict hash),
with the metrics' batch size and memory format: the same values to the bit as the metrics'
own pass (`per_sample_of_outputs`). Otherwise (autocast runs, e.g. bf16 on CIFAR-100, whose
evaluation differs from the metrics' float32 pass; another batch size; a model changed after its
last evaluation) the metrics make their own pass as before.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Dict, Iterator, Optional

import torch

__all__ = ["FinalOutputs", "keep_outputs"]

_OPEN: contextvars.ContextVar[Optional["FinalOutputs"]] = contextvars.ContextVar(
    "entangle_ext_final_outputs", default=None)


def _state(model: torch.nn.Module) -> Optional[str]:
    from .fingerprint import original_state
    return original_state(model)


class FinalOutputs:
    """Context manager (``with FinalOutputs() as kept: ...``): the evaluations made inside it keep
    their outputs here (the last one wins); ``kept.features(model, ...)`` reads them back."""

    def __init__(self):
        self._last: Optional[Dict[str, Any]] = None
        self._token = None

    def __enter__(self) -> "FinalOutputs":
        self._token = _OPEN.set(self)
        return self

    def __exit__(self, *exc) -> None:
        _OPEN.reset(self._token)

    def record(self, model: torch.nn.Module, outputs: Dict[str, list], *, batch_size: int,
               channels_last: bool) -> None:
        self._last = {"state": _state(model), "outputs": outputs, "batch_size": int(batch_size),
                      "channels_last": bool(channels_last)}

    def features(self, model: torch.nn.Module, *, batch_size: int, channels_last: bool) -> Optional[Dict[str, dict]]:
        """{split: `per_sample` dict} of the MIA's splits (`MIA_SPLITS`) from the last kept
        evaluation when it was of ``model`` as it is now (state-dict hash) with this
        ``batch_size`` and memory format; None otherwise. Raises as `per_sample_of_outputs`
        (`NonFiniteOutputError` for non-finite logits)."""
        from .evaluate import per_sample_of_outputs
        from .mia import MIA_SPLITS
        last = self._last
        if last is None or last["batch_size"] != int(batch_size) or last["channels_last"] != bool(channels_last):
            return None
        if last["state"] is None or last["state"] != _state(model):
            return None
        return {name: per_sample_of_outputs(b, name) for name, b in last["outputs"].items() if name in MIA_SPLITS}


@contextlib.contextmanager
def keep_outputs(run) -> Iterator[Optional[Dict[str, list]]]:
    """`Run.evaluate`'s ``outputs`` dict for `evaluate`, recorded in the open `FinalOutputs` when the
    evaluation returns; None (nothing kept) outside one, under autocast or in a distributed run."""
    from .distributed import current
    kept = _OPEN.get()
    if kept is None or run.amp is not None or current().active:
        yield None
        return
    outputs: Dict[str, list] = {}
    yield outputs
    kept.record(run.model, outputs, batch_size=run.config.eval_batch_size, channels_last=run.channels_last)
