"""`IndexSplit` (three disjoint index lists with targets and a provenance ``meta``) and its files:
`save_split` writes it as JSON with a SHA-256 content hash (`split_hash`), `load_split` reads one
back and verifies the hash. The builders that make one are in `entangle_ext.splits`, which
re-exports every name here."""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Union

from ._paths import expand_user
from ._split_checks import index_list
from .unlearn.files import atomic_write

__all__ = ["IndexSplit", "SPLIT_FORMAT", "split_hash", "save_split", "load_split"]

SPLIT_FORMAT = "entangle_ext.split/1"


def _few(indices: List[int]) -> str:
    """Up to 5 of the sorted ``indices`` for a message, and how many there are beyond them."""
    more = f" and {len(indices) - 5} more" if len(indices) > 5 else ""
    return ", ".join(map(str, indices[:5])) + more


@dataclass
class IndexSplit:
    """Forget / adjacent / remote index lists of one data partition (e.g. the train set).

    Each index sequence given (a list, tuple, range, 1-D integer numpy array or tensor; entries
    Python ints, numpy integers or 0-d integer tensors) is stored as a list of Python ints, so that
    the checks, the hash and the file see plain integers.

    Attributes:
        forget, adjacent, remote: sorted lists of int sample indices, pairwise disjoint.
        targets: None, or a list with one int label per sample of the *whole* indexed array
            (length = ``meta["n"]``): the label the model trains on / is evaluated against
            (coarse label; for ToxiGen the flipped label on forget samples). Samples in none of the
            three lists keep a target too (they are simply unused).
        meta: JSON-serialisable description (builder name, arguments, class names, sizes).
    Raises:
        ValueError: (at construction) an index list or ``targets`` that is not such a sequence (a
            set, a str, a 2-D array) or holds an entry that is not an integer (a bool, float, str).
    """
    forget: List[int]
    adjacent: List[int]
    remote: List[int]
    targets: Optional[List[int]] = None
    meta: Dict[str, Any] = field(default_factory=dict)

    NAMES = ("forget", "adjacent", "remote")

    def __post_init__(self) -> None:
        for n in self.NAMES:
            setattr(self, n, index_list(getattr(self, n), f"split {n!r}"))
        if self.targets is not None:
            self.targets = index_list(self.targets, "targets")

    def sizes(self) -> Dict[str, int]:
        """{"forget": n_f, "adjacent": n_adj, "remote": n_rem}."""
        return {n: len(getattr(self, n)) for n in self.NAMES}

    def check(self) -> None:
        """Raise ValueError if a list is not a sequence of integers (Python ints, numpy integers or
        0-d integer tensors; a bool, float or str is refused, not coerced), if the lists overlap,
        hold duplicates or a negative index, if the forget list is empty, or if ``targets`` (None
        or a sequence of integers) does not cover every index. Lists assigned after construction
        are checked as the constructor reads them."""
        seen: Dict[str, set] = {}
        for n in self.NAMES:
            lst = index_list(getattr(self, n), f"split {n!r}")
            s = set(lst)
            if len(s) != len(lst):
                twice = sorted(i for i, c in Counter(lst).items() if c > 1)
                raise ValueError(f"split {n!r} holds duplicate indices ({_few(twice)})")
            if lst and min(lst) < 0:
                raise ValueError(f"split {n!r} holds negative indices ({_few(sorted(i for i in s if i < 0))})")
            for other, t in seen.items():
                if s & t:
                    raise ValueError(f"splits {other!r} and {n!r} share indices ({_few(sorted(s & t))}): a "
                                     "sample may be in one split only")
            seen[n] = s
        seen = set().union(*seen.values())
        if not len(self.forget):
            raise ValueError("the forget split is empty")
        targets = None if self.targets is None else index_list(self.targets, "targets")
        if not isinstance(self.meta, dict):
            raise ValueError(f"meta must be a dict, got {type(self.meta).__name__}")
        if targets is not None and seen and max(seen) >= len(targets):
            raise ValueError("targets is shorter than the largest split index")

    def to_dict(self) -> Dict[str, Any]:
        """Plain-JSON content (without the hash)."""
        return {"format": SPLIT_FORMAT, "forget": list(map(int, self.forget)),
                "adjacent": list(map(int, self.adjacent)), "remote": list(map(int, self.remote)),
                "targets": None if self.targets is None else list(map(int, self.targets)),
                "meta": self.meta}

    def hash(self) -> str:
        """SHA-256 hex digest of the canonical JSON content (see `split_hash`)."""
        return split_hash(self.to_dict())


def split_hash(content: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of ``json.dumps(content, sort_keys=True, separators=(",", ":"))``, ignoring a
    ``"sha256"`` key. Used by `save_split` / `load_split`."""
    c = {k: v for k, v in content.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(c, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def save_split(path: Union[str, Path], split: IndexSplit) -> str:
    """Write ``split`` to ``path`` (a leading ``~`` is the home directory) as JSON with its content
    hash; returns the hash.

    Raises ValueError when the split is inconsistent (`IndexSplit.check`) or ``meta`` is not
    JSON-serialisable; `entangle_ext.WriteError` naming ``path`` when it cannot be
    written, its missing folders included (a file where a folder must be, no permission, disk full).
    """
    split.check()
    d = split.to_dict()
    try:
        d["sha256"] = split_hash(d)
    except TypeError as e:
        raise ValueError(f"split meta must be JSON-serialisable: {e}") from e
    path = Path(expand_user(path))
    text = json.dumps(d, sort_keys=True)
    atomic_write(path, lambda tmp: tmp.write_text(text), what="split file", parents=True)
    return d["sha256"]


def load_split(path: Union[str, Path]) -> IndexSplit:
    """Read a split written by `save_split` from ``path`` (a leading ``~`` is the home directory)
    and verify it.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: not UTF-8 text, not JSON, not a split file, missing hash or one that is not a
            string, hash mismatch (the file was edited or corrupted), a list, ``targets`` or
            ``meta`` of the wrong type (e.g. a number or a dict for a list), or inconsistent lists (entries that are not integers,
            e.g. "1" or 1.5, overlapping lists, ... `IndexSplit.check`); every message names the file.
    """
    path = Path(expand_user(path))
    if not path.is_file():
        raise FileNotFoundError(f"no split file at {path}")
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not a split file: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(d, dict) or d.get("format") != SPLIT_FORMAT:
        raise ValueError(f"{path} is not an entangle_ext split file (format {SPLIT_FORMAT!r})")
    if "sha256" not in d:
        raise ValueError(f"{path} has no sha256 content hash")
    if not isinstance(d["sha256"], str):
        raise ValueError(f"{path}: the sha256 content hash must be a hex string, got "
                         f"{type(d['sha256']).__name__} {d['sha256']!r}")
    h = split_hash(d)
    if h != d["sha256"]:
        raise ValueError(f"{path}: content hash mismatch (stored {d['sha256'][:12]}…, computed {h[:12]}…); "
                         "the split file was modified after it was saved")
    missing = [k for k in IndexSplit.NAMES + ("targets",) if k not in d]
    if missing:
        raise ValueError(f"{path} is not a complete split file: missing {missing}")
    try:
        s = IndexSplit(forget=d["forget"], adjacent=d["adjacent"], remote=d["remote"], targets=d["targets"],
                       meta=d.get("meta", {}))
        s.check()
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return s
