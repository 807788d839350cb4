"""CIFAR-100 in the paper's superclass setting (method.md, Table 1).

The model predicts the 20 coarse labels (superclasses). D_f = fine class "aquarium_fish",
D_adj = the other 4 fine classes of superclass "fish", D_rem = the other 19 superclasses;
train = official train set, held-out = official test set.

Accepted on-disk formats (`load_cifar100`):
* torchvision's ``cifar-100-python/`` pickles (``train``, ``test``, ``meta``);
* ``cifar100.npz`` as in /work/shared/data (keys x_train, y_train_fine, y_train_coarse, x_test,
  y_test_fine, y_test_coarse, fine_names, coarse_names; see its README).
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import TensorDataset

from ..unlearn.data import Splits

__all__ = ["find_cifar100", "load_cifar100", "cifar100_splits", "resnet18_cifar", "CIFAR100_MEAN",
           "CIFAR100_STD"]

CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)


def find_cifar100(root: Union[str, Path, None] = None) -> Optional[Path]:
    """The CIFAR-100 source at ``root`` or, when ``root`` is None, under $ENTANGLE_SHARED_DATA or
    ../shared/data (relative to the repository): a ``.npz`` file or a directory holding
    ``cifar100.npz`` or ``cifar-100-python/``. None when nothing is found."""
    cands = []
    if root is not None:
        cands.append(Path(root))
    else:
        if os.environ.get("ENTANGLE_SHARED_DATA"):
            cands.append(Path(os.environ["ENTANGLE_SHARED_DATA"]))
        cands.append(Path(__file__).resolve().parents[3] / "shared" / "data")
    for c in cands:
        if c.is_file() and c.suffix == ".npz":
            return c
        if (c / "cifar-100-python").is_dir():
            return c / "cifar-100-python"
        if c.name == "cifar-100-python" and c.is_dir():
            return c
        if (c / "cifar100.npz").is_file():
            return c / "cifar100.npz"
    return None


def load_cifar100(root: Union[str, Path]) -> dict:
    """Read CIFAR-100 from either format into numpy arrays.

    Returns dict with x_train (50000, 32, 32, 3) uint8 HWC, y_train_fine / y_train_coarse (int64),
    x_test (10000, 32, 32, 3), y_test_fine / y_test_coarse, fine_names (100 str), coarse_names (20).
    Raises FileNotFoundError when no CIFAR-100 is found at/under ``root``.
    """
    src = find_cifar100(root)
    if src is None:
        raise FileNotFoundError(f"no CIFAR-100 (cifar100.npz or cifar-100-python/) at {root}")
    if src.suffix == ".npz":
        d = np.load(src, allow_pickle=False)
        return {k: d[k] for k in ("x_train", "y_train_fine", "y_train_coarse", "x_test", "y_test_fine",
                                  "y_test_coarse")} | {"fine_names": [str(s) for s in d["fine_names"]],
                                                       "coarse_names": [str(s) for s in d["coarse_names"]]}
    out = {}
    for split in ("train", "test"):
        with open(src / split, "rb") as f:
            p = pickle.load(f, encoding="bytes")
        out[f"x_{split}"] = np.asarray(p[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        out[f"y_{split}_fine"] = np.asarray(p[b"fine_labels"], dtype=np.int64)
        out[f"y_{split}_coarse"] = np.asarray(p[b"coarse_labels"], dtype=np.int64)
    with open(src / "meta", "rb") as f:
        m = pickle.load(f, encoding="bytes")
    out["fine_names"] = [s.decode() for s in m[b"fine_label_names"]]
    out["coarse_names"] = [s.decode() for s in m[b"coarse_label_names"]]
    return out


def _to_tensor(x: np.ndarray, device, dtype) -> torch.Tensor:
    t = torch.as_tensor(x, device=device).permute(0, 3, 1, 2).to(dtype).div_(255.0)
    mean = torch.tensor(CIFAR100_MEAN, device=device, dtype=dtype).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR100_STD, device=device, dtype=dtype).view(1, 3, 1, 1)
    return ((t - mean) / std).contiguous()


def cifar100_splits(root: Union[str, Path, None] = None, *, forget_fine: str = "aquarium_fish",
                    superclasses: Optional[Sequence[str]] = None,
                    max_train_per_class: Optional[int] = None,
                    max_test_per_class: Optional[int] = None, seed: int = 0, device="cpu",
                    dtype=torch.float32, data: Optional[dict] = None) -> Tuple[Splits, dict]:
    """Splits of the CIFAR-100 superclass setting as device-resident TensorDatasets.

    Args:
        root: data location (see `find_cifar100`). data: an already loaded `load_cifar100` dict.
        forget_fine: the fine class to forget; adjacent = the other fine classes of its superclass.
        superclasses: keep only these coarse classes (reduced CPU runs; must include the forget
            class's superclass); labels are re-indexed 0..K-1 in the given order. None = all 20.
        max_train_per_class, max_test_per_class: cap per fine class (random subset, ``seed``).
    Returns:
        (splits, info): x (N, 3, 32, 32) ``dtype`` normalised with CIFAR-100 mean/std, y (N,)
        int64 coarse labels, on ``device``; info: names, num_classes, sizes, fine classes per split.
    Raises:
        ValueError: unknown class names; FileNotFoundError: no data.
    """
    d = data if data is not None else load_cifar100(root)
    fine_names, coarse_names = list(d["fine_names"]), list(d["coarse_names"])
    if forget_fine not in fine_names:
        raise ValueError(f"unknown fine class {forget_fine!r}")
    f_id = fine_names.index(forget_fine)
    f2c = np.zeros(100, dtype=np.int64)
    f2c[d["y_train_fine"]] = d["y_train_coarse"]
    sup = int(f2c[f_id])
    keep = list(range(20)) if superclasses is None else [coarse_names.index(s) if s in coarse_names
                                                         else _bad(s) for s in superclasses]
    if sup not in keep:
        raise ValueError(f"superclasses must include {coarse_names[sup]!r}, the forget class's superclass")
    remap = {c: i for i, c in enumerate(keep)}
    rng = np.random.default_rng(seed)

    def select(fine, cap):
        idx = []
        for k in range(100):
            if int(f2c[k]) not in remap:
                continue
            ik = np.flatnonzero(fine == k)
            if cap is not None and len(ik) > cap:
                ik = np.sort(rng.choice(ik, cap, replace=False))
            idx.append(ik)
        return np.concatenate(idx)

    groups = {"forget": [f_id], "adjacent": [k for k in range(100) if f2c[k] == sup and k != f_id],
              "remote": [k for k in range(100) if f2c[k] != sup and int(f2c[k]) in remap]}
    kw = {}
    for split, cap, suffix in (("train", max_train_per_class, ""), ("test", max_test_per_class, "_test")):
        x, fine, coarse = d[f"x_{split}"], d[f"y_{split}_fine"], d[f"y_{split}_coarse"]
        sel = select(fine, cap)
        for name, fines in groups.items():
            s = sel[np.isin(fine[sel], fines)]
            y = torch.as_tensor(np.array([remap[int(c)] for c in coarse[s]], dtype=np.int64), device=device)
            kw[name + suffix] = TensorDataset(_to_tensor(x[s], device, dtype), y)
    info = {"num_classes": len(keep), "coarse_names": [coarse_names[c] for c in keep],
            "forget_fine": forget_fine, "groups": {k: [fine_names[i] for i in v] for k, v in groups.items()},
            "sizes": {k: len(v) for k, v in kw.items()}}
    return Splits(**kw), info


def _bad(name):
    raise ValueError(f"unknown superclass {name!r}")


def resnet18_cifar(num_classes: int = 20) -> torch.nn.Module:
    """torchvision ResNet-18 with the usual CIFAR stem (3×3 stride-1 conv1, no max-pool):
    input (B, 3, 32, 32), logits (B, num_classes); 11.2 M parameters for 20 classes."""
    import torchvision

    m = torchvision.models.resnet18(num_classes=num_classes)
    m.conv1 = torch.nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    m.maxpool = torch.nn.Identity()
    return m
