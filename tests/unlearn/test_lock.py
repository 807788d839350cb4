"""One live run per out dir (issue 24 item 7): a run locks its out dir (``OUT/.entangle_ext.lock``,
an flock the kernel drops when the holder dies), a second live run into it is refused with a
clear error before any training, and a dead holder leaves no stale lock."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import entangle_ext as ee
from entangle_ext import cli
from entangle_ext import settings as settings_mod
from entangle_ext.unlearn.lock import LOCK_NAME, OutDirInUseError, out_dir_lock

from _tiny import mlp, params, tiny_config
from _support import REPO_ROOT

ROOT = REPO_ROOT
needs_ext = pytest.mark.skipif(not ee.available(), reason="extension not loaded")
HOLD = ("import sys, time\n"
        "from entangle_ext.unlearn.lock import out_dir_lock\n"
        "with out_dir_lock(sys.argv[1]):\n"
        "    print('locked', flush=True)\n"
        "    time.sleep(600)\n")


def _holder(out: Path) -> subprocess.Popen:
    """A child process that takes the lock of ``out`` through the package's helper, then sleeps."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    line = p.stdout.readline()
    if line.strip() != "locked":
        p.kill()
        pytest.fail(f"the lock holder did not start: {line!r} {p.stderr.read()}")
    return p


def _kill(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    p.stdout.close()
    p.stderr.close()


@pytest.fixture(scope="module")
def held(tmp_path_factory):
    """(a dir locked by a live child process, its pid)."""
    out = tmp_path_factory.mktemp("held")
    p = _holder(out)
    yield out, p.pid
    _kill(p)


def _refused(e: BaseException, out: Path, pid: int) -> None:
    msg = str(e)
    assert isinstance(e, ValueError) and isinstance(e, ee.OutDirInUseError)
    assert f"out dir {out} is in use by another live run (pid {pid} on host {socket.gethostname()} since" in msg
    assert "out_dir_lock" in msg and "wait for it, or choose another out dir (--out)" in msg, msg


def _no_run_files(out: Path) -> None:
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]   # nothing of a run was written


# ------------------------------------------------------------------------------------ unlearn
@needs_ext
def test_unlearn_into_a_dir_held_by_a_live_run_is_refused_before_any_training(held, small):
    out, pid = held
    model = mlp()
    before = params(model).clone()
    with pytest.raises(OutDirInUseError) as e:
        ee.unlearn(model, small, tiny_config(), out_dir=out, progress=False)
    _refused(e.value, out, pid)
    assert torch.equal(params(model), before)
    _no_run_files(out)


def test_a_baseline_into_a_held_dir_is_refused_before_any_training(held, small):
    out, pid = held
    model = mlp()
    before = params(model).clone()
    with pytest.raises(OutDirInUseError) as e:
        ee.unlearn(model, small, method="ft", setting="digits", out_dir=out, progress=False)
    _refused(e.value, out, pid)
    assert torch.equal(params(model), before)
    from entangle_ext.methods import run_method   # the baseline runner called directly
    from entangle_ext.unlearn.method import get_method
    with pytest.raises(OutDirInUseError):
        run_method(get_method("ft"), model, small, setting="digits", out_dir=out, progress=False)
    assert torch.equal(params(model), before)
    _no_run_files(out)


@needs_ext
def test_a_killed_holder_leaves_no_stale_lock(tmp_path, small):
    p = _holder(tmp_path)
    with pytest.raises(OutDirInUseError, match=f"pid {p.pid} "):
        ee.unlearn(mlp(), small, tiny_config(), out_dir=tmp_path, progress=False)
    _kill(p)                                                        # SIGKILL: no cleanup ran
    assert (tmp_path / LOCK_NAME).exists()                          # its lock file is left behind ...
    res = ee.unlearn(mlp(), small, tiny_config(), out_dir=tmp_path, progress=False)   # ... and is no obstacle
    assert (tmp_path / "report.json").exists() and res.report["evals"]["final"]
    assert not (tmp_path / LOCK_NAME).exists()                      # released (removed) on return


@needs_ext
@pytest.mark.filterwarnings("ignore::entangle_ext.OutDirReusedWarning")
def test_sequential_runs_into_one_dir_and_a_resume_all_succeed(tmp_path, small):
    for method in ("two_stage", "two_stage", "ft"):
        cfg = tiny_config() if method == "two_stage" else None
        ee.unlearn(mlp(), small, cfg, method=method, setting=None if cfg else "digits", out_dir=tmp_path,
                   progress=False)
        assert not (tmp_path / LOCK_NAME).exists()
    ee.unlearn(mlp(), small, method="ft", resume=tmp_path, out_dir=tmp_path, progress=False)
    assert json.loads((tmp_path / "report.json").read_text())["resume"]["from"]
    # a run that fails after the lock was taken (here: a NaN loss in Stage 1) releases it too
    from _tiny import NaNAfter
    with pytest.raises(ee.NonFiniteLossError):
        ee.unlearn(NaNAfter(0), small, tiny_config(), out_dir=tmp_path, progress=False)
    assert not (tmp_path / LOCK_NAME).exists()
    with out_dir_lock(tmp_path):                                    # and the dir is free again
        pass


def test_the_lock_is_reentrant_in_one_thread_and_refuses_another_thread(tmp_path):
    with out_dir_lock(tmp_path):
        with out_dir_lock(tmp_path / "."):                         # the same dir, this thread: nested
            pass
        assert (tmp_path / LOCK_NAME).exists()                      # still held by the outer block
        info = json.loads((tmp_path / LOCK_NAME).read_text())
        assert info["pid"] == os.getpid() and info["host"] == socket.gethostname() and info["command"]
        seen = []

        def other():
            try:
                with out_dir_lock(tmp_path):
                    seen.append("taken")
            except OutDirInUseError as e:
                seen.append(str(e))
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert "another thread of this process" in seen[0], seen
    assert not (tmp_path / LOCK_NAME).exists()
    with out_dir_lock(tmp_path / "sub"):                            # a subdir is another dir
        with out_dir_lock(tmp_path):
            pass


def test_keyboard_interrupt_releases_the_lock(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with out_dir_lock(tmp_path):
            raise KeyboardInterrupt
    p = _holder(tmp_path)                                           # another process can take it now
    _kill(p)


# ------------------------------------------------------------------------------ command lines
def _no_prepare(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("prepare() was reached: the out dir was not checked first")
    monkeypatch.setattr(settings_mod, "prepare", boom)


def _one_line(err: str, prog: str, out: Path, pid: int) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: out dir {out} is in use by another live run "
                                                   f"(pid {pid} on host "), err
    assert "Traceback" not in err


@pytest.mark.parametrize("method", ["two_stage", "ft"])
def test_cli_into_a_held_out_is_one_line_exit_2_before_any_data(held, capsys, monkeypatch, method):
    out, pid = held
    _no_prepare(monkeypatch)
    rc = cli.main(["--setting", "digits", "--out", str(out), "--device", "cpu", "--method", method,
                   "--no-progress"])
    assert rc == 2
    _one_line(capsys.readouterr().err, "entangle-unlearn", out, pid)
    _no_run_files(out)


def test_compare_into_a_held_out_is_refused(held, small, capsys, monkeypatch):
    out, pid = held
    model = mlp()
    with pytest.raises(OutDirInUseError) as e:
        ee.compare(model, small, ["ft"], seeds=[0], setting="digits", out_dir=out, relearn=False, progress=False)
    _refused(e.value, out, pid)
    _no_run_files(out)
    _no_prepare(monkeypatch)
    rc = cli.main(["compare", "--setting", "digits", "--variant", "reduced", "--methods", "ft", "--seeds", "1",
                   "--out", str(out), "--device", "cpu", "--no-progress"])
    assert rc == 2
    _one_line(capsys.readouterr().err, "entangle-unlearn compare", out, pid)
    _no_run_files(out)


@needs_ext
def test_an_unusable_out_dir_is_a_clear_error_before_any_training(tmp_path, small, capsys):
    """A file, a path under a file, a folder that cannot be created and a non-path gave raw
    FileExistsError / NotADirectoryError / PermissionError / pathlib TypeError (and on the command
    line a traceback, exit 1); now a ValueError (TypeError for a non-path) naming the out dir and
    the OS's reason, and one line with exit 2 on the command line."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    model = mlp()
    before = params(model).clone()
    cases = [(afile, ValueError, "exists and is not a directory"),
             (afile / "sub", ValueError, "cannot be created: Not a directory"),
             (123, TypeError, "out_dir must be a path")]
    if os.geteuid() != 0:   # root may write anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        cases.append((ro / "sub", ValueError, "cannot be created: Permission denied"))
    for out, exc, match in cases:
        with pytest.raises(exc, match=match):
            ee.unlearn(model, small, tiny_config(), out_dir=out, progress=False)
        with pytest.raises(exc, match=match):
            ee.unlearn(model, small, method="ga", setting="digits", out_dir=out, progress=False)
        with pytest.raises(exc, match=match):
            ee.compare(model, small, ["ga"], seeds=[0], setting="digits", out_dir=out, relearn=False, progress=False)
    assert torch.equal(params(model), before)
    for argv in (["--setting", "digits", "--out", str(afile / "sub"), "--device", "cpu", "--no-progress"],
                 ["compare", "--setting", "digits", "--methods", "ga", "--seeds", "1", "--out", str(afile / "x"),
                  "--device", "cpu", "--no-progress"]):
        capsys.readouterr()
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "cannot be created: Not a directory" in err[0], err
