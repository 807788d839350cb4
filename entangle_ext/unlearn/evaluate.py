"""Evaluation of the three splits (train and held-out) at original / after Stage 1 / after Stage 2,
the printed table, and the forget-loss histogram PNG (method.md: results are accuracies on all six)."""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from .data import BatchStream, Splits, forward_logits, split_batch

__all__ = ["evaluate", "format_table", "plot_forget_histograms"]


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


def format_table(evals: Dict[str, Dict[str, dict]]) -> str:
    """Accuracy (%) / mean CE table: rows = checkpoints (original, stage1, stage2), columns = splits."""
    names = []
    for e in evals.values():
        for n in e:
            if n not in names:
                names.append(n)
    head = f"{'model':<10}" + "".join(f"{n:>18}" for n in names)
    lines = ["accuracy % (mean CE)", head, "-" * len(head)]
    for tag, e in evals.items():
        cells = []
        for n in names:
            r = e.get(n)
            cells.append(f"{'-':>18}" if r is None else f"{100 * r['acc']:>9.2f} ({r['loss']:5.2f})")
        lines.append(f"{tag:<10}" + "".join(cells))
    return "\n".join(lines)


def plot_forget_histograms(evals: Dict[str, Dict[str, dict]], path: str, bins: int = 40,
                           num_classes: Optional[int] = None) -> str:
    """PNG of the per-sample forget-train CE histograms at each evaluation point (matplotlib, Agg).

    The dashed line marks log C (the Prop. 4.2 threshold) when ``num_classes`` is given.
    Returns the path written.
    """
    import math

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tags = [t for t, e in evals.items() if "losses" in e.get("forget", {})]
    fig, axes = plt.subplots(1, max(len(tags), 1), figsize=(4.2 * max(len(tags), 1), 3.2),
                             sharex=True, sharey=True, squeeze=False)
    hi = max([max(evals[t]["forget"]["losses"]) for t in tags] + [math.log(num_classes or 2)]) * 1.02
    edges = [hi * i / bins for i in range(bins + 1)]   # common bins: comparable panels
    for ax, t in zip(axes[0], tags):
        ls = evals[t]["forget"]["losses"]
        ax.hist(ls, bins=edges, color="tab:blue", alpha=0.8)
        ax.set_title(f"{t}: forget acc {100 * evals[t]['forget']['acc']:.1f}%")
        ax.set_xlabel("per-sample CE (nats)")
        if num_classes:
            ax.axvline(math.log(num_classes), color="k", ls="--", lw=1)
    axes[0][0].set_ylabel("forget samples")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
