"""Evaluation of the three splits (train and held-out): accuracy and mean cross-entropy at each
evaluation point (original / after Stage 1 / after Stage 2; docs/algorithm.md §10). The table,
plot and report files built from these results are in `entangle_ext.unlearn.report`."""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from .data import BatchStream, Splits, forward_logits, split_batch

__all__ = ["evaluate"]


@torch.no_grad()
def evaluate(model: torch.nn.Module, splits: Splits, *, device=None, batch_size: int = 512,
             keep_forget_losses: bool = True, num_classes: Optional[int] = None) -> Dict[str, dict]:
    """Accuracy and mean cross-entropy of ``model`` (eval mode, no grad) on every present split.

    Args:
        model: returns (B, C) logits. splits: `Splits`. device: default = the model's device.
        batch_size: evaluation batch (samples). num_classes: expected C (default: from logits).
        keep_forget_losses: also return the per-sample CE of the forget train split.
    Returns:
        {split name: {"acc": fraction in [0,1], "loss": mean CE in nats, "n": int}}; the forget
        entry also has "retained" (fraction of forget samples still classified correctly, = acc)
        and, if requested, "losses" (list of floats, per-sample CE in dataset order).
    Raises:
        ValueError: empty split, non 2-D logits, labels outside [0, C).
    """
    device = torch.device(device) if device is not None else next(model.parameters()).device
    model.eval()
    splits.check()
    out = {}
    for name, ds in splits.named().items():
        stream = BatchStream(ds, batch_size, shuffle=False, seed=0, name="eval", device=device)
        correct = torch.zeros((), dtype=torch.long, device=device)
        loss = torch.zeros((), dtype=torch.float64, device=device)
        bad = torch.zeros((), dtype=torch.long, device=device)
        losses = []
        C = num_classes
        for b in stream.epoch_batches(0):
            inputs, y = split_batch(b)
            logits = forward_logits(model, inputs)
            if C is None:
                C = logits.shape[1]
            if logits.shape[1] != C:
                raise ValueError(f"model returned {logits.shape[1]} classes, expected {C}")
            y = y.long()
            bad += ((y < 0) | (y >= C)).sum()
            yc = y.clamp(0, C - 1)
            ce = torch.nn.functional.cross_entropy(logits.float(), yc, reduction="none")
            correct += (logits.argmax(1) == yc).sum()
            loss += ce.double().sum()
            if name == "forget" and keep_forget_losses:
                losses.append(ce)
        if int(bad):
            raise ValueError(f"split {name!r}: {int(bad)} labels outside the model's classes [0, {C})")
        n = len(ds)
        r = {"acc": int(correct) / n, "loss": float(loss) / n, "n": n}
        if name == "forget":
            r["retained"] = r["acc"]
            if keep_forget_losses:
                r["losses"] = torch.cat(losses).cpu().tolist()
        out[name] = r
    return out
