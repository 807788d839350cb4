"""The penalty schedule of `entangle_ext.AugmentedLagrangian` (docs/algorithm.md §2): "grow mu when
the violation does not shrink", one dual update at a time, with tensor ops only (no host sync and no
Python branch on a tensor value), so that it keeps working inside a replayed CUDA graph."""
from __future__ import annotations

import torch

__all__ = ["NO_MEASUREMENT", "schedule_step"]

#: ``prev_window`` while no window has had a finite |g| entry (per constraint, or for any constraint
#: with a scalar mu): nothing to compare with, and ``mean > shrink_ratio * inf`` is never true.
NO_MEASUREMENT = float("inf")


def schedule_step(absg: torch.Tensor, mu: torch.Tensor, window_sum: torch.Tensor, window_count: torch.Tensor,
                  prev_window: torch.Tensor, steps: torch.Tensor, *, every: int, growth: float,
                  shrink: float, mu_max: float) -> None:
    """Adds |g| of one dual update to the window and, when ``steps`` (already advanced) ends a window
    of ``every`` updates, applies the rule and starts the next window; all in place.

    Only finite |g| entries enter: ``window_sum`` (``(m,)``, state dtype) sums them and
    ``window_count`` (``(m,)``, int64) counts them, so a window's mean is over its finite entries.
    A constraint without a finite entry in the window has no measurement; with a scalar mu the
    measurement is the max of the measured constraints' means (none measured: none). At a window's
    end, where there is a measurement, mu <- max(mu, min(mu * growth, mu_max)) if it is >
    ``shrink`` times ``prev_window``, and it becomes ``prev_window``; where there is none, mu and
    ``prev_window`` stay (the next measurement is compared with the last one). ``prev_window`` is
    `NO_MEASUREMENT` (+inf) until a first measurement, so that one never grows mu.
    """
    finite = torch.isfinite(absg)
    window_sum.add_(torch.where(finite, absg, torch.zeros_like(absg)))
    window_count.add_(finite.to(window_count.dtype))
    at_end = torch.remainder(steps, every) == 0
    seen = window_count > 0
    mean = torch.where(seen, window_sum / window_count.clamp(min=1), torch.zeros_like(window_sum))
    if mu.dim() == 0:   # (a branch on the shape, fixed at capture, not on a value)
        mean, seen = mean.amax(), seen.any()   # unmeasured entries are 0 <= any measured mean
    measured = at_end & seen
    grow = measured & (mean > shrink * prev_window)
    grown = torch.maximum(mu, torch.clamp(mu * growth, max=mu_max))
    mu.copy_(torch.where(grow, grown, mu))
    prev_window.copy_(torch.where(measured, mean, prev_window))
    window_sum.copy_(torch.where(at_end, torch.zeros_like(window_sum), window_sum))
    window_count.copy_(torch.where(at_end, torch.zeros_like(window_count), window_count))
