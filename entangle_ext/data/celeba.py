"""CelebA in the paper's attribute setting (docs/algorithm.md §1, CelebA row).

Target (what the model predicts) = (Male, Smiling) → 4 classes: 0 female·not smiling,
1 female·smiling, 2 male·not smiling, 3 male·smiling. Sub-classes inside a target class are given
by (Young, Eyeglasses). D_f = female · not smiling · not young · no eyeglasses; D_adj = the other
3 sub-classes of target class 0; D_rem = target classes 1–3. Train = official partition 0,
held-out = official partition 2 (test) by default.

On-disk format = torchvision's ``CelebA`` layout: ``<root>/celeba/`` (or ``<root>`` itself; without a
root, ``celeba/`` in the data directories of `entangle_ext.data.data_dirs`) holding
``img_align_celeba/*.jpg`` (178×218 aligned crops), ``list_attr_celeba.txt`` (line 1: count,
line 2: the 40 attribute names, then ``<file> ±1 ×40``) and ``list_eval_partition.txt``
(``<file> 0|1|2``). Images are centre-cropped to a square and resized to ``image_size`` with Pillow.
No real CelebA is available offline here; the tests write a generated miniature in this exact format.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import TensorDataset

from ..splits import IndexSplit, split_by_attributes
from ..unlearn.data import Splits
from .checks import check_cap, check_float_dtype, check_image_size, read_text_lines
from .seeds import numpy_seed
from .._paths import expand_user
from .root import data_dirs
from .tinyimagenet import images_to_tensor

__all__ = ["load_setting", "forget_subclass_of", "find_celeba", "read_celeba_attributes", "load_celeba_images", "celeba_splits", "write_celeba_miniature",
           "TARGET_ATTRS", "SUBCLASS_ATTRS", "FORGET_SUBCLASS", "CLASS_NAMES", "ATTRIBUTES"]

TARGET_ATTRS = ("Male", "Smiling")
SUBCLASS_ATTRS = ("Young", "Eyeglasses")
FORGET_SUBCLASS = {"Male": False, "Smiling": False, "Young": False, "Eyeglasses": False}
CLASS_NAMES = ("female·not smiling", "female·smiling", "male·not smiling", "male·smiling")
_FILES = ("list_attr_celeba.txt", "list_eval_partition.txt")
ATTRIBUTES = tuple(
    "5_o_Clock_Shadow Arched_Eyebrows Attractive Bags_Under_Eyes Bald Bangs Big_Lips Big_Nose Black_Hair Blond_Hair "
    "Blurry Brown_Hair Bushy_Eyebrows Chubby Double_Chin Eyeglasses Goatee Gray_Hair Heavy_Makeup High_Cheekbones "
    "Male Mouth_Slightly_Open Mustache Narrow_Eyes No_Beard Oval_Face Pale_Skin Pointy_Nose Receding_Hairline "
    "Rosy_Cheeks Sideburns Smiling Straight_Hair Wavy_Hair Wearing_Earrings Wearing_Hat Wearing_Lipstick "
    "Wearing_Necklace Wearing_Necktie Young".split())
"""The 40 CelebA attribute names in the order of ``list_attr_celeba.txt``."""


def find_celeba(root: Union[str, Path, None] = None) -> Path:
    """The CelebA directory (``root/celeba`` or ``root``) holding the two list files and
    ``img_align_celeba/``; with ``root`` None, ``celeba/`` in the data directories of
    `entangle_ext.data.data_dirs`. Raises FileNotFoundError naming every place and what it lacks."""
    lacks = []
    for _, r in data_dirs(root):
        for c in (r / "celeba", r):
            if all((c / f).is_file() for f in _FILES) and (c / "img_align_celeba").is_dir():
                return c
        c = r / "celeba" if (r / "celeba").is_dir() else r
        missing = [f for f in _FILES if not (c / f).is_file()] + \
            ([] if (c / "img_align_celeba").is_dir() else ["img_align_celeba/"])
        lacks.append(f"{c} lacks {missing}")
    raise FileNotFoundError(f"no CelebA at {root if root is not None else 'the data directories'}: "
                            + "; ".join(lacks) + " (torchvision layout: celeba/img_align_celeba/*.jpg, "
                            "list_attr_celeba.txt, list_eval_partition.txt)")


def read_celeba_attributes(root: Union[str, Path, None] = None) -> Dict[str, object]:
    """Parse the attribute and partition lists.

    Returns:
        {"files": [str] (N), "attrs": {name: (N,) int8 array of ±1}, "partition": (N,) int64 (0 train,
        1 valid, 2 test), "dir": Path}.
    Raises:
        FileNotFoundError: see `find_celeba`. ValueError (naming the file and line): a list file that
        is not UTF-8, malformed lines, a field that is not an integer, an attribute value other than
        -1/1, a partition other than 0/1/2, a count mismatch, files missing from the partition list,
        a repeated attribute name or image file, or a file listed under two partitions.
    """
    d = find_celeba(root)
    attr_file, part_file = d / "list_attr_celeba.txt", d / "list_eval_partition.txt"
    lines = read_text_lines(attr_file)
    if len(lines) < 2:
        raise ValueError(f"{attr_file} is too short (needs count, header, rows)")
    names = lines[1].split()
    _no_repeats(names, f"{attr_file} line 2 (the attribute names)")
    rows = [(i + 3, l.split()) for i, l in enumerate(lines[2:]) if l.strip()]
    bad = [n for n, r in rows if len(r) != len(names) + 1]
    if bad:
        raise ValueError(f"{attr_file}: line(s) {bad[:5]} do not have 1 + {len(names)} fields")
    try:
        declared = int(lines[0].strip())
    except ValueError as e:
        raise ValueError(f"{attr_file}: the first line must be the image count, got {lines[0][:40]!r}") from e
    if declared != len(rows):
        raise ValueError(f"{attr_file} declares {declared} images but lists {len(rows)}")
    files = [r[0] for _, r in rows]
    _no_repeats(files, f"{attr_file} (the image files)")
    vals = np.zeros((len(rows), len(names)), np.int8)
    for i, (n, r) in enumerate(rows):
        v = _ints(r[1:], attr_file, n)
        if any(x not in (-1, 1) for x in v):
            raise ValueError(f"{attr_file} line {n}: attribute values must be -1 or 1, got {r[1:][:8]} …")
        vals[i] = v
    part = {}
    for n, l in enumerate(read_text_lines(part_file), 1):
        if l.strip():
            f = l.split()
            code = _ints(f[1:2], part_file, n) if len(f) >= 2 else [None]
            if code[0] not in (0, 1, 2):
                raise ValueError(f"{part_file} line {n}: expected '<file> 0|1|2', got {l.strip()[:60]!r}")
            if part.setdefault(f[0], code[0]) != code[0]:
                raise ValueError(f"{part_file} line {n}: {f[0]} is listed again, in partition {code[0]} "
                                 f"(first in {part[f[0]]})")
    missing = [f for f in files if f not in part]
    if missing:
        raise ValueError(f"{part_file} lacks {len(missing)} image(s), e.g. {missing[:3]}")
    return {"files": files, "attrs": {n: vals[:, j] for j, n in enumerate(names)},
            "partition": np.array([part[f] for f in files], dtype=np.int64), "dir": d}


def _no_repeats(items, where: str) -> None:
    """ValueError naming ``where`` and the first repeated entry (the last one would win silently)."""
    seen = set()
    for x in items:
        if x in seen:
            raise ValueError(f"{where}: {x!r} appears more than once")
        seen.add(x)


def _ints(fields: Sequence[str], path: Path, line: int) -> list:
    try:
        return [int(v) for v in fields]
    except ValueError as e:
        raise ValueError(f"{path} line {line}: a field is not an integer ({e})") from e


def load_celeba_images(directory: Union[str, Path], files: Sequence[str], image_size: int = 64) -> np.ndarray:
    """(N, image_size, image_size, 3) uint8: each image centre-cropped to a square and resized
    (Pillow, bilinear). Raises FileNotFoundError naming the first missing image and ValueError
    naming the first image Pillow cannot read; ValueError for an ``image_size`` that is not an
    integer >= 1 (`check_image_size`)."""
    from PIL import Image

    image_size = check_image_size(image_size)
    out = np.zeros((len(files), image_size, image_size, 3), np.uint8)
    for i, f in enumerate(files):
        p = Path(expand_user(directory)) / "img_align_celeba" / f
        if not p.is_file():
            raise FileNotFoundError(f"missing CelebA image {p}")
        try:
            with Image.open(p) as im:
                im = im.convert("RGB")
                w, h = im.size
                s = min(w, h)
                im = im.crop(((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s))
                out[i] = np.asarray(im.resize((image_size, image_size), Image.BILINEAR), dtype=np.uint8)
        except (OSError, ValueError, SyntaxError) as e:   # PIL.UnidentifiedImageError is an OSError
            raise ValueError(f"{p}: not a readable image ({type(e).__name__}: {e})") from e
    return out


def celeba_splits(root: Union[str, Path, None] = None, *, target_attrs: Sequence[str] = TARGET_ATTRS,
                  subclass_attrs: Sequence[str] = SUBCLASS_ATTRS,
                  forget_subclass: Mapping[str, bool] = FORGET_SUBCLASS, image_size: int = 64,
                  train_partition: int = 0, test_partition: Optional[int] = 2,
                  max_train_per_class: Optional[int] = None, max_test_per_class: Optional[int] = None,
                  seed: int = 0, device="cpu", dtype=torch.float32) -> Tuple[Splits, dict]:
    """`Splits` of the CelebA attribute setting (module docstring) as TensorDatasets.

    Args:
        root: see `find_celeba`. target_attrs, subclass_attrs, forget_subclass: see
            `entangle_ext.splits.split_by_attributes` (defaults = the paper's).
        image_size: side in pixels of the stored images (the ViT-B/32 model resizes to 224 itself).
        train_partition / test_partition: official partitions (0 train, 1 valid, 2 test; None = no
            held-out part).
        max_train_per_class, max_test_per_class: random cap per target class (proportions inside a
            class are kept in expectation), for reduced runs; only the kept images are decoded.
    Returns:
        (splits, info): x (N, 3, S, S) ``dtype`` ImageNet-normalised and y (N,) int64 target class in
        0..2**len(target_attrs)-1 on ``device``; info: num_classes, class_names, sizes, index_splits
        (indices into info["files"][part]).
    Raises:
        FileNotFoundError: see `find_celeba` / `load_celeba_images`. ValueError: unknown attribute,
        an empty forget set in the train or held-out partition (the message names the partition and
        the cap that emptied it), an empty partition, a malformed list file or unreadable image
        (see `read_celeba_attributes` / `load_celeba_images`), a cap that is not None or an integer
        >= 1 (`check_cap`), an ``image_size`` that is not an integer >= 1 (`check_image_size`;
        checked before any file is read). TypeError: a ``dtype`` that is not floating.
    """
    max_train_per_class = check_cap(max_train_per_class, "max_train_per_class")
    max_test_per_class = check_cap(max_test_per_class, "max_test_per_class")
    image_size = check_image_size(image_size)
    check_float_dtype(dtype)
    a = read_celeba_attributes(root)
    rng = np.random.default_rng(numpy_seed(seed))
    kw, idx_splits, files_out = {}, {}, {}
    parts = [("train", train_partition, max_train_per_class, "")]
    if test_partition is not None:
        parts.append(("test", test_partition, max_test_per_class, "_test"))
    for part, code, cap, suffix in parts:
        rows = np.flatnonzero(a["partition"] == code)
        if len(rows) == 0:
            raise ValueError(f"CelebA partition {code} ({part}) is empty")
        sub = {n: v[rows] for n, v in a["attrs"].items()}
        full = _split(sub, target_attrs, subclass_attrs, forget_subclass, part, code, None)
        if cap is not None:
            t = np.asarray(full.targets)
            keep = np.concatenate([rng.permutation(np.flatnonzero(t == c))[:cap] for c in np.unique(t)])
            rows = np.sort(rows[keep])
            sub = {n: v[rows] for n, v in a["attrs"].items()}
            full = _split(sub, target_attrs, subclass_attrs, forget_subclass, part, code, cap)
        full.meta.update(setting="celeba", part=part, partition=int(code))
        idx_splits[part] = full
        files = [a["files"][i] for i in rows]
        files_out[part] = files
        x = load_celeba_images(a["dir"], files, image_size)
        t = np.asarray(full.targets, dtype=np.int64)
        for name in IndexSplit.NAMES:
            ids = np.asarray(getattr(full, name), dtype=np.int64)
            if len(ids):
                kw[name + suffix] = TensorDataset(images_to_tensor(x[ids], device, dtype),
                                                  torch.as_tensor(t[ids], device=device))
    splits = Splits(**kw)
    splits.check()
    k = len(target_attrs)
    info = {"num_classes": 2 ** k, "class_names": list(CLASS_NAMES) if tuple(target_attrs) == TARGET_ATTRS else
            [str(c) for c in range(2 ** k)], "sizes": {n: len(v) for n, v in kw.items()},
            "forget_subclass": dict(forget_subclass), "index_splits": idx_splits, "files": files_out}
    return splits, info


def _split(sub, target_attrs, subclass_attrs, forget_subclass, part: str, code: int, cap: Optional[int]):
    """`split_by_attributes` on one partition; an empty forget set names the partition and the cap."""
    try:
        return split_by_attributes(sub, target_attrs, subclass_attrs, forget_subclass)
    except ValueError as e:
        if "empty forget" not in str(e):
            raise
        role = "train" if part == "train" else "held-out"
        why = (f" after the cap max_{part}_per_class={cap} (raise or drop it)" if cap is not None else "")
        raise ValueError(f"the {role} part (CelebA partition {code}) has no forget sample{why}: {e}") from e


def write_celeba_miniature(root: Union[str, Path], n: int = 48, *, seed: int = 0,
                           size: Tuple[int, int] = (178, 218)) -> Path:
    """Write a generated CelebA miniature in torchvision's layout under ``root/celeba`` (for smoke
    runs and tests; its images are noise and its accuracies mean nothing). Returns ``root``.

    Image i (JPEG, ``size`` = (width, height), random pixels) gets random ±1 attributes, except that
    (Male, Smiling, Young, Eyeglasses) take the (i mod 16)-th combination (binary, Male = most
    significant bit; -1 = absent) and its partition is (i // 16) mod 3, so with n a multiple of 48
    every combination appears n / 48 times in each partition. Raises ValueError for n < 1.
    """
    from PIL import Image

    if n < 1:
        raise ValueError("n must be >= 1")
    rng = np.random.default_rng(numpy_seed(seed))
    root = expand_user(root)
    d = Path(root) / "celeba"
    (d / "img_align_celeba").mkdir(parents=True, exist_ok=True)
    vals = rng.choice([-1, 1], (n, len(ATTRIBUTES)))
    combos = np.array([[(c >> b) & 1 for b in (3, 2, 1, 0)] for c in range(16)]) * 2 - 1
    vals[:, [ATTRIBUTES.index(a) for a in ("Male", "Smiling", "Young", "Eyeglasses")]] = combos[np.arange(n) % 16]
    part = (np.arange(n) // 16) % 3
    lines = [str(n), " ".join(ATTRIBUTES)]
    for i in range(n):
        name = f"{i + 1:06d}.jpg"
        pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
        Image.fromarray(pixels).save(d / "img_align_celeba" / name, format="JPEG", quality=70)
        lines.append(name + " " + " ".join(f"{v:2d}" for v in vals[i]))
    (d / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    (d / "list_eval_partition.txt").write_text("".join(f"{i + 1:06d}.jpg {p}\n" for i, p in enumerate(part)))
    return Path(root)


def forget_subclass_of(spec) -> dict:
    """The forget sub-class of the ``celeba`` setting's ``forget`` option: ``"Attr=0|1,..."`` (or a
    mapping) over the paper's `FORGET_SUBCLASS` (None: that sub-class). Raises ValueError for a
    malformed pair and for an attribute given twice (naming it; else the last value won silently)."""
    if spec is None:
        return dict(FORGET_SUBCLASS)
    if isinstance(spec, Mapping):
        return {**FORGET_SUBCLASS, **spec}
    out, given = dict(FORGET_SUBCLASS), set()
    for part in str(spec).split(","):
        k, eq, val = (x.strip() for x in part.partition("="))
        if not eq or val.lower() not in ("0", "1", "true", "false"):
            raise ValueError(f"celeba: forget takes Attr=0|1 pairs, e.g. 'Young=1,Eyeglasses=0' over "
                             f"{FORGET_SUBCLASS}; got {spec!r}")
        if k in given:
            raise ValueError(f"celeba: forget gives the attribute {k!r} more than once ({spec!r}); "
                             "give each attribute once, e.g. 'Young=1,Eyeglasses=0'")
        given.add(k)
        out[k] = val.lower() in ("1", "true")
    return out


def load_setting(root, *, seed, device, cache_dir=None, max_train_per_class=None, max_test_per_class=None,
                 image_size=64, forget=None):
    """The loader of the ``celeba`` setting (``entangle_ext/settings.py``): (`entangle_ext.Splits`,
    info dict) from the data root and the setting's data options (the command line's data flags).
    Raises as `celeba_splits` and `forget_subclass_of`."""
    return celeba_splits(root, image_size=image_size, max_train_per_class=max_train_per_class,
                         forget_subclass=forget_subclass_of(forget), max_test_per_class=max_test_per_class,
                         seed=seed, device=device)
