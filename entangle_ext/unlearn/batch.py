"""Batch helpers below both the data streams (`unlearn/data.py`) and the ranks
(`unlearn/distributed.py`): concatenating and slicing tuple/list or dict batches along dim 0,
moving them to a device, splitting them into (inputs, labels), checking and casting the labels
and floating inputs (`prepare_batch`), and calling the model on them (`forward_logits`).
`unlearn/data.py` re-exports every name here."""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch

from .memory_format import to_channels_last
from .nest import first_tensor, map_tensors, rebuild, sample_nest
from .precision import LOW_PRECISION, autocast_for

__all__ = ["concat_batches", "slice_batch", "sliceable", "move_batch", "split_batch", "cast_floating", "prepare_batch",
           "forward_logits", "loss_logits", "batch_size_of", "require_graph", "LABEL_DTYPES"]

#: Label dtypes accepted (cast to int64 where batches are made).
LABEL_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.uint16,
                torch.uint32, torch.uint64)
_LABEL_KEYS = ("labels", "label")


def _cat(parts: List[Any]):
    """``parts`` (nests of one structure) concatenated leaf by leaf; ValueError when their structures
    differ (a dict key or a sequence entry that only some parts have would be dropped silently) or
    hold a leaf that is not a tensor (a str would recurse into its characters)."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts)
    if isinstance(first, dict):
        if any(not isinstance(p, dict) or p.keys() != first.keys() for p in parts):
            raise ValueError("batches with different dict keys")
        return {k: _cat([p[k] for p in parts]) for k in first}
    plain = (tuple, list)   # default_collate's lists and a dataset's tuples are one form; a namedtuple its own
    if not isinstance(first, plain) or any(not isinstance(p, plain) or len(p) != len(first) or (
            type(p) is not type(first) and not {type(p), type(first)} <= set(plain)) for p in parts):
        raise ValueError("batches with different sequences")
    return rebuild(first, [_cat([p[i] for p in parts]) for i in range(len(first))])


def concat_batches(batches: List[Any]):
    """Concatenate batches along dim 0 (their inputs at any depth of nested dicts / tuples / lists
    when every leaf is a per-sample tensor, `sample_nest`), or return None when they do not
    concatenate: shapes that differ (e.g. padded text of different lengths), or inputs holding
    anything else (a tuple of str, None, a ragged list): then each batch is its own pass."""
    try:
        if not all(sample_nest(split_batch(b)[0], batch_size_of(b)) for b in batches):
            return None
        if isinstance(batches[0], dict):
            return _cat(batches)
        return tuple(_cat([tuple(b) for b in batches]))
    except (RuntimeError, TypeError, KeyError, IndexError, ValueError):
        return None


def _slice(v, start: int, stop: int):
    if isinstance(v, torch.Tensor):
        return v[start:stop]
    if isinstance(v, dict):
        return {k: _slice(x, start, stop) for k, x in v.items()}
    return rebuild(v, [_slice(x, start, stop) for x in v])


def _cut(v, start: int, stop: int):
    """``v[start:stop]``, through dicts (a dict of inputs holding a tuple of str: ``dict[0:0]`` raised)."""
    if isinstance(v, dict):
        return {k: _cut(x, start, stop) for k, x in v.items()}
    return v[start:stop]


def sliceable(batch) -> bool:
    """Whether `slice_batch` can cut ``batch`` into samples: its inputs are a `sample_nest` of its
    batch size (labels included, every leaf a per-sample tensor)."""
    inputs, y = split_batch(batch)
    return sample_nest(inputs, int(y.shape[0]))


def slice_batch(batch, start: int, stop: int):
    """Samples [start, stop) of a tuple/list or dict batch: every tensor of its inputs (at any depth
    of nested dicts / tuples / lists; the nesting is kept) and its labels, cut along dim 0. A batch
    whose inputs are not a `sample_nest` (a tuple of str, None, a ragged list) has its dicts entered
    and every other entry cut as a sequence of samples (enough for the 0-sample batch of a split's
    structure, e.g. an empty part of a global batch on one rank); the stages never micro-batch such
    a batch (`sliceable`)."""
    if not sliceable(batch):
        if isinstance(batch, dict):
            return _cut(batch, start, stop)
        return tuple(_cut(v, start, stop) for v in batch)
    if isinstance(batch, dict):
        return _slice(batch, start, stop)
    return tuple(_slice(v, start, stop) for v in batch)


def move_batch(batch, device):
    """Move a tuple/list/dict batch to ``device`` (non_blocking)."""
    return map_tensors(lambda t: t.to(device, non_blocking=True), batch)


def split_batch(batch, split: Optional[str] = None) -> Tuple[Any, torch.Tensor]:
    """(inputs, labels) of a 2-element tuple/list or dict batch (dict labels under ``"labels"`` or
    ``"label"``; every other entry is a model input). Raises ValueError otherwise, also for 3 or
    more elements (which one is the label is not guessed), naming ``split``, the split the batch
    came from, when given, and what a split's items must be."""
    where = "" if split is None else f"split {split!r}: "
    if isinstance(batch, dict):
        key = next((k for k in _LABEL_KEYS if k in batch), None)
        if key is None:
            raise ValueError(f"{where}dict batches need a 'labels' (or 'label') entry, got keys {sorted(batch)}")
        return {k: v for k, v in batch.items() if k not in _LABEL_KEYS}, batch[key]
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    got = f"a {len(batch)}-element {type(batch).__name__}" if isinstance(batch, (tuple, list)) else \
        f"a {type(batch).__name__}"
    more = ("; which of its elements is the label is not guessed (an (x, sample_id, y) item would train on "
            "the ids): put extra model inputs into the first element, ((x, extra), y), or use a dict with "
            "'labels'") if isinstance(batch, (tuple, list)) and len(batch) > 2 else ""
    raise ValueError(f"{where}its items give {got} batch; batches must be (x, y) tuples or dicts with 'labels': "
                     "each item of a split is an (inputs, label) pair or a dict with 'labels' (e.g. "
                     f"torch.utils.data.TensorDataset(X, y)){more}")


def cast_floating(x, dtype: Optional[torch.dtype]):
    """``x`` with its floating tensors (at any depth) in ``dtype``; None: unchanged."""
    if dtype is None:
        return x
    return map_tensors(lambda t: t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t, x)


def prepare_batch(batch, input_dtype: Optional[torch.dtype] = None, where: str = "batch"):
    """A batch as the stages use it: ``(x, y)`` or ``{**inputs, "labels": y}`` with ``y`` int64
    (from any integer dtype) and the floating tensors of the inputs cast to ``input_dtype`` (None:
    left as they are). Dtype checks only: no host synchronisation.

    Raises:
        ValueError: labels that are not a 1-D integer tensor (float, bool, complex, one-hot...);
            the message names ``where`` (the stream, e.g. "s1/remote") and the accepted dtypes;
            a batch that is no (x, y) tuple or dict with labels (`split_batch`; names the split).
    """
    split = where.split("/")[-1]
    inputs, y = split_batch(batch, split)
    if not isinstance(y, torch.Tensor) or y.dim() != 1 or y.dtype not in LABEL_DTYPES:
        got = f"{y.dtype} of shape {tuple(y.shape)}" if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(f"split '{split}': labels must be integer class indices of shape (batch,) "
                         f"(any integer dtype: {', '.join(str(d) for d in LABEL_DTYPES)}), got "
                         f"{got}; float, bool, one-hot or soft labels are not supported")
    y = y if y.dtype == torch.int64 else y.long()
    inputs = cast_floating(inputs, input_dtype)
    return {**inputs, "labels": y} if isinstance(batch, dict) else (inputs, y)


def _device_type(model: torch.nn.Module, inputs) -> str:
    for p in model.parameters():
        return p.device.type
    t = inputs if isinstance(inputs, torch.Tensor) else next(
        (v for v in (inputs.values() if isinstance(inputs, dict) else inputs)
         if isinstance(v, torch.Tensor)), None)
    return t.device.type if t is not None else "cpu"


def forward_logits(model: torch.nn.Module, inputs) -> torch.Tensor:
    """Call the model (``model(x)`` or ``model(**inputs)``; under autocast inside an
    `amp_scope` of ``entangle_ext/unlearn/precision.py``; 4-D floating inputs in channels-last
    memory format inside a `channels_last_scope` of ``entangle_ext/unlearn/memory_format.py``)
    and return (B, C) logits.

    Accepts plain tensors, tuples (first element), dicts with a ``"logits"`` key and objects with
    ``.logits`` (Hugging Face), see `logits_of`. Raises ValueError when the output is not a 2-D
    tensor of logits.

    A batch of one sample through a model whose BatchNorm layers are in train mode (a split of
    one sample, which `BatchStream` cannot fold; torch raises "Expected more than 1 value per
    channel when training"): those layers normalise it with their running statistics (eval mode
    for this pass, their running statistics not updated) and are back in train mode afterwards.
    """
    return logits_of(model_output(model, inputs), lone=_batch_size(inputs) == 1)


def model_output(model: torch.nn.Module, inputs):
    """The model's raw output for ``inputs`` (what `forward_logits` takes the logits from), with
    its autocast, channels-last and lone-sample batch-norm handling."""
    inputs = to_channels_last(inputs)
    lone = _lone_sample_batchnorms(model, inputs)
    for m in lone:   # one sample has no batch statistics: BatchNorm normalises with its running ones
        m.train(False)
    try:
        with autocast_for(_device_type(model, inputs)):
            out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    finally:
        for m in lone:
            m.train(True)
    return out


def logits_of(out, lone: bool = False) -> torch.Tensor:
    """The (B, C) logits in a model's output: the tensor itself, ``out["logits"]``,
    ``out.logits`` (Hugging Face), or element 0 of a tuple / list. Raises ValueError when that is
    not a 2-D tensor (``lone``: the batch held one sample, which the message then says)."""
    where = ""
    if isinstance(out, dict) and "logits" in out:
        out, where = out["logits"], " (its \"logits\" entry)"
    elif hasattr(out, "logits"):
        out, where = out.logits, " (its .logits)"
    elif isinstance(out, (tuple, list)):
        where = f" (element 0 of the {type(out).__name__} it returns: the logits must come first)"
        out = out[0] if len(out) else None
    if not isinstance(out, torch.Tensor) or out.dim() != 2:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        hint = ("; this batch held one sample: a model that squeezes its output (``.squeeze()``) "
                "drops the batch dimension then (squeeze only the dimensions meant, e.g. "
                "``.flatten(1)`` or ``.squeeze(-1)``)" if lone and isinstance(out, torch.Tensor)
                and out.dim() == 1 else "")
        raise ValueError(f"the model must return 2-D logits (batch, classes); got {shape}{where}{hint}")
    return out


def _batch_size(inputs) -> Optional[int]:
    """Dim 0 of the input tensor (of the first tensor, depth first, of nested inputs); None when there is none."""
    first = first_tensor(inputs)
    return None if first is None or first.dim() == 0 else int(first.shape[0])


def _lone_sample_batchnorms(model: torch.nn.Module, inputs) -> List[torch.nn.Module]:
    """The BatchNorm layers of ``model`` in train mode when ``inputs`` hold one sample, else []."""
    if _batch_size(inputs) != 1:
        return []
    return [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training]


def loss_logits(model: torch.nn.Module, inputs) -> torch.Tensor:
    """(B, C) logits of ``inputs`` (`forward_logits`, so under the run's autocast) in the dtype
    every loss of the package is computed in: float32 for float16/bfloat16 logits (autocast or a
    half-precision model; the cast is differentiable), the logits' own dtype otherwise."""
    logits = forward_logits(model, inputs)
    return logits.float() if logits.dtype in LOW_PRECISION else logits


def require_graph(loss: torch.Tensor) -> torch.Tensor:
    """``loss`` itself when autograd can differentiate it (``requires_grad``), else ValueError: the
    model's logits carry no graph to its trainable parameters, because its forward detaches them
    (``.detach()``, ``torch.no_grad()``, ``.item()`` or a NumPy round trip inside ``forward``) or
    the loss was computed with gradients off. Checked before every backward pass of the package's
    training loops, in place of autograd's "element 0 of tensors does not require grad"."""
    if not loss.requires_grad:
        raise ValueError("the loss has no autograd graph to the model's trainable parameters, so there is no "
                         "gradient to train with: the model's forward detaches its output (.detach(), "
                         "torch.no_grad(), .item() or a NumPy round trip inside forward), or gradients were off "
                         f"where the loss was computed (torch.is_grad_enabled() is {torch.is_grad_enabled()})")
    return loss


def batch_size_of(batch) -> int:
    _, y = split_batch(batch)
    return int(y.shape[0])
