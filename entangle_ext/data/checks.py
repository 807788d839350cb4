"""Checks every data loader shares.

Options: a per-class cap (`check_cap`), the held-out share (`check_fraction`), the floating dtype
of returned inputs (`check_float_dtype`) and an image side (`check_image_size`).
`entangle_ext.settings.Setting.check_options` and the loaders called directly (`digits_splits`,
`cifar100_splits`, `load_tinyimagenet`, `celeba_splits`, `toxigen_index_splits`) use the same
ones, so a direct call refuses what the registry refuses.

Arrays read from a file, before anything indexes with them: images (`check_images`) and class
labels (`check_labels`).

Text files: `read_text_lines`, `line_fields` and `read_csv_rows` read the loaders' list files and
CSV tables; a file that is not UTF-8, a malformed CSV or a line / row without the expected fields
gives a ValueError naming the file and the line, never a raw UnicodeDecodeError or unpacking error."""
from __future__ import annotations

import csv
import numbers
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import torch

__all__ = ["check_cap", "check_fraction", "check_float_dtype", "check_image_size", "check_images", "check_labels",
           "read_text_lines", "line_fields", "read_csv_rows"]


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


def check_fraction(value: Any, name: str = "test_fraction", *, zero_ok: bool = False) -> float:
    """``value`` as a float when it is a share in (0, 1) (``zero_ok``: [0, 1), 0 = no held-out part).

    Args:
        value: a real number (Python or numpy; a bool or str is not coerced).
        name: the option's name for the message.
    Raises:
        TypeError: ``value`` is not a real number.
        ValueError: it is NaN or outside the range.
    """
    rng = "[0, 1)" if zero_ok else "(0, 1)"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number in {rng}, got {type(value).__name__} {value!r}")
    v = float(value)
    if not ((0.0 <= v) if zero_ok else (0.0 < v)) or not v < 1.0:
        raise ValueError(f"{name} must be in {rng} (the held-out share), got {value!r}")
    return v


def check_float_dtype(dtype: Any, name: str = "dtype") -> torch.dtype:
    """``dtype`` when it is a floating torch dtype (inputs scaled to [0, 1] or normalised keep their
    values); raises TypeError for anything else (e.g. torch.int64, which would truncate them)."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating torch dtype (e.g. torch.float32), got {dtype!r}: "
                        "the inputs are scaled floats, an integer dtype would truncate them")
    return dtype


def check_images(x: Any, where: str, key: str, hwc: Optional[tuple] = None) -> int:
    """The number of images in ``x``, which must be a uint8 (N, H, W, 3) numpy array (pixel values
    0..255, channels last); ``hwc``: the required (H, W, 3), if fixed.

    Raises:
        ValueError: naming ``where`` (the file) and ``key``: another dtype (float images in [0, 1]
            would be divided by 255 once more, int ones beyond 255 scaled past the range, both
            without an error), another number of dimensions, channels first, another image size.
    """
    x = np.asarray(x)
    if x.dtype != np.uint8:
        raise ValueError(f"{where}: {key!r} must hold uint8 images (pixel values 0..255), got dtype "
                         f"{x.dtype} (floats in [0, 1] would be scaled by 1/255 twice)")
    want = "(N, H, W, 3) (channels last)" if hwc is None else f"(N, {', '.join(map(str, hwc))})"
    if x.ndim != 4 or x.shape[-1] != 3 or (hwc is not None and tuple(x.shape[1:]) != tuple(hwc)):
        raise ValueError(f"{where}: {key!r} must have shape {want}, got {tuple(x.shape)}")
    return int(x.shape[0])


def check_labels(y: Any, n: int, num_classes: int, where: str, key: str) -> np.ndarray:
    """``y`` as a 1-D int64 numpy array of ``n`` class labels in 0..num_classes-1.

    Raises:
        ValueError: naming ``where`` and ``key``: not a 1-D integer array (floats, strings, bools),
            another length than ``n`` (the images it labels), a label outside 0..num_classes-1 (it
            would index past the class names, or, negative, count from their end).
    """
    y = np.asarray(y)
    if y.ndim != 1 or y.dtype == np.bool_ or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"{where}: {key!r} must be a 1-D array of integer labels, got dtype {y.dtype} "
                         f"and shape {tuple(y.shape)}")
    if len(y) != n:
        raise ValueError(f"{where}: {key!r} has {len(y)} labels for {n} images")
    bad = y[(y < 0) | (y >= num_classes)]
    if len(bad):
        raise ValueError(f"{where}: {key!r} has labels outside 0..{num_classes - 1} (the {num_classes} "
                         f"class names), e.g. {int(bad[0])}")
    return y.astype(np.int64, copy=False)


def read_text_lines(path: Union[str, Path]) -> List[str]:
    """The lines of the UTF-8 text file ``path`` (without line ends; a leading byte-order mark, as
    Windows editors save, is dropped: it would be part of the first entry). The one reader of the
    loaders' line-based list files (CelebA's lists, Tiny-ImageNet's ``wnids.txt`` / ``words.txt`` /
    ``val_annotations.txt``). Raises ValueError naming the file when it is not UTF-8 text."""
    try:
        return Path(path).read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not a UTF-8 text file ({e}); re-save it as UTF-8") from e


def line_fields(line: str, path: Union[str, Path], lineno: int, count: int, sep: Optional[str] = None,
                maxsplit: int = -1, form: Optional[str] = None) -> List[str]:
    """``line.split(sep, maxsplit)`` when it has at least ``count`` fields; else ValueError naming
    ``path``, the 1-based ``lineno`` and the expected ``form`` (e.g. "'<file><TAB><wnid>…'")."""
    fields = line.split(sep, maxsplit)
    if len(fields) < count:
        sep_name = {"\t": "tab", None: "whitespace"}.get(sep, repr(sep))
        want = form or f"at least {count} {sep_name}-separated fields"
        raise ValueError(f"{path} line {lineno}: expected {want}, got {line.strip()[:60]!r}")
    return fields


def read_csv_rows(path: Union[str, Path]) -> Tuple[List[Dict[str, str]], List[str]]:
    """(rows as dicts, column names) of the UTF-8 CSV file ``path`` (header on line 1; a leading
    byte-order mark, as Excel's "CSV UTF-8" writes, is skipped and not read into the first column's
    name). The one reader of the loaders' CSV tables (ToxiGen, the Tiny-ImageNet hypernym table).

    Raises:
        ValueError (naming the file): not UTF-8, a malformed CSV, or truncated / malformed rows
            (fewer or more fields than the header; the message lists the row numbers, header = 1).
    """
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            cols = list(reader.fieldnames or [])
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not a UTF-8 text file ({e}); re-save it as UTF-8") from e
    except csv.Error as e:
        raise ValueError(f"{path}: malformed CSV ({e})") from e
    bad = [i + 2 for i, r in enumerate(rows) if None in r or any(r[c] is None for c in cols)]
    if bad:
        raise ValueError(f"{path}: truncated or malformed row(s) {bad[:5]} (data row numbers, header = 1): "
                         f"field count differs from the header's {len(cols)}")
    return rows, cols


def check_image_size(value: Any, name: str = "image_size", max_size: Optional[int] = None) -> int:
    """``value`` as an int when it is a valid image side in pixels: a Python / numpy integer >= 1
    (and <= ``max_size`` when given; a bool, float or str is not coerced). Raises ValueError
    naming ``name`` and the allowed range otherwise (0 or a negative side would fail deep inside
    the image resizing, blaming an image)."""
    hi = "" if max_size is None else f" and <= {max_size}"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1 or \
            (max_size is not None and value > max_size):
        raise ValueError(f"{name} must be an integer >= 1{hi} (pixels), got {value!r}")
    return int(value)
