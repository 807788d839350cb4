"""The two Tiny-ImageNet sources of `entangle_ext.data.tinyimagenet.load_tinyimagenet` (its module
docstring describes them): the packed ``.npz`` (`read_npz_source`) and the standard
``tiny-imagenet-200/`` folders with the WordNet hypernym table (`read_standard_layout`,
`load_wordnet_csv`). Each returns the dict `load_tinyimagenet` documents."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import numpy as np

from .._paths import expand_user
from .checks import line_fields, read_csv_rows, read_text_lines
from .root import data_dirs, read_npz

__all__ = ["find_wordnet_csv", "load_wordnet_csv", "read_npz_source", "read_standard_layout", "check_npz_arrays",
           "NPZ_KEYS"]

NPZ_KEYS = ("wnids", "label", "split", "offsets", "jpeg_bytes", "hypernym_path", "class_names")
"""The arrays of the packed Tiny-ImageNet ``.npz``."""


def find_wordnet_csv(root: Union[str, Path, None] = None) -> Optional[Path]:
    """``tinyimagenet_wordnet.csv`` in ``root``, its parent, or the data directories
    (`entangle_ext.data.data_dirs`); None if absent."""
    cands = []
    if root is not None:
        r = Path(expand_user(root))
        cands += [r, r.parent] if r.is_dir() else [r.parent]
    for c in cands + [p for _, p in data_dirs()]:
        if (c / "tinyimagenet_wordnet.csv").is_file():
            return c / "tinyimagenet_wordnet.csv"
    return None


def load_wordnet_csv(path: Union[str, Path]) -> Dict[str, dict]:
    """{wnid: {"words": str, "path": [node names leaf→root], "path_wnids": [...]}} from
    ``tinyimagenet_wordnet.csv``. Raises FileNotFoundError / ValueError naming the file: missing
    columns, a wnid with several rows, and as `read_csv_rows` (not UTF-8, malformed or truncated rows)."""
    p = Path(expand_user(path))
    if not p.is_file():
        raise FileNotFoundError(f"no WordNet hypernym table at {p}")
    rows, cols = read_csv_rows(p)
    if not {"wnid", "words", "hypernym_path"} <= set(cols):
        raise ValueError(f"{p}: needs columns wnid, words, hypernym_path (found {cols})")
    ids = [row["wnid"] for row in rows]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{p}: wnid(s) {sorted({w for w in ids if ids.count(w) > 1})[:5]} have several rows")
    return {row["wnid"]: {"words": row["words"], "path": [s.strip() for s in row["hypernym_path"].split(">")],
                          "path_wnids": [s.strip() for s in row.get("hypernym_wnids", "").split(">") if s.strip()]}
            for row in rows}


def _rgb(im, size: int) -> np.ndarray:
    """(size, size, 3) uint8 RGB of the open Pillow image ``im`` (resized, bilinear, when another size)."""
    from PIL import Image
    im = im.convert("RGB")
    if im.size != (size, size):
        im = im.resize((size, size), Image.BILINEAR)
    return np.asarray(im, dtype=np.uint8)


def _decode(jpeg: bytes, where: str, size: int = 64) -> np.ndarray:
    """As `_read_image`, from the bytes of one image of the npz (``where`` names it)."""
    from PIL import Image
    try:
        with Image.open(io.BytesIO(jpeg)) as im:
            return _rgb(im, size)
    except (OSError, ValueError, SyntaxError) as e:   # PIL.UnidentifiedImageError is an OSError
        raise ValueError(f"{where}: not a readable image ({type(e).__name__}: {e})") from e


def _read_image(path: Path, size: int = 64) -> np.ndarray:
    """(size, size, 3) uint8 RGB. Raises FileNotFoundError / ValueError (corrupt image), naming ``path``."""
    from PIL import Image
    if not path.is_file():
        raise FileNotFoundError(f"missing image {path}")
    try:
        with Image.open(path) as im:
            return _rgb(im, size)
    except (OSError, ValueError, SyntaxError) as e:   # PIL.UnidentifiedImageError is an OSError
        raise ValueError(f"{path}: not a readable image ({type(e).__name__}: {e})") from e


def _cap(idx: np.ndarray, cap: Optional[int], rng) -> np.ndarray:
    if cap is not None and len(idx) > cap:
        idx = np.sort(rng.choice(idx, cap, replace=False))
    return idx


def _found(values: np.ndarray) -> str:
    return ", ".join(str(v) for v in sorted(set(values.tolist()))[:5])


def check_npz_arrays(src: Path, d: Dict[str, np.ndarray]) -> None:
    """Raise ValueError naming ``src`` and the key when the arrays `NPZ_KEYS` of a Tiny-ImageNet
    npz disagree: each must be 1-D; ``wnids`` (W unique names, W >= 1), ``class_names`` and
    ``hypernym_path`` strings of length W; ``label`` (N integers in 0..W-1) and ``split`` (N
    integers, 0 train / 1 val); ``offsets`` N+1 non-decreasing integers from >= 0 to at most the
    length of ``jpeg_bytes`` (uint8). Without this a short array failed with IndexError / KeyError
    and an out-of-range label or split silently dropped its images."""
    def bad(key: str, what: str):
        raise ValueError(f"{src}: '{key}' {what}")
    for k in NPZ_KEYS:
        if d[k].ndim != 1:
            bad(k, f"must be 1-D, got shape {d[k].shape}")
    for k, kinds, want in (("wnids", "U", "strings"), ("class_names", "U", "strings"),
                           ("hypernym_path", "U", "strings"), ("label", "iu", "integers"),
                           ("split", "iu", "integers"), ("offsets", "iu", "integers"), ("jpeg_bytes", "u", "bytes")):
        if d[k].dtype.kind not in kinds or (k == "jpeg_bytes" and d[k].dtype != np.uint8):
            bad(k, f"must hold {want}, got dtype {d[k].dtype}")
    w, n = len(d["wnids"]), len(d["label"])
    wn = d["wnids"].tolist()
    if w == 0 or len(set(wn)) != w:
        bad("wnids", "is empty" if w == 0 else f"repeats {sorted({x for x in wn if wn.count(x) > 1})}")
    per_class = {k: len(d[k]) for k in ("wnids", "class_names", "hypernym_path")}
    if len(set(per_class.values())) > 1:
        odd = min(per_class, key=lambda k: list(per_class.values()).count(per_class[k]))
        bad(odd, "differs in length from the other per-class arrays (one entry per class each): "
                 + ", ".join(f"'{k}' has {v}" for k, v in per_class.items()))
    if len(d["split"]) != n:
        bad("split", f"has {len(d['split'])} entries but 'label' has {n} (one per image)")
    if len(d["offsets"]) != n + 1:
        bad("offsets", f"has {len(d['offsets'])} entries but needs {n + 1} (one more than the {n} images of 'label')")
    lab, split, off = d["label"], d["split"], d["offsets"].astype(np.int64)
    if ((lab < 0) | (lab >= w)).any():
        bad("label", f"has values outside 0..{w - 1} (found {_found(lab[(lab < 0) | (lab >= w)])}; "
                     f"{w} classes in 'wnids')")
    if not np.isin(split, (0, 1)).all():
        bad("split", f"has values other than 0 (train) and 1 (val) (found {_found(split[~np.isin(split, (0, 1))])})")
    if (off[:1] < 0).any() or (np.diff(off) < 0).any():
        bad("offsets", "must be non-decreasing and start at >= 0 (image i is jpeg_bytes[offsets[i]:offsets[i+1]])")
    if off[-1] > len(d["jpeg_bytes"]):
        bad("offsets", f"end at {off[-1]}, beyond the {len(d['jpeg_bytes'])} bytes of 'jpeg_bytes'")


def read_npz_source(src: Path, classes, max_train_per_class, max_val_per_class, rng, *, wordnet_csv=None) -> dict:
    """`load_tinyimagenet` from the packed ``.npz`` (its own hypernym paths; ``wordnet_csv``
    unused). Raises ValueError as `read_npz` and `check_npz_arrays`."""
    d = read_npz(src, NPZ_KEYS, "Tiny-ImageNet")
    check_npz_arrays(src, d)
    all_wnids = [str(w) for w in d["wnids"]]
    wnids = all_wnids if classes is None else list(classes)
    bad = [w for w in wnids if w not in all_wnids]
    if bad:
        raise ValueError(f"unknown wnid(s) {bad} in {src.name}; it holds {all_wnids}")
    label, split, off, jb = d["label"], d["split"], d["offsets"], d["jpeg_bytes"]
    paths = {all_wnids[i]: [s.strip() for s in str(p).split(">")] for i, p in enumerate(d["hypernym_path"])}
    names = {all_wnids[i]: str(n).split(",")[0] for i, n in enumerate(d["class_names"])}
    out = {}
    for part, code, cap in (("train", 0, max_train_per_class), ("val", 1, max_val_per_class)):
        xs, ys = [], []
        for new, w in enumerate(wnids):
            idx = _cap(np.flatnonzero((label == all_wnids.index(w)) & (split == code)), cap, rng)
            xs += [_decode(jb[off[i]:off[i + 1]].tobytes(), f"{src} image {i}") for i in idx]
            ys += [new] * len(idx)
        out[f"x_{part}"] = np.stack(xs) if xs else np.zeros((0, 64, 64, 3), np.uint8)
        out[f"y_{part}"] = np.asarray(ys, dtype=np.int64)
    return out | {"wnids": wnids, "names": [names[w] for w in wnids], "paths": [paths[w] for w in wnids],
                  "source": str(src), "wordnet_nodes": sorted({n for p in paths.values() for n in p})}


def _read_class_lists(src: Path) -> Tuple[List[str], Dict[str, str]]:
    """(wnids of ``wnids.txt``, {wnid: words} of ``words.txt``). Raises FileNotFoundError (a
    missing ``words.txt``) and ValueError naming the file (and line): not UTF-8, no or repeated
    wnids, a ``words.txt`` line without the tab between wnid and words."""
    wnids_file, words_file = src / "wnids.txt", src / "words.txt"
    all_wnids = [w for l in read_text_lines(wnids_file) for w in l.split()]
    if not all_wnids or len(set(all_wnids)) != len(all_wnids):
        raise ValueError(f"{wnids_file}: " + ("lists no wnid" if not all_wnids else
                         f"repeats {sorted({w for w in all_wnids if all_wnids.count(w) > 1})[:5]}"))
    if not words_file.is_file():
        raise FileNotFoundError(f"{words_file} is missing (standard tiny-imagenet-200 layout)")
    words = {}
    for n, l in enumerate(read_text_lines(words_file), 1):
        if l.strip():
            w, text = line_fields(l, words_file, n, 2, "\t", 1, form="'<wnid><TAB><words>'")
            words[w.strip()] = text
    return all_wnids, words


def _read_val_annotations(ann: Path, all_wnids: List[str]) -> List[Tuple[str, str]]:
    """(file, wnid) per line of ``val_annotations.txt`` (``file<TAB>wnid<TAB>x0 y0 x1 y1``).
    Raises FileNotFoundError (missing) and ValueError naming the file and line: not UTF-8, a line
    without the tab-separated file and wnid, a wnid not in ``wnids.txt`` (its image would vanish)."""
    if not ann.is_file():
        raise FileNotFoundError(f"{ann} is missing (standard tiny-imagenet-200 layout)")
    known, val = set(all_wnids), []
    for n, l in enumerate(read_text_lines(ann), 1):
        if l.strip():
            f, w = line_fields(l, ann, n, 2, "\t", form="'<file><TAB><wnid><TAB>x0<TAB>y0<TAB>x1<TAB>y1'")[:2]
            if w not in known:
                raise ValueError(f"{ann} line {n}: wnid {w!r} is not in wnids.txt")
            val.append((f, w))
    return val


_JPEG_SUFFIXES = (".jpeg", ".jpg")
"""File endings of the train images of the standard layout, compared case-insensitively."""


def _train_images(d: Path) -> np.ndarray:
    """Sorted names of the JPEG files (`_JPEG_SUFFIXES`, any case) in the class folder ``d``
    (``train/<wnid>/images``). Raises FileNotFoundError (no folder) and ValueError naming the
    folder when it holds none: the class would otherwise keep its name with 0 train images."""
    if not d.is_dir():
        raise FileNotFoundError(f"missing class folder {d}")
    files = sorted(p.name for p in d.iterdir() if p.suffix.lower() in _JPEG_SUFFIXES)
    if not files:
        raise ValueError(f"class folder {d} has no train image (no file ending in .JPEG, .jpeg or .jpg, any "
                         "case); put the class's images there, or leave the class out of classes=")
    return np.array(files)


def read_standard_layout(src: Path, classes, max_train_per_class, max_val_per_class, rng, *,
                          wordnet_csv=None) -> dict:
    """`load_tinyimagenet` from the standard ``tiny-imagenet-200/`` folders (JPEG files, the
    hypernym table ``wordnet_csv`` or `find_wordnet_csv`). The train images of a class are the
    files of ``train/<wnid>/images`` ending in `_JPEG_SUFFIXES` (any case); the val images are the
    files ``val_annotations.txt`` names (any ending; a class may have none, e.g. an empty file: no
    held-out part, which `tinyimagenet_splits` skips). Raises ValueError naming the class folder
    when a selected class has no train image."""
    all_wnids, words = _read_class_lists(src)
    wnids = all_wnids if classes is None else list(classes)
    bad = [w for w in wnids if w not in all_wnids]
    if bad:
        raise ValueError(f"unknown wnid(s) {bad}: not in {src / 'wnids.txt'}")
    wcsv = Path(wordnet_csv) if wordnet_csv is not None else find_wordnet_csv(src)
    if wcsv is None:
        places = ", ".join(str(p) for p in [src, src.parent] + [p for _, p in data_dirs()])
        raise FileNotFoundError(f"no tinyimagenet_wordnet.csv (WordNet hypernym paths) in {places}: put the file "
                                f"in {src.parent} (beside {src.name}/) or in $ENTANGLE_DATA (no command-line flag "
                                "takes its path), or from Python pass wordnet_csv=PATH")
    wn = load_wordnet_csv(wcsv)
    missing = [w for w in wnids if w not in wn]
    if missing:
        raise ValueError(f"wnid(s) {missing[:5]} have no hypernym path in {wcsv}")
    xs, ys = [], []
    for new, w in enumerate(wnids):
        d = src / "train" / w / "images"
        files = _train_images(d)
        for f in files[_cap(np.arange(len(files)), max_train_per_class, rng)]:
            xs.append(_read_image(d / f))
            ys.append(new)
    ann = src / "val" / "val_annotations.txt"
    val = _read_val_annotations(ann, all_wnids)
    vx, vy = [], []
    for new, w in enumerate(wnids):
        files = np.array(sorted(f for f, ww in val if ww == w))
        for f in files[_cap(np.arange(len(files)), max_val_per_class, rng)]:
            vx.append(_read_image(src / "val" / "images" / f))
            vy.append(new)
    empty = np.zeros((0, 64, 64, 3), np.uint8)
    return {"x_train": np.stack(xs) if xs else empty, "y_train": np.asarray(ys, np.int64),
            "x_val": np.stack(vx) if vx else empty, "y_val": np.asarray(vy, np.int64), "wnids": wnids,
            "names": [words.get(w, wn[w]["words"]).split(",")[0].strip() for w in wnids],
            "paths": [wn[w]["path"] for w in wnids], "source": str(src),
            "wordnet_nodes": sorted({n for v in wn.values() for n in v["path"]})}
