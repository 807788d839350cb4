"""CIFAR-100 in the paper's superclass setting (docs/algorithm.md §1; Table 1 of the paper).

The model predicts the 20 coarse labels (superclasses). D_f = fine class "aquarium_fish",
D_adj = the other 4 fine classes of superclass "fish", D_rem = the other 19 superclasses;
train = official train set, held-out = official test set. The splits come from
`entangle_ext.splits.split_by_hierarchy`.

Accepted on-disk formats (`load_cifar100`), looked up with `entangle_ext.data.find_data_file`:
* torchvision's ``cifar-100-python/`` pickles (``train``, ``test``, ``meta``), read by a restricted
  unpickler that admits only numpy array reconstruction (`entangle_ext.data.cifar100_pickle`);
* ``cifar100.npz`` (keys x_train, y_train_fine, y_train_coarse, x_test, y_test_fine, y_test_coarse,
  fine_names, coarse_names).
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import TensorDataset

from .._optional import optional_import
from ..splits import IndexSplit, split_by_hierarchy
from ..unlearn.data import Splits
from .checks import check_cap, check_float_dtype, check_image_size, check_images, check_labels
from .cifar100_pickle import read_pickle
from .seeds import numpy_seed
from .root import find_data_file, read_npz
from .tinyimagenet import images_to_tensor

__all__ = ["ForgetSuperclassMissing", "load_setting", "setting_model", "find_cifar100", "load_cifar100", "cifar100_splits", "resnet18_cifar", "small_resnet_cifar",
           "downsample_images", "CIFAR100_MEAN", "CIFAR100_STD"]

class ForgetSuperclassMissing(ValueError):
    """`cifar100_splits`: ``superclasses`` leave out the superclass of the forget class. Attributes:
    ``forget`` (the fine class), ``superclass`` (its superclass), ``superclasses`` (the list given)."""

    def __init__(self, forget: str, superclass: str, superclasses: Sequence[str]):
        self.forget, self.superclass, self.superclasses = forget, superclass, list(superclasses)
        super().__init__(f"superclasses {self.superclasses} do not include {superclass!r}, the superclass of the "
                         f"forget class {forget!r}: give superclasses that include it")


CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)
_NAMES = ("cifar-100-python", "cifar100.npz")
_NPZ_KEYS = ("x_train", "y_train_fine", "y_train_coarse", "x_test", "y_test_fine", "y_test_coarse",
             "fine_names", "coarse_names")


def _is_cifar100(p: Path) -> bool:
    return (p.is_file() and p.suffix.lower() == ".npz") or (p.is_dir() and p.name == "cifar-100-python")


def _locate(root) -> Path:
    return find_data_file(_NAMES, root, is_data=_is_cifar100, what="CIFAR-100")


def find_cifar100(root: Union[str, Path, None] = None) -> Optional[Path]:
    """The CIFAR-100 source: ``root`` itself (a ``.npz`` file or a ``cifar-100-python/`` directory)
    or ``cifar-100-python/`` / ``cifar100.npz`` inside it; with ``root`` None, inside the data
    directories of `entangle_ext.data.data_dirs`. None when nothing is found (`load_cifar100`
    raises instead, naming every place looked at)."""
    try:
        return _locate(root)
    except FileNotFoundError:
        return None


def load_cifar100(root: Union[str, Path, None] = None) -> dict:
    """Read CIFAR-100 from either format into numpy arrays.

    Returns dict with x_train (50000, 32, 32, 3) uint8 HWC, y_train_fine / y_train_coarse (int64),
    x_test (10000, 32, 32, 3), y_test_fine / y_test_coarse, fine_names (100 str), coarse_names (20).
    Raises FileNotFoundError when no CIFAR-100 is found (see `find_cifar100`; the message names
    every place looked at) or a pickle of the ``cifar-100-python/`` layout is missing; ValueError,
    naming the file, when the file is not a CIFAR-100 archive (not a zip, missing keys, corrupt:
    `entangle_ext.data.root.read_npz`), its arrays are malformed (images not uint8 (N, 32, 32, 3),
    labels not 1-D integers as many as the images and within the class names, names not unique
    strings), or a pickle is corrupt or lacks its keys, or pickles anything
    but dicts, lists, bytes/str, numbers and plain numpy arrays (no code from a pickle is run: the
    message names the refused global).
    """
    src = _locate(root)
    if src.suffix.lower() == ".npz" or not src.is_dir():
        return _checked(read_npz(src, _NPZ_KEYS, "CIFAR-100"), str(src))
    out = {}
    for split in ("train", "test"):
        p = read_pickle(src / split, (b"data", b"fine_labels", b"coarse_labels"))
        try:
            out[f"x_{split}"] = np.asarray(p[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        except ValueError as e:
            raise ValueError(f"{src / split}: 'data' is not a stack of 3x32x32 images ({e})") from e
        out[f"y_{split}_fine"] = np.asarray(p[b"fine_labels"], dtype=np.int64)
        out[f"y_{split}_coarse"] = np.asarray(p[b"coarse_labels"], dtype=np.int64)
    m = read_pickle(src / "meta", (b"fine_label_names", b"coarse_label_names"))
    out["fine_names"] = [s.decode() for s in m[b"fine_label_names"]]
    out["coarse_names"] = [s.decode() for s in m[b"coarse_label_names"]]
    return _checked(out, str(src))


def _checked(d: dict, where: str) -> dict:
    """``d`` (the arrays of `load_cifar100`) checked before anything indexes with them, names as
    lists of str: uint8 (N, 32, 32, 3) images, 1-D integer labels as many as the images and within
    the class names, unique names; ValueError naming ``where`` (the file) otherwise."""
    out = {}
    for key in ("fine_names", "coarse_names"):
        names = np.asarray(d[key])
        if names.ndim != 1 or len(names) == 0 or not np.issubdtype(names.dtype, np.str_):
            raise ValueError(f"{where}: {key!r} must be a non-empty 1-D array of strings, got dtype "
                             f"{names.dtype} and shape {tuple(names.shape)}")
        out[key] = [str(n) for n in names]
        if len(set(out[key])) < len(out[key]):
            raise ValueError(f"{where}: {key!r} repeats a name")
    for split in ("train", "test"):
        n = check_images(d[f"x_{split}"], where, f"x_{split}", (32, 32, 3))
        out[f"x_{split}"] = d[f"x_{split}"]
        for level in ("fine", "coarse"):
            key = f"y_{split}_{level}"
            out[key] = check_labels(d[key], n, len(out[f"{level}_names"]), where, key)
    return out


def _fine_to_coarse(d: dict) -> np.ndarray:
    """The superclass of every fine class, from the train and test labels. ValueError for a fine
    class under two superclasses, or with no train image (its superclass would be unknown)."""
    fine_names, coarse_names = d["fine_names"], d["coarse_names"]
    f2c = np.full(len(fine_names), -1, dtype=np.int64)
    for split in ("train", "test"):
        for f, c in np.unique(np.stack([d[f"y_{split}_fine"], d[f"y_{split}_coarse"]], 1), axis=0):
            if f2c[f] not in (-1, c):
                raise ValueError(f"CIFAR-100 labels: fine class {fine_names[f]!r} appears under two "
                                 f"superclasses, {coarse_names[f2c[f]]!r} and {coarse_names[c]!r} ({split})")
            f2c[f] = c
    missing = [fine_names[f] for f in np.flatnonzero(np.bincount(d["y_train_fine"], minlength=len(f2c)) == 0)]
    if missing:
        raise ValueError(f"CIFAR-100 labels: fine classes without train images: {missing[:5]}"
                         + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    return f2c


def cifar100_splits(root: Union[str, Path, None] = None, *, forget_fine: str = "aquarium_fish",
                    superclasses: Optional[Sequence[str]] = None,
                    max_train_per_class: Optional[int] = None,
                    max_test_per_class: Optional[int] = None, image_size: int = 32, seed: int = 0,
                    device="cpu", dtype=torch.float32, data: Optional[dict] = None) -> Tuple[Splits, dict]:
    """Splits of the CIFAR-100 superclass setting as device-resident TensorDatasets, built with
    `entangle_ext.splits.split_by_hierarchy` (docs/algorithm.md §1).

    Args:
        root: data location (see `find_cifar100`). data: an already loaded `load_cifar100` dict.
        forget_fine: the fine class to forget; adjacent = the other fine classes of its superclass.
        superclasses: keep only these coarse classes (reduced CPU runs; must include the forget
            class's superclass); labels are re-indexed 0..K-1 in the given order. None = all 20.
        max_train_per_class, max_test_per_class: cap per fine class (random subset, ``seed``).
        image_size: side in pixels of the returned images (`downsample_images`; 32 = as stored).
    Returns:
        (splits, info): x (N, 3, image_size, image_size) ``dtype`` normalised with CIFAR-100
        mean/std, y (N,) int64 coarse labels, on ``device``; within a split the samples are ordered by fine class,
        then by index in the official array. info: names, num_classes, sizes, fine classes per
        split, and "index_splits" ({"train", "test"}: `IndexSplit` over the official arrays).
    Raises:
        ValueError: an unknown forget class or superclass (the message lists the choices), repeated
        superclasses, superclasses without the forget class's superclass (`ForgetSuperclassMissing`,
        naming both) or with nothing else (an
        empty remote split), fine/coarse labels that disagree between samples or a fine class
        without train images (both name the class), arrays of the wrong dtype or shape (images not
        uint8 (N, 32, 32, 3), labels not integers as many as the images or outside the class
        names; also for ``data``), an image_size that is not an integer in 1..32
        (`check_image_size`), a cap that is not None or an integer >= 1 (`check_cap`), an unreadable file
        (see `load_cifar100`). TypeError: superclasses given as one string, a dtype that is not
        floating. FileNotFoundError: no data.
    """
    image_size = check_image_size(image_size, max_size=32)
    max_train_per_class = check_cap(max_train_per_class, "max_train_per_class")
    max_test_per_class = check_cap(max_test_per_class, "max_test_per_class")
    check_float_dtype(dtype)
    d = _checked(data, "data") if data is not None else load_cifar100(root)
    fine_names, coarse_names = d["fine_names"], d["coarse_names"]
    if forget_fine not in fine_names:
        raise ValueError(_unknown_name("fine class", forget_fine, fine_names)
                         + (f" ({forget_fine!r} is a superclass; forget takes one of its fine classes)"
                            if forget_fine in coarse_names else ""))
    f_id = fine_names.index(forget_fine)
    f2c = _fine_to_coarse(d)
    sup = int(f2c[f_id])
    keep = list(range(len(coarse_names))) if superclasses is None else _keep_superclasses(superclasses, coarse_names)
    if sup not in keep:
        raise ForgetSuperclassMissing(forget_fine, coarse_names[sup], [coarse_names[c] for c in keep])
    if len(keep) < 2:
        raise ValueError(f"the remote split would be empty with superclasses {[coarse_names[c] for c in keep]}: "
                         "give at least one superclass besides the forget class's")
    f2k = np.full(len(fine_names), -1, dtype=np.int64)   # fine class -> kept coarse index (-1: dropped)
    for i, c in enumerate(keep):
        f2k[f2c == c] = i
    rng = np.random.default_rng(numpy_seed(seed))
    kw, idx_splits = {}, {}
    for split, cap, suffix in (("train", max_train_per_class, ""), ("test", max_test_per_class, "_test")):
        x, fine = d[f"x_{split}"], d[f"y_{split}_fine"]
        sel = _select(fine, f2k, cap, rng)
        s = split_by_hierarchy(fine[sel], f2k, f_id, fine_names=fine_names,
                               coarse_names=[coarse_names[c] for c in keep])
        targets = np.asarray(s.targets, dtype=np.int64)
        for name in IndexSplit.NAMES:
            pos = np.asarray(getattr(s, name), dtype=np.int64)
            xs = downsample_images(images_to_tensor(x[sel[pos]], device, dtype, CIFAR100_MEAN, CIFAR100_STD),
                                   image_size)
            kw[name + suffix] = TensorDataset(xs, torch.as_tensor(targets[pos], device=device))
        idx_splits[split] = IndexSplit(*[sorted(int(i) for i in sel[getattr(s, n)]) for n in IndexSplit.NAMES],
                                       targets=[int(t) for t in f2k[fine]],
                                       meta=dict(s.meta, n=int(len(fine)), setting="cifar100", part=split,
                                                 seed=seed, cap=cap))
    groups = {"forget": [f_id], "adjacent": idx_splits["train"].meta["adjacent_fine"],
              "remote": [k for k in range(len(fine_names)) if f2k[k] >= 0 and f2c[k] != sup]}
    info = {"num_classes": len(keep), "coarse_names": [coarse_names[c] for c in keep],
            "forget_fine": forget_fine, "groups": {k: [fine_names[i] for i in v] for k, v in groups.items()},
            "sizes": {k: len(v) for k, v in kw.items()}, "index_splits": idx_splits, "image_size": int(image_size)}
    return Splits(**kw), info


def _select(fine: np.ndarray, f2k: np.ndarray, cap: Optional[int], rng) -> np.ndarray:
    """Indices of the kept fine classes, class by class (ascending fine index), each class capped
    at ``cap`` random samples (sorted)."""
    idx = []
    for k in range(len(f2k)):
        if f2k[k] < 0:
            continue
        ik = np.flatnonzero(fine == k)
        if cap is not None and len(ik) > cap:
            ik = np.sort(rng.choice(ik, cap, replace=False))
        idx.append(ik)
    return np.concatenate(idx)


def _unknown_name(kind: str, name, choices: Sequence[str]) -> str:
    near = difflib.get_close_matches(str(name), choices, n=5, cutoff=0.5)
    return (f"unknown {kind} {name!r}; " + (f"did you mean {near}? " if near else "")
            + f"choices: {sorted(choices)}")


def _keep_superclasses(superclasses, coarse_names: Sequence[str]) -> list:
    """Coarse indices of ``superclasses`` in the given order. Raises TypeError for a single str and
    ValueError for an unknown or repeated name."""
    if isinstance(superclasses, (str, bytes)):
        raise TypeError(f"superclasses must be a list of names, got the string {superclasses!r} "
                        f"(pass [{superclasses!r}])")
    names = list(superclasses)
    for s in names:
        if s not in coarse_names:
            raise ValueError(_unknown_name("superclass", s, coarse_names))
    dup = sorted({s for s in names if names.count(s) > 1})
    if dup:
        raise ValueError(f"superclasses repeat {dup}: each coarse class may appear once")
    return [coarse_names.index(s) for s in names]


def resnet18_cifar(num_classes: int = 20) -> torch.nn.Module:
    """torchvision ResNet-18 with the usual CIFAR stem (3×3 stride-1 conv1, no max-pool):
    input (B, 3, 32, 32), logits (B, num_classes); 11.2 M parameters for 20 classes. Raises
    ImportError with an install hint without torchvision."""
    torchvision = optional_import("torchvision", "the cifar100 setting's ResNet-18", "vision")

    m = torchvision.models.resnet18(num_classes=num_classes)
    m.conv1 = torch.nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    m.maxpool = torch.nn.Identity()
    return m


def downsample_images(x: torch.Tensor, size: int) -> torch.Tensor:
    """(N, C, H, H) images -> (N, C, size, size): unchanged when size == H, an average pool when
    size divides H (2×2 blocks for 32 -> 16), else antialiased bilinear (`torch.nn.functional.interpolate`).
    Same dtype and device; contiguous."""
    h = x.shape[-1]
    if size == h:
        return x
    if h % size == 0:
        return torch.nn.functional.avg_pool2d(x, h // size).contiguous()
    return torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", antialias=True,
                                           align_corners=False).contiguous()


def small_resnet_cifar(num_classes: int = 20, widths: Sequence[int] = (32, 64, 128),
                       blocks: Sequence[int] = (1, 1, 1)) -> torch.nn.Module:
    """A small residual network from torchvision's ResNet `BasicBlock`: a 3×3 stride-1 stem
    (conv-BN-ReLU, ``widths[0]`` channels), one stage of ``blocks[i]`` basic blocks per width
    (stride 2 and a 1×1 conv-BN shortcut where the shape changes), global average pool, linear.

    Input (B, 3, H, W) at any size (the CPU CIFAR-100 variant uses 16×16), logits (B, num_classes).
    With the defaults: 0.31 M parameters for 20 classes (`resnet18_cifar`: 11.2 M). Raises ValueError when ``widths`` and ``blocks`` differ in length or are empty."""
    BasicBlock = optional_import("torchvision.models.resnet", "the cifar100 setting's small ResNet",
                                 "vision").BasicBlock

    nn = torch.nn
    if len(widths) != len(blocks) or not widths:
        raise ValueError(f"widths {tuple(widths)} and blocks {tuple(blocks)} must be non-empty and of equal length")
    layers = [nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True)]
    cin = widths[0]
    for i, (w, b) in enumerate(zip(widths, blocks)):
        for j in range(b):
            stride = 2 if (j == 0 and i > 0) else 1
            down = None if (stride == 1 and cin == w) else nn.Sequential(
                nn.Conv2d(cin, w, 1, stride, bias=False), nn.BatchNorm2d(w))
            layers.append(BasicBlock(cin, w, stride, down))
            cin = w
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    return nn.Sequential(*layers)


def load_setting(root, *, seed, device, cache_dir=None, max_train_per_class=None, max_test_per_class=None,
                 superclasses=None, forget="aquarium_fish", image_size=32):
    """The loader of the ``cifar100`` setting (``entangle_ext/settings.py``): (`entangle_ext.Splits`,
    info dict) from the data root and the setting's data options (the command line's data flags).
    Raises as `cifar100_splits`."""
    return cifar100_splits(root, forget_fine=forget, superclasses=superclasses, max_train_per_class=max_train_per_class,
                           max_test_per_class=max_test_per_class, image_size=image_size, seed=seed, device=device)


def setting_model(info, arch="resnet18"):
    """The model builder of the ``cifar100`` setting (``entangle_ext/settings.py``): a fresh, untrained
    model for the loader's ``info`` (its ``num_classes``) and the setting's model options."""
    if arch == "small":
        return small_resnet_cifar(info["num_classes"])
    return resnet18_cifar(info["num_classes"])
