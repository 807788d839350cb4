"""`extract_features`: penultimate-layer features of a model (the input of its last ``nn.Linear``,
or of a given layer) or a feature function's output, batch by batch, for
`entangle_ext.splits.split_by_similarity` (which re-exports it)."""
from __future__ import annotations

from typing import Callable, List, Optional, Union

import numpy as np
import torch

from ._split_checks import int_value

__all__ = ["extract_features"]


@torch.no_grad()
def extract_features(model_or_fn: Union[torch.nn.Module, Callable], data, *, batch_size: int = 256,
                     device=None, layer: Optional[torch.nn.Module] = None) -> torch.Tensor:
    """Features for `split_by_similarity`.

    Args:
        model_or_fn: an ``nn.Module`` (features = the input of ``layer``, by default the model's
            last ``nn.Linear`` in registration order, i.e. the penultimate activations of ResNet
            ``fc``, torchvision ViT ``heads.head``, HF ``classifier``), or any callable mapping an
            input batch to (B, D) features.
        data: a (N, ...) tensor, a map-style Dataset (anything with ``len`` and integer indexing:
            a numpy array, a list) of ``(x, y)`` tuples, bare inputs or dicts (dict items are passed
            as ``model(**inputs)``, minus ``labels``), or a ``DataLoader`` over such a dataset (its
            batches are used as they come, in its order: use one without shuffling to keep rows
            aligned with the dataset).
        batch_size: samples per forward pass, an integer >= 1 (ignored for a DataLoader, whose own
            batches are used). device: where to run (default: the model's device or CPU).
    A tensor or numpy array needs its batch dimension first (a single sample ``x`` is
    ``x.unsqueeze(0)``), and every batch must give one feature row per sample.
    Floating inputs are cast to a module's dtype; a module runs in eval mode and every submodule's
    ``training`` flag is set back afterwards (also on error).
    Returns:
        (N, D) float32 CPU tensor (flattened per sample).
    Raises:
        TypeError: ``batch_size`` not an integer; ``data`` neither a tensor, a DataLoader nor a
            sized, indexable dataset; a feature function that returns something else than a
            tensor (e.g. a numpy array).
        ValueError: ``batch_size`` < 1; a tensor / numpy array ``data`` without a batch
            dimension (0-D or 1-D); features whose first dimension is not the batch's sample
            count (e.g. a function returning one (D,) vector per batch); a module without ``nn.Linear`` and no ``layer`` given; the
            hook never fired; the model cannot run on the inputs (e.g. a feature width other than
            its first ``nn.Linear``'s: the message names the expected and the given width).
    """
    from torch.utils.data import DataLoader
    from .unlearn.inputs import training_flags_kept
    from .unlearn.precision import model_dtype

    batch_size = int_value(batch_size, "batch_size", minimum=1)
    if not isinstance(data, (torch.Tensor, DataLoader)) and not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
        raise TypeError(f"data must be a tensor, a map-style Dataset (len and integer indexing) or a DataLoader, "
                        f"got {type(data).__name__}")
    if isinstance(data, (torch.Tensor, np.ndarray)) and data.ndim < 2:
        raise ValueError(f"data must be a batch of samples, (N, ...) with N first, got shape {tuple(data.shape)}: "
                         "for one sample x pass x.unsqueeze(0) (numpy: x[None]), for N scalar samples x[:, None]")
    is_module = isinstance(model_or_fn, torch.nn.Module)
    if device is None:
        device = next(model_or_fn.parameters()).device if is_module and any(True for _ in model_or_fn.parameters()) \
            else torch.device("cpu")
    captured: List[torch.Tensor] = []
    handle = None
    if is_module:
        if layer is None:
            lin = [m for m in model_or_fn.modules() if isinstance(m, torch.nn.Linear)]
            if not lin:
                raise ValueError("the model has no nn.Linear layer; pass layer= or a feature function")
            layer = lin[-1]
        handle = layer.register_forward_hook(lambda m, inp, out: captured.append(inp[0].detach()))
    dtype = model_dtype(model_or_fn) if is_module else None
    try:
        with training_flags_kept(model_or_fn if is_module else None):
            if is_module:
                model_or_fn.eval()
            feats = [_features_of(model_or_fn, x, captured if is_module else None)
                     for x in _input_batches(data, batch_size, device, dtype)]
    finally:
        if handle is not None:
            handle.remove()
    return torch.cat(feats) if feats else torch.zeros(0, 0)


def _input_batches(data, batch_size: int, device, dtype):
    """The model inputs of ``data`` (a tensor or a Dataset of (x, y) / dict items), ``batch_size``
    samples at a time, on ``device``, floating tensors cast to ``dtype`` (None: as they are)."""
    from torch.utils.data import DataLoader
    from .unlearn.data import cast_floating, move_batch, split_batch
    from .unlearn.source import batch_items

    def inputs_of(b):
        if isinstance(b, dict):
            return {k: v for k, v in b.items() if k != "labels"}
        return split_batch(b)[0] if isinstance(b, (tuple, list)) else b

    if isinstance(data, DataLoader):
        for b in data:
            yield cast_floating(move_batch(inputs_of(b), device), dtype)
        return
    n = data.shape[0] if isinstance(data, torch.Tensor) else len(data)
    for s in range(0, n, batch_size):
        if isinstance(data, torch.Tensor):
            x = data[s:s + batch_size]
        else:
            x = inputs_of(batch_items([data[i] for i in range(s, min(n, s + batch_size))], "the dataset's items"))
        yield cast_floating(move_batch(x, device), dtype)


def _features_of(model_or_fn, x, captured: Optional[List[torch.Tensor]]) -> torch.Tensor:
    """(B, D) float32 CPU features of one input batch: the hooked layer's input (``captured``
    given) or the function's output; (B, T, D) token features keep their first token."""
    if captured is not None:
        captured.clear()
    try:
        out = model_or_fn(**x) if isinstance(x, dict) else model_or_fn(x)
    except (RuntimeError, TypeError, IndexError) as e:
        raise ValueError(_forward_failure(model_or_fn, x, e)) from e
    if captured is not None:
        if not captured:
            raise ValueError("the feature layer was not called in forward()")
        out = captured[-1]
    elif not isinstance(out, torch.Tensor):
        raise TypeError(f"the feature function must return a (B, D) tensor, got {type(out).__name__}"
                        + (" (wrap it: torch.as_tensor(...))" if isinstance(out, np.ndarray) else ""))
    rows = _rows(x)
    if out.dim() == 0 or (rows is not None and out.shape[0] != rows):
        what = "the feature layer's input" if captured is not None else "the feature function's output"
        raise ValueError(f"{what} has shape {tuple(out.shape)} for a batch of {rows} samples: its first "
                         "dimension must be the batch (one feature row per sample)")
    if out.dim() == 3:          # (B, T, D) token features: take the first token (CLS)
        out = out[:, 0]
    return out.reshape(out.shape[0], -1).float().cpu()


def _rows(x) -> Optional[int]:
    """The sample count of an input batch: the first dimension of the tensor, or of a dict's /
    sequence's first tensor; None when there is none."""
    if isinstance(x, torch.Tensor):
        return x.shape[0] if x.dim() else None
    values = x.values() if isinstance(x, dict) else x if isinstance(x, (tuple, list)) else ()
    return next((_rows(v) for v in values if isinstance(v, torch.Tensor)), None)


def _forward_failure(model_or_fn, x, e: BaseException) -> str:
    """The message of a forward pass that failed on the batch ``x``: the inputs' shape, the width the
    model's first ``nn.Linear`` expects when a tensor's last dimension differs from it, and the
    first line of the error."""
    from .unlearn.inputs import describe_inputs
    what = type(model_or_fn).__name__ if isinstance(model_or_fn, torch.nn.Module) else "the feature function"
    msg = f"{what} cannot run on the inputs ({describe_inputs(x)})"
    if isinstance(model_or_fn, torch.nn.Module) and isinstance(x, torch.Tensor) and x.dim() >= 1:
        first = next((m for m in model_or_fn.modules() if isinstance(m, torch.nn.Linear)), None)
        if first is not None and x.shape[-1] != first.in_features:
            msg += (f": its first nn.Linear expects {first.in_features} features per sample, the data has "
                    f"{x.shape[-1]}")
    return f"{msg} ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
