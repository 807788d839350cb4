"""Tensor values in error messages: all of them for a short tensor, else a count and the offending
entries with their indices, so that a bad entry among a million does not print a million numbers."""
from __future__ import annotations

from typing import Optional

import torch

__all__ = ["SHOWN_MAX", "shown"]

#: The most entries an error message prints of one tensor.
SHOWN_MAX = 8


def shown(t: torch.Tensor, bad: Optional[torch.Tensor] = None) -> str:
    """``str(t.tolist())`` when ``t`` has at most `SHOWN_MAX` entries; otherwise its number of
    entries and up to `SHOWN_MAX` of them with their flat indices: those where the bool mask
    ``bad`` (``t``'s shape) is True and how many there are, or the first ones without a mask, e.g.
    ``"1000 values, 2 of them offending: [3] nan, [17] -1.0"``. The values are copied to the host."""
    if t.numel() <= SHOWN_MAX:
        return str(t.tolist())
    flat = t.detach().reshape(-1).cpu()
    if bad is None:
        idx, what = range(SHOWN_MAX), "the first"
    else:
        hit = bad.detach().reshape(-1).cpu().nonzero().flatten()
        idx, what = hit[:SHOWN_MAX].tolist(), f"{hit.numel()} of them offending"
    return f"{t.numel()} values, {what}: " + ", ".join(f"[{i}] {flat[i].item()}" for i in idx)
