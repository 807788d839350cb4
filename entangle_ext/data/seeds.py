"""The run's seed as the data loaders hand it to numpy and scikit-learn.

A run's seed (``UnlearnConfig.seed``, ``prepare(seed=)``, the command line's ``--seed``) is any
int in [`SEED_MIN`, `SEED_MAX`] = [-2**63, 2**64 - 1], the range of ``torch.manual_seed``, which
reads a negative seed as its 64-bit two's complement (``seed + 2**64``). numpy's
``default_rng`` takes only seeds >= 0 and scikit-learn's ``random_state`` only ints in
[0, 2**32 - 1]; these helpers map every seed of the range onto them deterministically, and leave
the seeds those libraries already took unchanged (so they draw the same data as before).
"""
from __future__ import annotations

import numbers
from typing import Union

import numpy as np

from ..unlearn.fields import SEED_MAX, SEED_MIN

__all__ = ["check_data_seed", "numpy_seed", "sklearn_random_state"]

_U32 = 2 ** 32


def check_data_seed(seed, label: str = "seed") -> int:
    """``seed`` as an int; TypeError when it is not an integer (a bool or float is not coerced),
    ValueError when it lies outside [`SEED_MIN`, `SEED_MAX`] (torch.manual_seed's range). Messages
    start with ``label``."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{label} must be an integer in [{SEED_MIN}, {SEED_MAX}], got {seed!r} "
                        f"({type(seed).__name__})")
    seed = int(seed)
    if not SEED_MIN <= seed <= SEED_MAX:
        raise ValueError(f"{label} must be in [{SEED_MIN}, {SEED_MAX}] (torch.manual_seed's range), got {seed}")
    return seed


def numpy_seed(seed, label: str = "seed") -> int:
    """A seed for ``np.random.default_rng``: ``seed`` itself when >= 0, else ``seed + 2**64``
    (the 64 bits torch.manual_seed reads). Raises as `check_data_seed`."""
    seed = check_data_seed(seed, label)
    return seed if seed >= 0 else seed + 2 ** 64


def sklearn_random_state(seed, label: str = "seed") -> Union[int, np.random.RandomState]:
    """A scikit-learn ``random_state`` for ``seed``: the int itself in [0, 2**32 - 1] (what
    scikit-learn takes); for any other seed of the range a `numpy.random.RandomState` seeded with
    the two 32-bit words of `numpy_seed` (distinct seeds keep distinct streams). Raises as
    `check_data_seed`."""
    u = numpy_seed(seed, label)
    if u < _U32:
        return u
    return np.random.RandomState([u % _U32, u // _U32])
