"""Channels-last inputs for convolutional models on the CPU (ours; an engineering choice, not
part of the method).

oneDNN's CPU convolutions run faster on NHWC (``torch.channels_last``) activations than on NCHW
ones; a convolution whose input is channels-last produces channels-last outputs, so converting the
4-D image batch once before the model's forward is enough for the whole network. The parameters
keep their own (contiguous) layout and autograd accumulates their gradients in it, so the flat
gradient views that Stage 2 projects and every optimizer see exactly what they see without it.
Only the rounding of the convolutions changes (float32 parameter differences of ~1e-8 after a
Stage-2 step of the ``cifar100`` / ``cpu`` model).

A run config's ``channels_last`` field (`UnlearnConfig`, every baseline's `MethodConfig`) takes
"auto" (default), True or False; `resolve_channels_last` turns it into a bool once per run, after
the pre-flight batch, and `channels_last_scope` makes `forward_logits`
(entangle_ext/unlearn/batch.py), hence every forward pass of the run, convert its inputs.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

import torch

from .nest import map_tensors, tensors

__all__ = ["CHANNELS_LAST_CHOICES", "channels_last_scope", "channels_last_active", "to_channels_last",
           "resolve_channels_last", "has_conv2d"]

#: What a run config's ``channels_last`` field takes.
CHANNELS_LAST_CHOICES = ("auto", True, False)

_ON: contextvars.ContextVar[bool] = contextvars.ContextVar("entangle_channels_last", default=False)


@contextlib.contextmanager
def channels_last_scope(on: bool) -> Iterator[None]:
    """Within the block, `to_channels_last` (called by `forward_logits` on every batch) converts
    4-D floating inputs to ``torch.channels_last`` when ``on`` is True. Restored on exit (also on
    error). Raises TypeError when ``on`` is not a bool."""
    if not isinstance(on, bool):
        raise TypeError(f"channels_last_scope takes a bool, got {on!r}")
    token = _ON.set(on)
    try:
        yield
    finally:
        _ON.reset(token)


def channels_last_active() -> bool:
    """Whether the current `channels_last_scope` converts inputs."""
    return _ON.get()


def _convert(t: torch.Tensor) -> torch.Tensor:
    """``t`` channels-last when it is a 4-D floating tensor, else as it is."""
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 and t.is_floating_point() else t


def to_channels_last(inputs: Any) -> Any:
    """``inputs`` (a tensor, or dicts / tuples / lists of them, nested) with every 4-D floating
    tensor in ``torch.channels_last`` memory format (a copy unless it already is) when a
    `channels_last_scope` is on; the other values, and everything outside such a scope, unchanged.
    Shapes, dtypes, devices and values are kept: only the strides change."""
    return map_tensors(_convert, inputs) if _ON.get() else inputs


def has_conv2d(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds a `torch.nn.Conv2d` (or a subclass) anywhere."""
    return any(isinstance(m, torch.nn.Conv2d) for m in model.modules())


def _four_d(inputs) -> bool:
    """Whether ``inputs`` hold a 4-D floating tensor at any depth of dicts / tuples / lists."""
    return any(t.dim() == 4 and t.is_floating_point() for t in tensors(inputs))


@torch.no_grad()
def resolve_channels_last(setting, model: torch.nn.Module, inputs, device: torch.device) -> bool:
    """What a run config's ``channels_last`` runs as, for ``model`` on ``device`` with a sample
    batch ``inputs`` (the pre-flight batch, already on ``device`` and in the model's dtype; call
    inside the run's autocast scope, model in eval mode).

    Args:
        setting: "auto", True or False (`CHANNELS_LAST_CHOICES`).
    Returns: False for False; for "auto", True only on a CPU ``device``, for a model with a
        `torch.nn.Conv2d`, on inputs with a 4-D floating tensor, and when the model's logits on
        the channels-last copy of ``inputs`` equal those on ``inputs`` (to 1e-3 of their largest
        magnitude, at least 1; 3e-2 for low-precision logits, e.g. under bfloat16 autocast) -- anything else,
        an exception from the model included (e.g. a ``.view`` of a channels-last activation),
        gives False; for True, True whenever the inputs hold a 4-D floating tensor.
    Raises:
        ValueError: ``setting`` outside `CHANNELS_LAST_CHOICES`; for True, a model that raises
            on the channels-last inputs or whose logits differ (beyond the tolerance above), naming
            the cause and the way out (``channels_last=False``).
    """
    from .batch import forward_logits   # batch.py imports this module

    if not (isinstance(setting, bool) or (isinstance(setting, str) and setting == "auto")):
        raise ValueError(f"channels_last must be one of {CHANNELS_LAST_CHOICES}, got {setting!r}")
    if setting is False or not _four_d(inputs):
        return False
    if setting == "auto" and (torch.device(device).type != "cpu" or not has_conv2d(model)):
        return False
    with channels_last_scope(False):
        ref = forward_logits(model, inputs)
        try:
            with channels_last_scope(True):
                got = forward_logits(model, inputs)
        except Exception as e:   # any failure of the user's model on strided inputs
            if setting == "auto":
                return False
            raise ValueError(f"channels_last=True: the model ({type(model).__name__}) fails on channels-last "
                             f"inputs ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); a "
                             "model that calls .view on image activations does; set channels_last=False "
                             "(command line: --set channels_last=false)") from e
    low = ref.dtype in (torch.float16, torch.bfloat16)   # bf16 autocast returns bf16 logits
    tol = (3e-2 if low else 1e-3) * max(1.0, float(ref.float().abs().max()))
    same = got.shape == ref.shape and bool(torch.isfinite(got).all()) and \
        float((got.float() - ref.float()).abs().max()) <= tol
    if not same and setting is True:
        raise ValueError(f"channels_last=True: the model ({type(model).__name__}) gives other logits on "
                         "channels-last inputs than on contiguous ones (a custom op that assumes contiguous "
                         "memory?); set channels_last=False (command line: --set channels_last=false)")
    return same
