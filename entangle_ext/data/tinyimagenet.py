"""Tiny-ImageNet in the paper's superclass setting (docs/algorithm.md §1, Tiny-ImageNet row).

The model predicts **superclasses** derived from the WordNet hypernym paths of the classes: the
coarse label of a class is the first node of its leaf→root path that is in ``superclasses``. D_f =
the forget class(es) (paper: the six dog classes inside "mammal"), D_adj = the other classes of the
same superclass, D_rem = the other superclasses. Train = official train images, held-out = the
official val images (the official test set has no labels).

Accepted sources (`load_tinyimagenet`):

* the standard ``tiny-imagenet-200/`` layout: ``wnids.txt``, ``words.txt``,
  ``train/<wnid>/images/*.JPEG`` (``.jpeg`` / ``.jpg`` also, any case), ``val/val_annotations.txt``
  (``file<TAB>wnid<TAB>x0 y0 x1 y1``), ``val/images/<file>`` (the files the annotations name). The
  hypernym paths come from ``tinyimagenet_wordnet.csv`` (columns wnid, words, hypernym_path,
  hypernym_wnids; WordNet 3.0), looked up next to the data, in its parent and
  in the data directories (`entangle_ext.data.data_dirs`), or passed as ``wordnet_csv``;
* ``tinyimagenet_dogs_cats.npz``: 11 classes (6 dog breeds, 5 felines), 500 train
  + 50 val each, original JPEG bytes, hypernym paths included. There the whole data set is inside
  "carnivore", so the default superclasses are ("dog", "feline") and the default forget class is one
  breed (Chihuahua): adjacent = the other five breeds, remote = the felines.

`DEFAULT_SUPERCLASSES` (10 nodes) is our grouping of the 200 classes; the paper does not list its 10
superclasses, only that the six dogs sit in "mammals".
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import TensorDataset

from ..splits import IndexSplit, split_by_hierarchy
from ..unlearn.data import Splits
from .checks import check_cap, check_float_dtype
from .seeds import numpy_seed
from .root import find_data_file
from .tinyimagenet_sources import find_wordnet_csv, load_wordnet_csv, read_npz_source, read_standard_layout
from .vit import IMAGENET_MEAN, IMAGENET_STD

__all__ = ["load_setting", "find_tinyimagenet", "find_wordnet_csv", "load_wordnet_csv", "load_tinyimagenet", "superclass_map",
           "resolve_classes", "tinyimagenet_splits", "images_to_tensor", "DEFAULT_SUPERCLASSES",
           "DOGS_CATS_SUPERCLASSES"]

DEFAULT_SUPERCLASSES = ("mammal", "vertebrate", "invertebrate", "device", "covering", "structure",
                        "conveyance", "container", "matter", "other")
"""Coarse classes for the full 200-class layout ("other" = every class matching none of the rest)."""
DOGS_CATS_SUPERCLASSES = ("dog", "feline")
DOG_WNIDS = ("n02085620", "n02094433", "n02099601", "n02099712", "n02106662", "n02113799")


def _is_tinyimagenet(p: Path) -> bool:
    return (p.is_file() and p.suffix == ".npz") or ((p / "wnids.txt").is_file() and (p / "train").is_dir())


def _locate(root) -> Path:
    return find_data_file(("tiny-imagenet-200", "tinyimagenet_dogs_cats.npz"), root, is_data=_is_tinyimagenet,
                          what="Tiny-ImageNet (tiny-imagenet-200/ with wnids.txt, words.txt, train/, val/; "
                               "or tinyimagenet_dogs_cats.npz)")


def find_tinyimagenet(root: Union[str, Path, None] = None) -> Optional[Path]:
    """The Tiny-ImageNet source: ``root`` itself (a ``tiny-imagenet-200`` directory, one holding
    ``wnids.txt`` and ``train/``, or a ``.npz`` file), or ``tiny-imagenet-200/`` /
    ``tinyimagenet_dogs_cats.npz`` inside it; with ``root`` None, inside the data directories of
    `entangle_ext.data.data_dirs`. None when nothing is found (`load_tinyimagenet` raises instead,
    naming every place looked at)."""
    try:
        return _locate(root)
    except FileNotFoundError:
        return None


def load_tinyimagenet(root: Union[str, Path, None] = None, *, classes: Optional[Sequence[str]] = None,
                      max_train_per_class: Optional[int] = None, max_val_per_class: Optional[int] = None,
                      wordnet_csv: Union[str, Path, None] = None, seed: int = 0) -> dict:
    """Read Tiny-ImageNet (either source, module docstring) into uint8 arrays.

    Args:
        root: see `find_tinyimagenet`. classes: restrict to these wnids (None = all in the source).
        max_train_per_class, max_val_per_class: random cap per class (``seed``), for reduced runs.
        wordnet_csv: hypernym table for the standard layout (default: `find_wordnet_csv`).
    Returns:
        dict: x_train (N, 64, 64, 3) uint8 HWC, y_train (N,) int64 index into ``wnids``, x_val, y_val,
        wnids (list), names (first synonym of each class), paths (hypernym node names leaf→root),
        source (str), wordnet_nodes (sorted names of every node of the source's hypernym table, for
        telling a typo from a superclass without loaded classes).
    Raises:
        FileNotFoundError: no source, a missing ``words.txt`` / ``val_annotations.txt`` / class folder
            / hypernym table / image. ValueError: a wnid in ``classes`` that the source does not
            have, or one repeated; a file that is not a Tiny-ImageNet archive or a corrupt image
            (`read_npz`; the message names the file); npz arrays that disagree in length, shape or
            dtype, a ``label`` outside 0..W-1, a ``split`` other than 0/1, ``offsets`` that do not
            fit ``jpeg_bytes`` (`check_npz_arrays`; the message names the file and the key); a
            ``wnids.txt`` / ``words.txt`` / ``val_annotations.txt`` / hypernym table that is not
            UTF-8, has a malformed line or row, repeats a wnid, or (annotations) names a wnid
            absent from ``wnids.txt`` (the message names the file and line); a selected class
            without train images (its ``train/<wnid>/images`` folder holds no .JPEG / .jpeg / .jpg
            file, any case; the message names the folder); a cap
            that is not None or an integer >= 1 (`check_cap`). TypeError: ``classes`` is one string.
    """
    max_train_per_class = check_cap(max_train_per_class, "max_train_per_class")
    max_val_per_class = check_cap(max_val_per_class, "max_val_per_class")
    if isinstance(classes, (str, bytes)):
        raise TypeError(f"classes must be a list of wnids, got the string {classes!r}")
    if classes is not None and len(set(classes)) != len(list(classes)):
        raise ValueError(f"classes repeat {sorted({c for c in classes if list(classes).count(c) > 1})}: "
                         "each class may appear once (its images would be loaded twice)")
    src = _locate(root)
    rng = np.random.default_rng(numpy_seed(seed))
    read = read_npz_source if src.suffix == ".npz" else read_standard_layout
    return read(src, classes, max_train_per_class, max_val_per_class, rng, wordnet_csv=wordnet_csv)


def superclass_map(paths: Sequence[Sequence[str]], superclasses: Sequence[str],
                   wordnet_nodes: Optional[Sequence[str]] = None) -> np.ndarray:
    """(F,) int64 coarse index per class: the first node of its leaf→root ``paths`` entry that is in
    ``superclasses`` (the leaf itself excluded); a class matching none gets the index of "other" if
    ``superclasses`` contains it, else -1 (excluded from every split).

    Raises:
        TypeError: ``superclasses`` is one string.
        ValueError: a repeated name; a name on no class's path (a typo when ``wordnet_nodes``, the
            hypernym table's node names, lacks it; else a real node without loaded classes); a
            superclass that gets no class (e.g. "other" when every class matches another name).
    """
    if isinstance(superclasses, (str, bytes)):
        raise TypeError(f"superclasses must be a list of names, got the string {superclasses!r}")
    sup = list(superclasses)
    dup = sorted({s for s in sup if sup.count(s) > 1})
    if dup:
        raise ValueError(f"superclasses repeat {dup}: each coarse class may appear once")
    seen = {n for p in paths for n in p[1:]}
    unknown = [s for s in sup if s != "other" and s not in seen]
    typos = [s for s in unknown if wordnet_nodes is not None and s not in set(wordnet_nodes)]
    if typos:
        raise ValueError(f"unknown superclass name(s) {typos}: not WordNet nodes of the hypernym table (typo?)")
    if unknown:
        raise ValueError(f"superclass(es) {unknown}: no loaded class has them on its WordNet path")
    out = _assign(paths, sup)
    empty = [s for i, s in enumerate(sup) if not (out == i).any()]
    if empty:
        raise ValueError(f"superclass(es) {empty} would get no class (every class matches an earlier name "
                         f"of {sup} first)")
    return out


def _assign(paths: Sequence[Sequence[str]], sup: List[str]) -> np.ndarray:
    out = np.full(len(paths), -1, np.int64)
    for i, p in enumerate(paths):
        for node in p[1:]:
            if node in sup:
                out[i] = sup.index(node)
                break
        else:
            if "other" in sup:
                out[i] = sup.index("other")
    return out


def resolve_classes(spec: Union[str, Sequence[str]], wnids: Sequence[str], names: Sequence[str],
                    paths: Sequence[Sequence[str]]) -> List[int]:
    """Class indices named by ``spec``: a wnid, a class name (case-insensitive, first synonym, spaces
    or underscores), a hypernym node (every class below it, e.g. "dog"), or a list / comma string of
    those. Raises ValueError for a name matching nothing (the message lists valid names)."""
    items = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    norm = lambda s: s.strip().lower().replace("_", " ")
    out: List[int] = []
    for it in items:
        hit = [i for i, w in enumerate(wnids) if w == it] or \
              [i for i, n in enumerate(names) if norm(n) == norm(it)] or \
              [i for i, p in enumerate(paths) if any(norm(x) == norm(it) for x in p[1:])]
        if not hit:
            raise ValueError(f"unknown class {it!r}: not a wnid, class name or hypernym of the loaded classes "
                             f"(names: {list(names)[:20]}{' …' if len(names) > 20 else ''})")
        out += [i for i in hit if i not in out]
    return out


def images_to_tensor(x: np.ndarray, device="cpu", dtype=torch.float32, mean: Sequence[float] = IMAGENET_MEAN,
                     std: Sequence[float] = IMAGENET_STD) -> torch.Tensor:
    """(N, H, W, 3) uint8 → (N, 3, H, W) ``dtype`` on ``device``: scaled to [0, 1], then normalised
    per channel with ``mean`` / ``std`` (default: the ImageNet statistics). Raises TypeError when
    ``dtype`` is not a floating dtype (an integer one would truncate the normalised values)."""
    check_float_dtype(dtype)
    t = torch.as_tensor(x, device=device).permute(0, 3, 1, 2).to(dtype).div_(255.0)
    mean = torch.tensor(mean, device=device, dtype=dtype).view(1, 3, 1, 1)
    std = torch.tensor(std, device=device, dtype=dtype).view(1, 3, 1, 1)
    return ((t - mean) / std).contiguous()


def tinyimagenet_splits(root: Union[str, Path, None] = None, *, forget: Union[str, Sequence[str], None] = None,
                        superclasses: Optional[Sequence[str]] = None, classes: Optional[Sequence[str]] = None,
                        max_train_per_class: Optional[int] = None, max_val_per_class: Optional[int] = None,
                        seed: int = 0, device="cpu", dtype=torch.float32, data: Optional[dict] = None,
                        wordnet_csv=None) -> Tuple[Splits, dict]:
    """`Splits` of the Tiny-ImageNet superclass setting as TensorDatasets.

    Args:
        root, classes, max_*_per_class, seed, wordnet_csv: see `load_tinyimagenet`; data: its output.
        forget: see `resolve_classes`; default "dog" (the six dog classes) for the 200-class layout,
            "Chihuahua" for the dogs/cats npz.
        superclasses: coarse nodes (a list); default `DEFAULT_SUPERCLASSES` (200 classes) or
            `DOGS_CATS_SUPERCLASSES` (npz), less the names no loaded class falls under (a subset of
            ``classes``); names given here must each get a class (`superclass_map`).
    Returns:
        (splits, info): x (N, 3, 64, 64) ``dtype`` (ImageNet-normalised) and y (N,) int64 coarse
        labels on ``device``; info: num_classes, coarse_names, forget / adjacent class names, sizes and
        the `IndexSplit` objects ("index_splits": {"train", "val"}).
    Raises:
        FileNotFoundError / ValueError: as `load_tinyimagenet`, `resolve_classes`, `superclass_map`;
        ValueError when the forget classes span several superclasses or have no images in the train
        or the held-out (val) part (the message names the classes and the part), or when a
        forget class's hypernym path contains none of the superclasses (e.g. the npz's paths lack
        "dog"; the message names the source, the class and its path).
    """
    d = data if data is not None else load_tinyimagenet(root, classes=classes, max_train_per_class=max_train_per_class,
                                                        max_val_per_class=max_val_per_class, seed=seed,
                                                        wordnet_csv=wordnet_csv)
    dropped = []
    if superclasses is None:   # the defaults without the names no loaded class falls under
        default = list(DOGS_CATS_SUPERCLASSES if d["source"].endswith(".npz") else DEFAULT_SUPERCLASSES)
        hit = set(_assign(d["paths"], default).tolist())
        superclasses = [s for i, s in enumerate(default) if i in hit]
        dropped = [s for s in default if s not in superclasses]
    if forget is None:
        forget = "Chihuahua" if d["source"].endswith(".npz") else "dog"
    f2c = superclass_map(d["paths"], superclasses, d.get("wordnet_nodes"))
    ff = resolve_classes(forget, d["wnids"], d["names"], d["paths"])
    _check_forget_covered(d, ff, f2c, superclasses, dropped)
    kw, idx_splits = {}, {}
    for part, suffix in (("train", ""), ("val", "_test")):
        y = d[f"y_{part}"]
        if part == "val" and len(y) == 0:
            continue
        _check_forget_images(d, ff, y, part)
        s = split_by_hierarchy(y, f2c, ff, fine_names=d["names"], coarse_names=list(superclasses))
        s.meta.update(setting="tinyimagenet", part=part, source=Path(d["source"]).name)
        empty = [n for n in IndexSplit.NAMES if not getattr(s, n)]
        if part == "train" and empty:
            raise ValueError(f"the {'/'.join(empty)} split would be empty with superclasses {list(superclasses)} "
                             f"and forget {forget!r}: the method needs sibling classes (adjacent) in the forget "
                             "classes' superclass and at least one other superclass (remote)")
        idx_splits[part] = s
        x = d[f"x_{part}"]
        for name in IndexSplit.NAMES:
            ids = np.asarray(getattr(s, name), dtype=np.int64)
            if len(ids) == 0:
                continue
            kw[name + suffix] = TensorDataset(images_to_tensor(x[ids], device, dtype),
                                              torch.as_tensor(f2c[y[ids]], dtype=torch.long, device=device))
    splits = Splits(**kw)
    splits.check()
    tr = idx_splits["train"]
    info = {"num_classes": len(superclasses), "coarse_names": list(superclasses),
            "forget_classes": tr.meta["forget_fine_names"], "adjacent_classes": tr.meta["adjacent_fine_names"],
            "forget_superclass": tr.meta["coarse_name"], "sizes": {k: len(v) for k, v in kw.items()},
            "index_splits": idx_splits}
    return splits, info


def _check_forget_images(d: dict, ff: Sequence[int], y: np.ndarray, part: str) -> None:
    """ValueError naming the forget class(es), the part and the source when none of their images
    is in ``part`` ("train", or "val", the held-out part): an empty forget set."""
    if not np.isin(y, ff).any():
        where = "held-out (val)" if part == "val" else "train"
        raise ValueError(f"empty forget set: the forget class(es) {[str(d['names'][k]) for k in ff]} have no image "
                         f"in the {where} part of {Path(d['source']).name}; choose another forget class (--forget) "
                         f"or add {part} images of it")


def _check_forget_covered(d: dict, ff: Sequence[int], f2c: np.ndarray, superclasses, dropped) -> None:
    """ValueError when a forget class falls under none of ``superclasses``: its hypernym path (in the
    data) lacks the expected superclass; ``dropped`` = default superclasses on no loaded class's path."""
    out = [i for i in ff if f2c[i] < 0]
    if not out:
        return
    names = [d["names"][i] for i in out]
    why = f"; no loaded class's hypernym path has the default superclass(es) {dropped}" if dropped else ""
    raise ValueError(f"{d['source']}: the hypernym path of forget class(es) {names} contains none of the "
                     f"superclasses {list(superclasses)}{why} (path of {names[0]!r}: "
                     f"{' > '.join(d['paths'][out[0]])})")


def load_setting(root, *, seed, device, cache_dir=None, max_train_per_class=None, max_test_per_class=None,
                 superclasses=None, forget=None):
    """The loader of the ``tinyimagenet`` setting (``entangle_ext/settings.py``): (`entangle_ext.Splits`,
    info dict) from the data root and the setting's data options (the command line's data flags).
    Raises as `tinyimagenet_splits`."""
    return tinyimagenet_splits(root, forget=forget, superclasses=superclasses, max_train_per_class=max_train_per_class,
                               max_val_per_class=max_test_per_class, seed=seed, device=device)
