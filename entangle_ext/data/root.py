"""Where the data sets are: one lookup shared by every loader.

Data directories, in lookup order (`data_dirs`):

1. an explicit path passed by the caller (``--data-root`` on the command line): only that one;
2. otherwise the ``ENTANGLE_DATA`` environment variable (``ENTANGLE_SHARED_DATA`` is an older alias,
   looked at after it);
3. the user cache directory ``$XDG_CACHE_HOME/entangle_ext/data`` (``~/.cache/entangle_ext/data``
   when XDG_CACHE_HOME is unset);
4. ``../shared/data`` next to the repository, only when the package runs from a source checkout (an
   installed copy in site-packages has no repository around it and skips this place).

`find_data_file` returns the first match of a file or directory name in these places and raises
FileNotFoundError naming every place it looked at, and every broken symbolic link it met at a
candidate path (with its missing target).

The environment variables are not authoritative: a place without the data falls through to the
next one. So that a mistyped or stale variable is not silently bypassed, `data_dirs` warns
(`DataDirWarning`, once per variable and value) when ``ENTANGLE_DATA`` / ``ENTANGLE_SHARED_DATA``
is set but is not an existing directory, and `find_data_file` warns (once per name and
place) when the data are taken from a later place although such a variable is set. `read_npz` is the one reader of ``.npz`` archives
with expected keys: a wrong or corrupt file gives a ValueError naming the file and what is wrong.
"""
from __future__ import annotations

import os
import warnings
import zipfile
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

import numpy as np

from .._paths import expand_user, user_cache_dir

__all__ = ["data_dirs", "data_root", "find_data_file", "user_cache_dir", "checkout_data_dir", "read_npz",
           "ENV_VARS", "DataDirWarning"]

ENV_VARS = ("ENTANGLE_DATA", "ENTANGLE_SHARED_DATA")
"""Environment variables naming a data directory, in lookup order (the second is an alias)."""

PathLike = Union[str, Path]


class DataDirWarning(UserWarning):
    """A data-directory environment variable is set but was not used: it names no existing
    directory, or the data were found in a later place of the lookup order (module docstring)."""


_warned: Set[Tuple[str, ...]] = set()   # what has been warned about, so each warns once per process


def _warn_once(key: Tuple[str, ...], message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, DataDirWarning, stacklevel=3)


def _warn_env_bypassed(places: Sequence[Tuple[str, Path]], used: Path, what: str) -> None:
    """Warn when ``used`` comes after a place named by an environment variable (that place lacks ``what``)."""
    for origin, p in places:
        if p == used:
            return
        if origin.startswith("$") and p.is_dir():
            _warn_once(("skipped", origin, str(p), what, str(used)),
                       f"{origin[1:]}={p} has no {what}; using {used} (a later place of the data lookup)")


def checkout_data_dir() -> Optional[Path]:
    """The ``shared/data`` folder beside the repository (relative to it) when this package is
    imported from a source checkout (the directory above ``entangle_ext/`` holds this project's
    ``pyproject.toml``), else None."""
    repo = Path(__file__).resolve().parents[2]
    pyproject = repo / "pyproject.toml"
    try:
        if 'name = "entangle_ext"' not in pyproject.read_text(encoding="utf-8"):
            return None
    except OSError:
        return None
    return repo.parent / "shared" / "data"


def data_dirs(explicit: Optional[PathLike] = None) -> List[Tuple[str, Path]]:
    """The places data is looked for, in order, as ``(origin, path)`` pairs (module docstring);
    the paths need not exist. With ``explicit`` only ``[("argument", explicit)]``.

    Warns:
        DataDirWarning: (once per variable and value) ``ENTANGLE_DATA`` or
        ``ENTANGLE_SHARED_DATA`` is set but is not an existing directory; it stays in the list
        (so a FileNotFoundError still names it) but holds nothing."""
    if explicit is not None:
        return [("argument", Path(expand_user(explicit)))]
    out = [(f"${v}", Path(expand_user(os.environ[v]))) for v in ENV_VARS if os.environ.get(v)]
    for origin, p in out:
        if not p.is_dir():
            _warn_once(("missing", origin, str(p)),
                       f"{origin[1:]}={p} is not an existing directory" + (" (it is a file)" if p.exists() else "")
                       + "; it is skipped and the data are looked for in the next places (fix or unset it)")
    out.append(("user cache", user_cache_dir() / "data"))
    repo = checkout_data_dir()
    if repo is not None:
        out.append(("source checkout", repo))
    return out


def data_root(explicit: Optional[PathLike] = None) -> Path:
    """The first existing directory of `data_dirs` (``explicit`` when given).

    Raises:
        FileNotFoundError: none exists; the message names every place looked at.
    """
    places = data_dirs(explicit)
    for _, p in places:
        if p.is_dir():
            return p
    raise FileNotFoundError("no data directory: " + _describe(places)
                            + "; pass a path, or set ENTANGLE_DATA")


def find_data_file(names: Union[str, Sequence[str]], explicit: Optional[PathLike] = None, *,
                   is_data: Optional[Callable[[Path], bool]] = None, what: Optional[str] = None) -> Path:
    """The first ``name`` (a file or directory, relative to a data directory) found in the places of
    `data_dirs`, trying every name in one place before moving to the next place.

    Args:
        names: one relative name or several alternatives (e.g. ``("cifar100.npz", "cifar-100-python")``).
        explicit: a directory to look in instead of the default places, or the data itself.
        is_data: ``is_data(path) -> bool``: whether a place is itself the data (e.g. an explicit
            ``.npz`` file with another name); checked before the names.
        what: a label for the error message (default: the names).
    Returns:
        The path found (may be a file or a directory).
    Raises:
        FileNotFoundError: nothing found; the message lists every name and every place looked at,
            and names each broken symbolic link met at a candidate path (a place, or a name in
            one) with the target it points to, which does not exist.
    Warns:
        DataDirWarning: as `data_dirs`; and (once per name and place) when the data are found in a
        place after an existing directory named by ``ENTANGLE_DATA`` / ``ENTANGLE_SHARED_DATA``
        (which lacks them): the message names the variable and the place used.
    """
    names = [names] if isinstance(names, str) else list(names)
    places = data_dirs(explicit)
    label = what or " or ".join(names)
    broken: List[str] = []
    for _, place in places:
        if is_data is not None and place.exists() and is_data(place):
            _warn_env_bypassed(places, place, label)
            return place
        broken += _broken_link(place)
        for n in names:
            if (place / n).exists():
                _warn_env_bypassed(places, place, label)
                return place / n
            broken += _broken_link(place / n)
    raise FileNotFoundError(f"no {label} found: looked for {' / '.join(names)} in " + _describe(places)
                            + ("" if explicit is not None else "; pass a path, or set ENTANGLE_DATA")
                            + ("" if not broken else "; broken symbolic link(s): " + ", ".join(broken)
                               + " (the target does not exist: fix the link or put the data at its target)"))


def _broken_link(p: Path) -> List[str]:
    """``["<p> -> <target>"]`` when ``p`` is a symbolic link whose target does not exist, else []."""
    try:
        if p.is_symlink() and not p.exists():
            return [f"{p} -> {os.readlink(p)}"]
    except OSError:   # no permission to look: not reported as broken
        pass
    return []


def _describe(places: Sequence[Tuple[str, Path]]) -> str:
    return ", ".join(f"{p} ({origin})" for origin, p in places)


def read_npz(path: PathLike, keys: Sequence[str], what: str) -> Dict[str, np.ndarray]:
    """The arrays ``keys`` of the ``.npz`` archive at ``path``, read without pickles
    (``allow_pickle=False``).

    Args:
        path: the archive. keys: the keys the data set needs. what: the data set's name for messages
            (e.g. "CIFAR-100").
    Returns:
        {key: numpy array} for every key in ``keys``.
    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: ``path`` is a directory, not a zip archive (truncated, text, a single ``.npy``),
            lacks some of ``keys`` (the message lists them and the keys it has), or an entry cannot
            be read (corrupt, object arrays); every message names the file.
    """
    p = Path(expand_user(path))
    if not p.exists():
        raise FileNotFoundError(f"no {what} archive at {p}")
    if p.is_dir():
        raise ValueError(f"{p} is a directory, not a {what} .npz archive")
    if not zipfile.is_zipfile(p):
        raise ValueError(f"{p} is not a {what} .npz archive: not a zip file (truncated, or another format)")
    try:
        with np.load(p, allow_pickle=False) as z:
            missing = [k for k in keys if k not in z.files]
            if missing:
                raise ValueError(f"{p} is not a {what} archive: missing keys {missing} "
                                 f"(it has {sorted(z.files)[:12]})")
            return {k: z[k] for k in keys}
    except (OSError, EOFError, zipfile.BadZipFile, ValueError) as e:
        if str(p) in str(e):
            raise
        raise ValueError(f"{p} is not a readable {what} archive: {type(e).__name__}: {e}") from e
