"""One live run per out dir: `OutDirLock` / `out_dir_lock` take an exclusive ``fcntl.flock`` on
``OUT/.entangle_ext.lock`` before anything is written there, and `OutDirInUseError` refuses a
second run that finds it held.

* Stale-lock aware by construction: the kernel drops a flock when its holder exits, however it
  exits (SIGKILL, out of memory, a crash), so a lock file left behind never blocks a later run.
  The file holds the holder's pid, host, start time and command (for the error message only) and
  is removed on release.
* Re-entrant in one thread of one process: the command line takes the lock on ``--out`` before
  it trains and caches the original model, and the `entangle_ext.unlearn` (or `compare`) it then
  calls finds the lock already its own. Another thread, or another process, is refused.
* Under several ranks (``torchrun``) only rank 0 takes it; every rank learns the outcome through
  one collective (`Dist.any`), so the ranks of one run never refuse each other and all of them
  raise together when another run holds the dir.
* ``compare --jobs N``: the parent process holds the lock on its ``--out``; its workers (which
  only write the per-run cache, atomically) take none.
* Without ``fcntl`` (Windows) there is no lock: runs behave as before.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import shlex
import socket
import sys
import threading
from pathlib import Path
from typing import Dict, Iterator, Optional, Union

try:
    import fcntl
except ImportError:   # Windows: no lock (the package targets Linux)
    fcntl = None

from .files import check_out_dir_type, make_out_dir

__all__ = ["OutDirInUseError", "OutDirLock", "out_dir_lock", "LOCK_NAME"]

#: The lock file under an out dir.
LOCK_NAME = ".entangle_ext.lock"

_HELD: Dict[str, dict] = {}   # realpath of the out dir -> {"fd", "pid", "thread", "count"}
_GUARD = threading.Lock()


class OutDirInUseError(ValueError):
    """Another live run (another process, or another thread of this one) holds the out dir: a
    ValueError, so the command lines print it as their one-line ``error:`` and exit with code 2."""


def _command() -> str:
    argv = getattr(sys, "orig_argv", None) or [sys.executable] + sys.argv
    return " ".join(shlex.quote(str(a)) for a in argv)


def _holder_text(path: Path) -> str:
    try:
        info = json.loads(path.read_text())
        command = " ".join(str(info.get("command", "?")).split())   # one line
        return f"pid {info.get('pid', '?')} on host {info.get('host', '?')} since {info.get('since', '?')}: {command}"
    except (OSError, ValueError, AttributeError):
        return "its pid is not recorded yet"


def _refusal(out: Path, holder: str) -> OutDirInUseError:
    return OutDirInUseError(f"out dir {out} is in use by another live run ({holder}); wait for it, or choose "
                            "another out dir (--out)")


class OutDirLock:
    """The lock of one out dir (None: no dir, nothing to lock). `acquire` takes it (raises
    `OutDirInUseError` when another live run holds it), `release` or leaving the ``with`` block
    gives it back; entering the block does not take it, so a caller can take it after its input
    checks (what `entangle_ext.unlearn` does)."""

    def __init__(self, out_dir: Optional[Union[str, Path]]):
        check_out_dir_type(out_dir)
        self.dir = None if out_dir is None else Path(out_dir)
        self._key: Optional[str] = None

    @property
    def held(self) -> bool:
        return self._key is not None

    def acquire(self, d=None) -> "OutDirLock":
        """Take the lock (once; a second call is a no-op). ``d``: the run's `Dist` (default: the
        one of the run in progress); under several ranks only rank 0 locks and every rank must
        call this (one collective), all of them raising when rank 0 was refused."""
        if self.dir is None or self.held:
            return self
        if d is None:
            from .distributed import current
            d = current()
        err = None
        if d.is_main:
            try:
                self._key = _take(self.dir)
            except OutDirInUseError as e:
                err = e
        if d.active and d.any(err is not None) and err is None:
            if self.held:
                self.release()
            raise _refusal(self.dir, "rank 0 of this run found it held")
        if err is not None:
            raise err
        return self

    def release(self) -> None:
        key, self._key = self._key, None
        if key is not None:
            _give_back(key)

    def __enter__(self) -> "OutDirLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@contextlib.contextmanager
def out_dir_lock(out_dir: Optional[Union[str, Path]], d=None) -> Iterator[OutDirLock]:
    """``with out_dir_lock(OUT):`` holds the lock of ``OUT`` (created if missing) for the block;
    `OutDirInUseError` when another live run holds it. ``d``: as `OutDirLock.acquire`."""
    lock = OutDirLock(out_dir)
    lock.acquire(d)
    try:
        yield lock
    finally:
        lock.release()


def _take(out: Path) -> Optional[str]:
    """Lock ``out`` for this thread; returns the registry key (None without fcntl)."""
    make_out_dir(out)   # a clear ValueError for a path that is a file, cannot be made or written
    if fcntl is None:
        return None
    key = os.path.realpath(out)
    me = (os.getpid(), threading.get_ident())
    with _GUARD:
        held = _HELD.get(key)
        if held is not None and held["pid"] == os.getpid():
            if (held["pid"], held["thread"]) != me:
                raise _refusal(out, f"another thread of this process, pid {os.getpid()}")
            held["count"] += 1
            return key
        path = Path(key) / LOCK_NAME
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise _refusal(out, _holder_text(path)) from None
            try:   # the file may have been removed (released) between our open and our flock
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "since": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "command": _command()}
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(info) + "\n").encode())
        _HELD[key] = {"fd": fd, "pid": me[0], "thread": me[1], "count": 1}
        return key


def _give_back(key: str) -> None:
    with _GUARD:
        held = _HELD.get(key)
        if held is None or held["pid"] != os.getpid():
            return
        held["count"] -= 1
        if held["count"] > 0:
            return
        del _HELD[key]
        try:   # removed while still locked, so no other run can be holding this file
            os.unlink(Path(key) / LOCK_NAME)
        except OSError:
            pass
        os.close(held["fd"])
