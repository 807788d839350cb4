"""scikit-learn's bundled digits (1,797 real 8×8 handwritten digits) as a miniature of the paper's
superclass setting.

* coarse label (what the model predicts) = parity: 0 even, 1 odd;
* D_f = digit 3 (an odd digit: the forget samples keep the label "odd");
* D_adj = the other odd digits 1, 5, 7, 9 (same coarse class: entangled with D_f);
* D_rem = the even digits 0, 2, 4, 6, 8.
Each split has a stratified train / held-out part. Images are scaled to [0, 1] and flattened to 64.

The "digits" setting (`entangle_ext.settings`, ``make demo``, ``make compare``) runs in float64
(`SETTING_DTYPE`): a float32 run of this tiny problem moves with the CPU's vector ISA and BLAS
kernels (seen: held-out adjacent 97.71 % on one x86-64 machine, 97.25 % on another), while float64
round-off stays orders of magnitude below every decision margin, so the printed tables are the
same on every machine. The cost is negligible at this size.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np
import torch
from torch.utils.data import TensorDataset

from ..unlearn.data import Splits
from .checks import check_cap, check_float_dtype, check_fraction
from .seeds import sklearn_random_state

__all__ = ["digits_splits", "DigitsMLP", "SETTING_DTYPE", "load_setting", "setting_model"]

SETTING_DTYPE = torch.float64
"""dtype of the digits setting's inputs and model (see the module docstring)."""


def digits_splits(*, forget_digit: int = 3, test_fraction: float = 0.3, seed: int = 0,
                  device="cpu", dtype=torch.float32, max_train_per_digit=None) -> Tuple[Splits, dict]:
    """Build `Splits` from sklearn digits (see module docstring).

    Returns (splits, info): TensorDatasets of x (N, 64) ``dtype`` in [0, 1] and y (N,) int64 parity
    labels on ``device``; info has the digit of each split and the sizes.
    ``seed``: any int of torch.manual_seed's range [-2**63, 2**64 - 1] (the run's seed); one in
    [0, 2**32 - 1] goes to scikit-learn's split as it is, any other as `sklearn_random_state` maps it.
    ``max_train_per_digit``: None (all) or an integer >= 1, the train images kept per digit.
    ``dtype``: a floating torch dtype (the features are scaled to [0, 1]).
    ``test_fraction``: the held-out share, a real number in (0, 1) (`check_fraction`, as
    `toxigen_index_splits` checks its own) leaving at least 10 images on each side.
    Raises TypeError when ``forget_digit`` or ``seed`` is not an int (a float or bool is not coerced),
    ``test_fraction`` not a real number or ``dtype`` not a floating dtype, and ValueError when
    ``forget_digit`` is not in 0..9, ``seed`` outside that range, ``test_fraction`` outside (0, 1)
    or leaving fewer than 10 images on a side, or ``max_train_per_digit`` not None or an integer
    >= 1 (the check `entangle_ext.settings.Setting.check_options` makes of the caps, `check_cap`).
    """
    from .._optional import optional_import
    load_digits = optional_import("sklearn.datasets", "the digits setting (scikit-learn's bundled digits)",
                                  "demo").load_digits
    train_test_split = optional_import("sklearn.model_selection", "the digits setting", "demo").train_test_split

    if isinstance(forget_digit, bool) or not isinstance(forget_digit, (int, np.integer)):
        raise TypeError(f"forget_digit must be an int 0..9, got {forget_digit!r} ({type(forget_digit).__name__})")
    if forget_digit not in range(10):
        raise ValueError(f"forget_digit must be in 0..9, got {forget_digit}")
    max_train_per_digit = check_cap(max_train_per_digit, "max_train_per_digit")
    test_fraction = check_fraction(test_fraction, "test_fraction")
    check_float_dtype(dtype)
    random_state = sklearn_random_state(seed)
    d = load_digits()
    x = (d.data / 16.0).astype(np.float64)
    digit = d.target.astype(np.int64)
    n_test = int(np.ceil(test_fraction * len(digit)))   # scikit-learn's count of held-out images
    if min(n_test, len(digit) - n_test) < 10:
        raise ValueError(f"test_fraction={test_fraction} holds out {n_test} of the {len(digit)} images: the stratified "
                         "split needs at least 10 (one per digit) on each side")
    idx_tr, idx_te = train_test_split(np.arange(len(digit)), test_size=test_fraction,
                                      random_state=random_state, stratify=digit)
    if max_train_per_digit is not None:
        idx_tr = np.concatenate([idx_tr[digit[idx_tr] == k][:max_train_per_digit] for k in range(10)])
    parity = forget_digit % 2
    groups = {"forget": [forget_digit],
              "adjacent": [k for k in range(10) if k % 2 == parity and k != forget_digit],
              "remote": [k for k in range(10) if k % 2 != parity]}

    def ds(idx, digits):
        sel = idx[np.isin(digit[idx], digits)]
        return TensorDataset(torch.as_tensor(x[sel], dtype=dtype, device=device),
                             torch.as_tensor(digit[sel] % 2, dtype=torch.long, device=device))

    kw = {}
    for name, digs in groups.items():
        kw[name] = ds(idx_tr, digs)
        kw[name + "_test"] = ds(idx_te, digs)
    info = {"groups": groups, "sizes": {k: len(v) for k, v in kw.items()}, "num_classes": 2}
    return Splits(**kw), info


class DigitsMLP(torch.nn.Sequential):
    """64 → hidden → hidden → 2 ReLU MLP for the digits demo (input (B, 64), logits (B, 2)),
    its parameters created in ``dtype`` (the setting uses `SETTING_DTYPE`). Created, not cast:
    PyTorch's vectorised ``uniform_`` rounds differently on AVX2 and scalar paths, so float32
    initial weights differ by one float32 ulp between CPUs (seen: 7.5e-9), which 60 epochs of
    training grow to 1e-4; drawn in float64 they differ by 1e-17."""

    def __init__(self, hidden: int = 128, num_classes: int = 2, dtype: torch.dtype = torch.float32):
        kw = dict(dtype=dtype)
        super().__init__(torch.nn.Linear(64, hidden, **kw), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden, **kw),
                         torch.nn.ReLU(), torch.nn.Linear(hidden, num_classes, **kw))


def load_setting(root, *, seed, device, cache_dir=None, max_train_per_class=None, forget=3):
    """The loader of the ``digits`` setting (``entangle_ext/settings.py``): (`entangle_ext.Splits`,
    info dict) from the data root and the setting's data options (the command line's data flags).
    Raises as `digits_splits`; ValueError for a data root (the bundled data take none) or a forget that is not a digit 0-9."""
    if root is not None:
        raise ValueError("the digits setting reads scikit-learn's bundled digits; it takes no data root")
    digit = int(forget) if isinstance(forget, str) and forget.strip().isdigit() else forget
    in_range = isinstance(digit, bool) or not isinstance(digit, int) or 0 <= digit <= 9   # other types: TypeError below
    if (isinstance(forget, str) and digit is forget) or not in_range:
        raise ValueError(f"digits: forget must be a digit 0-9 (the --forget flag of the command line), got {forget!r}")
    return digits_splits(forget_digit=digit, seed=seed, device=device, max_train_per_digit=max_train_per_class,
                         dtype=SETTING_DTYPE)


def setting_model(info):
    """The model builder of the ``digits`` setting (``entangle_ext/settings.py``): a fresh, untrained
    model for the loader's ``info`` (its ``num_classes``) and the setting's model options."""
    return DigitsMLP(num_classes=info["num_classes"], dtype=SETTING_DTYPE)
