"""Evaluation of the three splits (train and held-out): accuracy and mean cross-entropy at each
evaluation point (original / after Stage 1 / after Stage 2; docs/algorithm.md §10), and the
per-sample losses, true-label probabilities and correctness the metrics are built on
(`per_sample`). The table,
plot and report files built from these results are in ``entangle_ext/unlearn/report.py``. Under several
ranks each evaluates its part of every batch; the counts and sums are all-reduced and the per-sample
losses gathered, so every rank reports each sample exactly once (docs/algorithm.md §11)."""
from __future__ import annotations

import numbers
from typing import Dict, Optional

import torch
import torch.nn.functional as F

from .data import BatchStream, Splits, check_batch_size, forward_logits, loss_logits, split_batch
from .distributed import SINGLE, Dist, scope
from .inputs import check_flags, check_model_and_splits, model_device, training_flags_kept
from .precision import amp_scope, model_dtype, resolve_amp_for

__all__ = ["evaluate", "per_sample", "per_sample_of_outputs", "NonFiniteOutputError"]

_MAX_LISTED = 20


def _non_finite_error(name: str, mask: torch.Tensor, n: int) -> ValueError:
    idx = mask.nonzero().flatten().tolist()
    listed = ", ".join(map(str, idx[:_MAX_LISTED])) + (", ..." if len(idx) > _MAX_LISTED else "")
    return ValueError(
        f"split {name!r}: the model's cross-entropy is non-finite (NaN/Inf) for {len(idx)} of {n} "
        f"samples, dataset indices [{listed}]: these inputs (or the model's output on them) "
        "contain NaN/Inf; fix the data before unlearning (nothing has been changed)")


@torch.no_grad()
def _evaluate_split(model, name: str, stream: BatchStream, C: Optional[int], keep_losses: bool,
                    check_finite: bool, d: Dist, outputs: Optional[list] = None):
    """(result dict, C) for one split; one host read (plus one to list non-finite samples).
    ``outputs``: a list that gets each batch's (logits, labels), detached, on the CPU."""
    dev = stream.device
    correct = torch.zeros((), dtype=torch.float64, device=dev)
    loss = torch.zeros((), dtype=torch.float64, device=dev)
    bad = torch.zeros((), dtype=torch.float64, device=dev)
    nonfinite = torch.zeros((), dtype=torch.float64, device=dev)
    losses, masks = [], []
    for b in stream.epoch_batches(0):
        inputs, y = split_batch(b, name)
        logits = loss_logits(model, inputs)   # float32 for float16/bfloat16 logits
        C = logits.shape[1] if C is None else C
        if logits.shape[1] != C:
            raise ValueError(f"model returned {logits.shape[1]} classes, expected {C}")
        bad += ((y < 0) | (y >= C)).sum()
        yc = y.clamp(0, C - 1)
        ce = torch.nn.functional.cross_entropy(logits, yc, reduction="none")
        correct += ((logits.argmax(1) == yc) & torch.isfinite(ce)).sum()   # NaN logits are not class 0
        loss += ce.double().sum()
        if check_finite:
            mask = ~torch.isfinite(ce)
            nonfinite += mask.sum()
            masks.append(mask)
        if keep_losses:
            losses.append(ce)
        if outputs is not None:
            outputs.append((logits.detach().cpu(), y.cpu()))
    sizes = [len(i) for i in stream.global_batch_indices(0)]
    n_correct, total, n_bad, n_nonfinite = d.sum_(torch.stack([correct, loss, bad, nonfinite])).tolist()
    if n_bad:
        raise ValueError(f"split {name!r}: {int(n_bad)} labels outside the model's classes [0, {C})")
    if n_nonfinite:
        raise _non_finite_error(name, d.gather(torch.cat(masks).double(), sizes) > 0, stream.n)
    r = {"acc": n_correct / stream.n, "loss": total / stream.n, "n": stream.n}
    if keep_losses:
        r["losses"] = d.gather(torch.cat(losses), sizes).cpu().tolist()
    return r, C


@torch.no_grad()
def evaluate(model: torch.nn.Module, splits: Splits, *, device=None, batch_size: int = 512,
             keep_forget_losses: bool = True, num_classes: Optional[int] = None,
             check_finite: bool = False, amp: Optional[str] = None,
             outputs: Optional[Dict[str, list]] = None) -> Dict[str, dict]:
    """Accuracy and mean cross-entropy of ``model`` (eval mode, no grad) on every present split.

    Per-sample CE is computed in the logits' dtype (float32 for float16/bfloat16 logits; float64
    stays float64) and summed in float64. Floating inputs are cast to the model's dtype. The
    model runs in eval mode; every submodule's ``training`` flag is set back on return (also on
    error).

    Args:
        model: returns (B, C) logits. splits: `Splits` with at least one split. device: default =
            the model's device (its first parameter's, else buffer's).
        batch_size: evaluation batch (samples, int >= 1). num_classes: expected C (default: from
            logits).
        keep_forget_losses: also return the per-sample CE of the forget train split.
        check_finite: raise when a per-sample CE is NaN/Inf (the run's check of the data
            before unlearning).
        amp: None, "bf16" or "auto" (bf16 where the device has bfloat16 matrix units, for a float32
            model): forward passes under `torch.autocast`.
        outputs: a dict that gets, per split, the list of its batches' (logits (B, C) in the loss
            dtype of `loss_logits`, labels (B,) int64), detached, on the CPU, in dataset order
            (`per_sample_of_outputs` turns them into `per_sample`'s values); left empty inside a
            distributed run, whose ranks see parts of every batch.
    Returns:
        {split name: {"acc": fraction in [0,1], "loss": mean CE in nats, "n": int}} (a sample
        whose CE is NaN/Inf counts as misclassified, and makes "loss" NaN/Inf); the forget
        entry also has "retained" (fraction of forget samples still classified correctly, = acc)
        and, if requested, "losses" (list of floats, per-sample CE in dataset order).
    Raises:
        TypeError: ``model`` not a `torch.nn.Module`, ``splits`` not a `Splits` (e.g. a bare
            Dataset: wrap it, ``Splits(forget=dataset)``); ``num_classes`` not None or an int;
            ``check_finite`` not a bool.
        ValueError: ``num_classes`` < 2, a ``splits`` without any split, an empty split, ``batch_size`` not an
            integer >= 1, no ``device`` for a model without parameters or buffers, non 2-D
            logits, labels outside [0, C) or not integer, and with ``check_finite`` a non-finite
            per-sample CE (naming the split and the dataset indices of those samples).
    """
    check_model_and_splits(model, splits, "evaluate")
    check_flags("evaluate", check_finite=check_finite)
    if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral)):
        raise TypeError(f"evaluate: num_classes must be None or an int >= 2 (the model's C), got "
                        f"{type(num_classes).__name__} {num_classes!r}")
    if num_classes is not None and num_classes < 2:
        raise ValueError(f"evaluate: num_classes must be None or an int >= 2 (the model's C), got {num_classes}")
    batch_size = check_batch_size(batch_size, "evaluate: batch_size")
    splits.check(required=())
    if not splits.named():
        raise ValueError("evaluate: the Splits holds no split to evaluate (every split is None)")
    device = model_device(model, device)
    out, C = {}, num_classes
    with training_flags_kept(model):
        model.eval()
        with scope(model) as (d, model), amp_scope(resolve_amp_for(amp, model, device)):
            if d.active:   # each rank sees a part of every batch: nothing kept
                outputs = None
            for name in splits.named():
                stream = BatchStream(splits.source(name), batch_size, shuffle=False, seed=0,
                                     name=f"eval/{name}", device=device, input_dtype=model_dtype(model))
                keep = name == "forget" and keep_forget_losses
                kept = None if outputs is None else outputs.setdefault(name, [])
                r, C = _evaluate_split(model, name, stream, C, keep, check_finite, d, kept)
                if name == "forget":
                    r["retained"] = r["acc"]
                out[name] = r
    return out


class NonFiniteOutputError(ValueError):
    """The scored model returns NaN/Inf logits (e.g. the weights of a diverged run overflow)."""


@torch.no_grad()
def per_sample(model: torch.nn.Module, dataset, *, device=None, batch_size: int = 512,
               name: str = "split") -> Dict[str, torch.Tensor]:
    """Per-sample quantities of ``model`` (eval mode, no grad; every submodule's ``training`` flag
    is set back afterwards, also on error) on ``dataset`` (a Dataset, DataLoader or `Source`,
    e.g. ``splits.source("forget")``), in dataset order. Floating inputs are cast to the model's
    dtype. Every sample on every rank, also inside a distributed run (its stream is not split
    over the ranks): the values of one process.

    Returns: {"loss": (N,) float64 CE in nats, "p_true": (N,) float64 softmax probability of the
    label (= exp(-loss)), "correct": (N,) bool argmax == label}, all on the CPU.
    Raises: ValueError for an empty dataset, ``batch_size`` not an integer >= 1, no ``device`` for
    a model without parameters or buffers, or labels outside [0, C); `NonFiniteOutputError` (a
    ValueError) for non-finite logits (``name`` names the split in the message).
    """
    batch_size = check_batch_size(batch_size, "per_sample: batch_size")
    device = model_device(model, device)
    stream = BatchStream(dataset, batch_size, shuffle=False, seed=0, name="metrics", device=device,
                         input_dtype=model_dtype(model), dist=SINGLE)
    if stream.n == 0:
        raise ValueError(f"split {name!r} is empty")
    batches = []
    with training_flags_kept(model):
        model.eval()
        for b in stream.epoch_batches(0):
            inputs, y = split_batch(b, name)
            batches.append(_per_sample_batch(forward_logits(model, inputs), y, name))
    return _per_sample_dict(batches)


def _per_sample_batch(logits: torch.Tensor, y: torch.Tensor, name: str):
    """(per-sample CE in float64, argmax == label) of one batch, on the CPU (`per_sample`)."""
    logits = logits.double()
    if bool(((y < 0) | (y >= logits.shape[1])).any()):
        raise ValueError(f"split {name!r}: labels outside the model's classes [0, {logits.shape[1]})")
    if not bool(torch.isfinite(logits).all()):
        raise NonFiniteOutputError(f"split {name!r}: the model returned non-finite logits")
    return F.cross_entropy(logits, y, reduction="none").cpu(), (logits.argmax(1) == y).cpu()


def _per_sample_dict(batches) -> Dict[str, torch.Tensor]:
    loss_t = torch.cat([b[0] for b in batches])
    return {"loss": loss_t, "p_true": torch.exp(-loss_t), "correct": torch.cat([b[1] for b in batches])}


def per_sample_of_outputs(batches, name: str = "split") -> Dict[str, torch.Tensor]:
    """`per_sample`'s dict from the (logits, labels) batches that `evaluate` kept (its
    ``outputs``): the same arithmetic batch by batch, so the same values to the bit as `per_sample`
    of the same model when the logits are those `per_sample` computes (no autocast, the same
    batch size, memory format and thread count). Raises as `per_sample` (ValueError for labels
    outside [0, C), `NonFiniteOutputError` for non-finite logits) and ValueError for no batches."""
    if not batches:
        raise ValueError(f"split {name!r} is empty")
    return _per_sample_dict([_per_sample_batch(logits, y, name) for logits, y in batches])
