"""The relearn-time settings of `entangle_ext.compare` (docs/algorithm.md §10): the defaults, their
checks and the threshold read off the original model."""
from __future__ import annotations

import numbers
from typing import Mapping, Optional

from .unlearn.data import Splits
from .unlearn.evaluate import evaluate
from .unlearn.fingerprint import one_thread
from .unlearn.metrics import RELEARN_LR, RELEARN_LR_GROWTH, RELEARN_MAX_STEPS, check_relearn_args

__all__ = ["DEFAULT_RELEARN", "check_relearn", "relearn_settings"]

DEFAULT_RELEARN = {"fraction": 0.9, "subset": 0.1, "lr": RELEARN_LR, "lr_growth": RELEARN_LR_GROWTH,
                   "max_steps": RELEARN_MAX_STEPS, "batch_size": 64}
"""Relearn time: threshold = ``fraction`` × the original model's forget-train accuracy; the rest are
`relearn_time` arguments: Adam step k at lr ``lr * lr_growth**k`` (1e-5 growing 10 % a step; a
constant 1e-3 relearned almost every model in one step, docs/algorithm.md §10), at most
``max_steps``."""


def check_relearn(relearn) -> None:
    """The relearn argument of `compare`, checked before any run (ValueError / TypeError)."""
    if relearn is None or relearn is False:
        return
    if not isinstance(relearn, Mapping):
        raise TypeError(f"relearn must be None, False or a dict of {sorted(DEFAULT_RELEARN)}, got {relearn!r}")
    unknown = sorted(set(relearn) - set(DEFAULT_RELEARN))
    if unknown:
        raise ValueError(f"relearn has unknown keys {unknown}; known: {sorted(DEFAULT_RELEARN)}")
    rl = {**DEFAULT_RELEARN, **relearn}
    if not (isinstance(rl["fraction"], numbers.Real) and 0 < rl["fraction"] <= 1):
        raise ValueError(f"relearn: fraction must be in (0, 1], got {rl['fraction']!r}")
    check_relearn_args(**{k: v for k, v in rl.items() if k != "fraction"})


def relearn_settings(relearn, model, splits, device, batch_size) -> Optional[dict]:
    """The `relearn_time` keywords of a comparison (``relearn``: None = `DEFAULT_RELEARN`, a dict =
    its overrides, False = no relearn time → None), ``threshold`` = ``fraction`` × θ0's accuracy on
    the forget train split (float32 pass of ``batch_size`` samples on one CPU thread: the value
    enters every cache key, `one_thread`); None when that threshold is 0."""
    if relearn is False:
        return None
    rl = {**DEFAULT_RELEARN, **(relearn or {})}
    # the forget split alone: the threshold reads nothing else (evaluating every split cost a
    # whole evaluation pass of θ0 per compare call, i.e. per task of every --jobs worker)
    forget = Splits(forget=splits.forget, collate_fn=splits.collate_fn, num_workers=splits.num_workers)
    with one_thread():   # a cache key: the same in the --jobs workers and their parent (`one_thread`)
        acc = evaluate(model, forget, device=device, batch_size=batch_size, keep_forget_losses=False)["forget"]["acc"]
    rl["threshold"] = rl.pop("fraction") * acc
    return rl if rl["threshold"] > 0 else None   # nothing to relearn when θ0 gets no forget sample right

