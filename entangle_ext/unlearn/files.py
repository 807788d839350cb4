"""Reading the torch files a run writes or is given, safely: `read_torch_file` (``torch.load`` with
``weights_only=True``, which runs no code from the file, plus the numpy types of a checkpoint's
``rng`` entry, after the CRC-32 of every record of the file's zip archive is checked: torch writes
them but does not check them on load, so altered bytes inside a tensor would load silently) and
`open_checkpoint` (an out dir, its ``checkpoints/latest.pt`` pointer or a file).
`load_checkpoint` (``resume=``, ``--resume``) and `entangle_ext.train.load_model_file`
(``--original``, the original-model cache) both read through here.

Writing: `atomic_write` — every file the package writes (checkpoints, the latest pointer, the
original-model cache, report/history JSON, plots, comparison tables and cache, split files) goes to
a temporary file beside its target and is renamed over it only when complete; a failed write
(disk full, a file-size limit, permissions) deletes the temporary file and raises a `WriteError`
naming the file, the cause and the free space, plus what to do next.
"""
from __future__ import annotations

import errno as _errno
import os
import re
import shutil
import warnings
import zipfile
import zlib
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple, Union

import numpy as np
import torch

from .._paths import expand_user

__all__ = ["read_torch_file", "stage_label", "open_checkpoint", "POINTER_NAME", "atomic_write", "WriteError", "make_out_dir",
           "warn_unwritten_checkpoints"]

#: The file under ``{out_dir}/checkpoints/`` that names the run's latest checkpoint: {"path": str}.
POINTER_NAME = "latest.pt"


def _numpy_globals() -> List[Any]:
    """What ``np.random.get_state()`` (the ``rng`` entry of every checkpoint) pickles: a uint32
    array. Allowed by name, so no other numpy code can run from the file."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:   # numpy < 2
        from numpy.core.multiarray import _reconstruct
    return [_reconstruct, (_reconstruct, "numpy.core.multiarray._reconstruct"), np.ndarray, np.dtype,
            type(np.dtype(np.uint32))]


def _reason(e: BaseException) -> str:
    """The short cause of a failed ``torch.load``, without PyTorch's advice on ``weights_only``."""
    if isinstance(e, EOFError):
        return "the file is empty or truncated"
    text = str(e)
    m = re.search(r"WeightsUnpickler error:(.*?)(Check the documentation|$)", text, re.S)
    if m:
        text = m.group(1)
    text = re.sub(r"\[enforce fail at [^\]]*\]\s*\.?\s*", "", " ".join(text.split()))   # PyTorch's C++ source position
    if text.startswith("file in archive is not in a subdirectory"):   # a zip, but not torch.save's layout
        return "a zip archive that torch.save did not write (e.g. a numpy .npz)"
    g = re.match(r"Unsupported global: GLOBAL (\S+)", text)
    if g:
        return f"it pickles the Python object {g.group(1)}, which is not loaded (no code from the file is run)"
    first = re.split(r"(?<=[a-z0-9)])\.\s", text, maxsplit=1)[0].rstrip(".")
    if "Unsupported operand" in first:
        return f"not a torch file ({first})"
    return first or type(e).__name__


DAMAGED_ADVICE = ("resume from an earlier checkpoint, or delete the file (a deleted cached original model "
                  "is trained again)")


def _damage(path: Union[str, Path]) -> Union[str, None]:
    """Why the zip archive of a torch file is damaged (None when every record's CRC-32 matches, or
    the file is no zip archive or cannot be read: torch.load then says what it is). One read of
    the file."""
    try:
        if not zipfile.is_zipfile(path):
            return None
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, NotImplementedError) as e:
        return f"its zip archive is inconsistent ({' '.join(str(e).split()) or type(e).__name__})"
    except OSError:
        return None
    return None if bad is None else f"the CRC-32 of its record {bad} does not match"


def stage_label(key) -> str:
    """The name of stage ``key`` in reports and checkpoint files: "stage1" / "stage2" for the
    two-stage family's 1 / 2, a baseline's key (its name) as it is ("salun_step000005.pt")."""
    return f"stage{key}" if isinstance(key, int) else str(key)


def read_torch_file(path: Union[str, Path], map_location: Any = "cpu") -> Any:
    """``torch.load(path, map_location, weights_only=True)``: tensors, numbers, strings, containers
    and the numpy arrays of a checkpoint's RNG state; no code from the file is run. The CRC-32 of
    every record is checked first (`zipfile.ZipFile.testzip`), so a damaged file is refused before
    anything is read from it.

    Raises:
        ValueError: the file is damaged (a record's bytes differ from those written), corrupt,
            truncated, not a torch file or pickles other Python objects; one line, "<path> is not
            a readable torch file (state dict or entangle_ext checkpoint): <short reason>".
    """
    damage = _damage(path)
    if damage is not None:
        raise ValueError(f"{path} is not a readable torch file (state dict or entangle_ext checkpoint): "
                         f"the file is damaged ({damage}); {DAMAGED_ADVICE}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # torch's note on the pickle protocol of a non-torch file
            with torch.serialization.safe_globals(_numpy_globals()):
                return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:   # any failure to unpickle: corrupt, truncated, foreign objects, I/O
        reason = _reason(e) if _is_zip(path) or isinstance(e, EOFError) else (
            "not a torch file: no zip archive as torch.save writes, nor a legacy torch pickle (truncated, "
            "or another format)")
        raise ValueError(f"{path} is not a readable torch file (state dict or entangle_ext "
                         f"checkpoint): {reason}") from None


def _is_zip(path) -> bool:
    try:
        return zipfile.is_zipfile(path)
    except OSError:
        return False


def _is_pointer(obj: Any) -> bool:
    return isinstance(obj, dict) and set(obj) == {"path"} and isinstance(obj["path"], str)


def _follow(pointer: Path, stored: str) -> Path:
    """The checkpoint a ``latest.pt`` names: the file of that name beside the pointer (where the
    run wrote it, also after the out dir moved or was copied). Never the stored path itself: it is
    relative to the writer's working directory, so in a copied out dir without that file it named
    another run's checkpoint, which a resume then continued silently."""
    cand = pointer.parent / Path(stored).name
    if cand.is_file():
        return cand
    raise FileNotFoundError(f"{pointer} points to the checkpoint {stored}, which does not exist beside it ({cand})")


def open_checkpoint(path: Union[str, Path], map_location: Any = "cpu") -> Tuple[Path, Any]:
    """Read a checkpoint (or any torch file) given as a file, a ``latest.pt`` pointer (followed),
    or an out dir / its ``checkpoints/`` dir (its latest checkpoint); a leading ``~`` in ``path``
    is the home directory.

    Returns:
        (the file read, its content).
    Raises:
        FileNotFoundError: no such file, no checkpoint under the directory, or a pointer to a
            missing file. ValueError: an unreadable file, see `read_torch_file`.
    """
    p = Path(expand_user(path))
    if p.is_dir():
        for cand in (p / "checkpoints" / POINTER_NAME, p / POINTER_NAME):
            if cand.is_file():
                p = cand
                break
        else:
            raise FileNotFoundError(f"no checkpoint under {path} (no checkpoints/{POINTER_NAME})")
    if not p.is_file():
        raise FileNotFoundError(f"{p} not found")
    obj = read_torch_file(p, map_location)
    if _is_pointer(obj):
        p = _follow(p, obj["path"])
        obj = read_torch_file(p, map_location)
    return p, obj


def check_out_dir_type(out_dir: Any, what: str = "out_dir") -> None:
    """TypeError unless ``out_dir`` is None, a str or an ``os.PathLike`` (checked before any use
    of it, so a wrong type is not a pathlib error from deep inside a run); ValueError for an
    empty path ("", which pathlib reads as the current directory: a run would write its files
    there unasked)."""
    if out_dir is not None and not isinstance(out_dir, (str, os.PathLike)):
        raise TypeError(f"{what} must be a path (str or os.PathLike) or None, got "
                        f"{type(out_dir).__name__} {out_dir!r}")
    if out_dir is not None and os.fspath(out_dir) == "":
        raise ValueError(f"{what} is an empty path: pass None for no files, or a folder ('.' for the current "
                         "directory)")


def warn_unwritten_checkpoints(config, out_dir) -> None:
    """A UserWarning when ``config.checkpoint_every`` > 0 asks for mid-run checkpoints that no
    ``out_dir`` (None) will receive: the field would be silently ignored."""
    every = getattr(config, "checkpoint_every", 0)
    if out_dir is None and isinstance(every, int) and every > 0:
        warnings.warn(f"{type(config).__name__}.checkpoint_every={every} asks for a checkpoint every {every} "
                      "steps, but out_dir is None: no checkpoint is written (pass out_dir=... to keep them)",
                      UserWarning, stacklevel=4)   # the caller of entangle_ext.unlearn


def make_out_dir(out_dir: Union[str, "os.PathLike[str]"], what: str = "out_dir") -> Path:
    """``out_dir`` as a `Path` (a leading ``~`` is the home directory), created with its parents
    when missing: the one check of every output folder a run, a comparison or a cache writes into
    (``what`` names it in messages, e.g. "--out" on the command line).

    Raises:
        TypeError: ``out_dir`` is not a str or ``os.PathLike`` (e.g. an int).
        ValueError: it exists and is not a directory; it cannot be created (a parent is a file,
            no permission, a read-only file system: the OS's reason is given); it is not
            writable by this user.
    """
    check_out_dir_type(out_dir, what)
    out = Path(expand_user(out_dir))   # "~/runs": the home directory
    if out.exists() and not out.is_dir():
        raise ValueError(f"{what} {str(out)!r} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{what} {str(out)!r} cannot be created: {e.strerror or e}"
                         + (f" ({e.filename})" if e.filename and str(e.filename) != str(out) else "")) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {str(out)!r} is not writable by this user")
    return out


class WriteError(OSError):
    """A file could not be written (`atomic_write`); ``errno`` is the cause's when known. The
    target is unchanged (or absent) and no temporary file is left."""


def _free_space(folder: Path) -> str:
    try:
        return f"{shutil.disk_usage(folder).free / 2**20:.1f} MiB free in {folder}"
    except OSError:
        return f"free space in {folder} unknown"


def _likely_errno(tmp: Path) -> Optional[int]:
    """The OS error behind a write that torch reported only as its zip writer's RuntimeError:
    EFBIG when the partial file reached this process's file-size limit (RLIMIT_FSIZE), ENOSPC
    when its file system has (almost) no free space left, else None."""
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        size = tmp.stat().st_size if tmp.exists() else 0
        if soft != resource.RLIM_INFINITY and size + 2**16 >= soft:
            return _errno.EFBIG
    except (ImportError, OSError, ValueError):
        pass
    try:
        if shutil.disk_usage(tmp.parent).free < 2**20:
            return _errno.ENOSPC
    except OSError:
        pass
    return None


def _make_parent(path: Path) -> None:
    """Create the folder of ``path`` with its parents. Raises OSError; a file where a folder must
    be is a NotADirectoryError naming that file and the fix (mkdir said "File exists" or "Not a
    directory" of the folder it tried)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        in_way = next((p for p in (path.parent, *path.parent.parents) if p.exists() and not p.is_dir()), None)
        if in_way is None:
            raise
        raise NotADirectoryError(_errno.ENOTDIR, f"{in_way} is a file, not a folder (move it away or choose "
                                 "another path)") from e


def atomic_write(path: Union[str, Path], write: Callable[[Path], Any], *, what: str,
                 hint: Optional[str] = None, parents: bool = False) -> Path:
    """``write(tmp)`` to a temporary file beside ``path`` (one per process), then rename it over
    ``path`` (atomic on one file system): a reader sees the old file or the new one, never half.

    Args:
        path: the target file. write: writes the whole content to the path it is given.
        what: what the file is, for the error (e.g. "checkpoint"). hint: what to do next (e.g. the
            resume command), appended to the error. parents: create the folder of ``path`` (with
            its parents) first; a folder that cannot be created is a `WriteError` too.
    Returns:
        ``path`` as a `Path`.
    Raises:
        WriteError (an OSError): the write or the rename failed (OSError, or torch's RuntimeError
        from its zip writer), or (``parents``) the folder could not be created (a file in the way,
        no permission); the temporary file is deleted first. The message names the file, the
        cause (errno and text when the OS gave one, and the path the OS named when it is another
        one), the free space and ``hint``.
    """
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        if parents:
            _make_parent(path)
        write(tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        code = e.errno if isinstance(e, OSError) else _likely_errno(tmp)
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        text = (e.strerror if isinstance(e, OSError) and e.strerror else str(e).strip().splitlines()[0]
                if str(e).strip() else type(e).__name__)
        if isinstance(e, OSError) and e.filename and str(e.filename) not in (str(tmp), str(path)):
            text += f": {e.filename}"   # e.g. the folder that could not be created
        if code is not None and not isinstance(e, OSError):   # torch's zip writer hides the OS error
            text = f"{os.strerror(code)}; torch said: {text}"
        cause = f"{_errno.errorcode.get(code, code)}: {text}" if code is not None else text
        err = WriteError(f"could not write the {what} {path} ({cause}; {_free_space(path.parent)})"
                         + (f"; {hint}" if hint else ""))
        err.errno = code
        raise err from e
    return path
