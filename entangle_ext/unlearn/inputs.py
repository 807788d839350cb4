"""What every entry point asks of the caller's model and splits, and what it gives back: their
types, the device a call runs on, the trainable parameters, and the model's train/eval flags,
restored on exit (docs/algorithm.md §1). One home for these checks, shared by `unlearn`, the
one run lifecycle (`unlearn/run.py`), `stage1` / `stage2`, `evaluate`, the metrics and `compare`."""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Optional

import torch

from .data import BatchStream, Splits, forward_logits, split_batch
from .losses import trainable_params
from .memory_format import resolve_channels_last
from .precision import amp_scope, model_dtype

__all__ = ["check_model_and_splits", "model_device", "check_device_usable", "preflight", "probe_channels_last",
           "require_trainable", "training_flags_kept", "check_resume_model"]


def check_model_and_splits(model, splits, where: str) -> None:
    """Raise TypeError, naming ``where`` (e.g. "unlearn"), unless ``model`` is a `torch.nn.Module`
    and ``splits`` an `entangle_ext.Splits` (e.g. for a bare Dataset passed as ``splits``)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{where}: model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(splits, Splits):
        raise TypeError(f"{where}: splits must be an entangle_ext.Splits, got {type(splits).__name__}")


def model_device(model: torch.nn.Module, device=None) -> torch.device:
    """``device`` as a `torch.device`; None: the device of the model's first parameter, else of its
    first buffer. Raises ValueError when ``device`` is None and the model has neither (a module
    without state has no device of its own: pass ``device=``)."""
    if device is not None:
        return check_device_usable(torch.device(device))
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    raise ValueError(f"the model ({type(model).__name__}) has no parameters and no buffers, so it has no "
                     "device to run on: pass device= (e.g. device='cpu')")


def check_device_usable(device: torch.device) -> torch.device:
    """``device`` itself, or ValueError naming it when this process cannot run on it: a CUDA device
    without a usable GPU (or an index past the GPUs visible), an MPS device without MPS — instead
    of the run's error at the first tensor moved there."""
    if device.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            build = f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
            raise ValueError(f"device {str(device)!r}: no CUDA GPU is usable here (torch {torch.__version__}, "
                             f"{build}; torch.cuda.is_available() is False): pass device='cpu'")
        if device.index is not None and device.index >= n:
            raise ValueError(f"device {str(device)!r}: only {n} CUDA GPU(s) are visible (cuda:0..cuda:{n - 1})")
    elif device.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ValueError(f"device {str(device)!r}: MPS is not available here: pass device='cpu'")
    return device


def require_trainable(model: torch.nn.Module) -> List[torch.nn.Parameter]:
    """The trainable parameters of ``model`` (`trainable_params`). Raises ValueError when there are
    none (a model without parameters, or with ``requires_grad`` False for all of them)."""
    params = trainable_params(model)
    if not params:
        why = "it has no parameters at all" if next(model.parameters(), None) is None else \
            "requires_grad is False for all of them"
        raise ValueError(f"the model has no trainable parameters ({why}): nothing for unlearning to change")
    return params


@contextlib.contextmanager
def training_flags_kept(model: Optional[torch.nn.Module]) -> Iterator[None]:
    """Context manager: every submodule's ``training`` flag is set back on exit (also on error),
    one by one (``train()`` overrides, e.g. frozen blocks kept in eval mode, are respected).
    ``model`` None: nothing to keep."""
    flags = [] if model is None else [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        for m, training in flags:
            m.training = training


@torch.no_grad()
def preflight(model, splits: Splits, device, amp=None) -> int:
    """Probe one batch per split (every entry point: the two-stage family and the baselines) (integer 1-D labels, 2-D logits) before any compute (the caller
    has checked the trainable parameters, `require_trainable`). Returns C."""
    C = None
    with amp_scope(amp):
        for name in splits.named():
            probe = BatchStream(splits.source(name), 2, shuffle=False, seed=0, name=f"probe/{name}",
                                device=device, input_dtype=model_dtype(model))
            inputs, _ = split_batch(probe.fetch(torch.arange(min(2, probe.n))), name)
            try:
                logits = forward_logits(model, inputs)
            except (RuntimeError, TypeError, IndexError) as e:
                raise ValueError(f"split {name!r}: the model ({type(model).__name__}) cannot take this split's "
                                 f"inputs ({_describe_inputs(inputs)}; the model's parameters are "
                                 f"{model_dtype(model)}): {str(e).splitlines()[0]}") from e
            C = logits.shape[1] if C is None else C
    return C


@torch.no_grad()
def probe_channels_last(setting, model, splits: Splits, device, amp=None) -> bool:
    """What a run config's ``channels_last`` runs as (`resolve_channels_last` of
    entangle_ext/unlearn/memory_format.py) for ``model`` on ``device``, probed on two samples of
    the first split under the run's ``amp`` (after `preflight`; the model in eval mode). Raises
    ValueError as `resolve_channels_last` (``channels_last=True`` on a model that fails on
    channels-last inputs)."""
    if setting is False:
        return False
    name = next(iter(splits.named()))
    with amp_scope(amp):
        probe = BatchStream(splits.source(name), 2, shuffle=False, seed=0, name=f"probe/{name}",
                            device=device, input_dtype=model_dtype(model))
        inputs, _ = split_batch(probe.fetch(torch.arange(min(2, probe.n))))
        return resolve_channels_last(setting, model, inputs, device)


def _describe_inputs(inputs) -> str:
    """``shape (2, 63) torch.float32`` for a tensor; the same per entry for a tuple/list/dict."""
    if torch.is_tensor(inputs):
        return f"shape {tuple(inputs.shape)} {inputs.dtype}"
    if isinstance(inputs, dict):
        return ", ".join(f"{k}: {_describe_inputs(v)}" for k, v in inputs.items())
    if isinstance(inputs, (tuple, list)):
        return ", ".join(_describe_inputs(v) for v in inputs)
    return type(inputs).__name__


def check_resume_model(ckpt: Dict[str, Any], model: torch.nn.Module) -> None:
    """ValueError when the model state a checkpoint holds (its ``model`` and ``selected_model``
    entries) does not fit ``model``: a parameter or buffer missing on either side, or of another
    shape (e.g. another number of classes). Runs before anything is loaded into ``model``, so a
    refused resume leaves it untouched; the message names the mismatching entries (entries kept
    in a sharded checkpoint directory are checked by the sharded load itself)."""
    own = model.state_dict()
    for entry in ("model", "selected_model"):
        saved = ckpt.get(entry)
        if not isinstance(saved, dict):
            continue
        shown = lambda names: ", ".join(repr(n) for n in names[:8]) + (f" (+{len(names) - 8} more)"
                                                                      if len(names) > 8 else "")
        parts = []
        shapes = [f"{k!r}: {tuple(v.shape)} in the checkpoint vs {tuple(own[k].shape)} in the model"
                  for k, v in saved.items() if k in own and isinstance(v, torch.Tensor)
                  and isinstance(own[k], torch.Tensor) and tuple(v.shape) != tuple(own[k].shape)]
        if shapes:
            parts.append("other shapes: " + "; ".join(shapes[:8]) +
                         (f" (+{len(shapes) - 8} more)" if len(shapes) > 8 else ""))
        missing = sorted(set(saved) - set(own))
        if missing:
            parts.append("missing from the model: " + shown(missing))
        extra = sorted(set(own) - set(saved))
        if extra:
            parts.append("not in the checkpoint: " + shown(extra))
        if parts:
            raise ValueError(f"resume: the checkpoint's model does not fit the model given (another architecture "
                             f"or number of classes; checkpoint entry {entry!r}): " + "; ".join(parts) +
                             ". Resume with a model built as the checkpoint's run built it, or start a new run "
                             "without resume (command line: without --resume, in a fresh --out)")
