"""Checks of the options every data loader shares: a per-class cap (`check_cap`) and the floating
dtype of returned inputs (`check_float_dtype`). `entangle_ext.settings.Setting.check_options`
and the loaders called directly (`digits_splits`, `cifar100_splits`, `load_tinyimagenet`,
`celeba_splits`, `toxigen_index_splits`) use the same ones, so a direct call refuses what the
registry refuses."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

__all__ = ["check_cap", "check_float_dtype"]


def check_cap(value: Any, name: str) -> Optional[int]:
    """``value`` as an int when it is a valid cap on samples per class, None when it is None (no cap).

    Args:
        value: None, or a Python / numpy integer >= 1 (a bool, float or str is not coerced).
        name: the option's name for the message (e.g. "max_train_per_class").
    Raises:
        ValueError: anything else (e.g. 0 or -1, which a slice ``[:cap]`` would read as "drop
            everything" / "drop the last sample").
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"option {name} must be an integer >= 1 (or None = no cap), got {value!r}")
    return int(value)


def check_float_dtype(dtype: Any, name: str = "dtype") -> torch.dtype:
    """``dtype`` when it is a floating torch dtype (inputs scaled to [0, 1] or normalised keep their
    values); raises TypeError for anything else (e.g. torch.int64, which would truncate them)."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating torch dtype (e.g. torch.float32), got {dtype!r}: "
                        "the inputs are scaled floats, an integer dtype would truncate them")
    return dtype
