"""An interrupted command exits with 128 + the number of the signal that stopped it, the shell's
convention: 130 Ctrl-C (SIGINT), 143 SIGTERM, 129 SIGHUP. It was 130 for every signal, so a job
scheduler or a shell script could not tell a kill from a Ctrl-C. Also: SIGHUP (a closed terminal)
stops a run at a step boundary with a checkpoint, as SIGTERM does, unless ignored (``nohup``)."""
import importlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from entangle_ext import RunInterrupted, cli
from entangle_ext.cli.common import SignalInterrupt, interrupt_exit_code

from _support import REPO_ROOT, hup_default as hup_at_default

SIGNALS = [n for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n)]
KILLS = [n for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n)]
TINY = ["--max-train-per-class", "10", "--original-epochs", "2", "--no-progress", "--device", "cpu"]


@pytest.mark.parametrize("name", SIGNALS)
def test_the_exit_code_is_128_plus_the_signal_number(name):
    num = int(getattr(signal, name))
    assert interrupt_exit_code(SignalInterrupt(num)) == 128 + num
    assert interrupt_exit_code(RunInterrupted(1, 3, name, None, None)) == 128 + num
    assert str(SignalInterrupt(num)) == name


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), RunInterrupted(2, 0, "KeyboardInterrupt", None, None),
                                 RunInterrupted(1, 0, "signal on another rank", None, None)])
def test_an_interrupt_of_no_known_signal_exits_130(exc):
    assert interrupt_exit_code(exc) == 130


@pytest.fixture
def hup_default():
    with hup_at_default():
        yield


def _signalled(name):
    """A stand-in for the work of a command that sends itself signal ``name`` and waits for it."""
    def work(*a, **k):
        signal.raise_signal(getattr(signal, name))
        time.sleep(30)
        raise AssertionError(f"{name} did not interrupt the command")
    return work


@pytest.mark.parametrize("name", KILLS)
def test_the_run_command_exits_with_the_signal_code(tmp_path, capsys, monkeypatch, hup_default, name):
    pytest.importorskip("sklearn")
    monkeypatch.setattr(importlib.import_module("entangle_ext.unlearn.entry"), "unlearn", _signalled(name))
    rc = cli.main(["--setting", "digits", "--out", str(tmp_path), *TINY])
    assert rc == 128 + int(getattr(signal, name))
    assert "interrupted" in capsys.readouterr().err


@pytest.mark.parametrize("name", KILLS)
def test_the_compare_command_exits_with_the_signal_code(tmp_path, capsys, monkeypatch, hup_default, name):
    monkeypatch.setattr(importlib.import_module("entangle_ext.cli.compare"), "_compare", _signalled(name))
    rc = cli.main(["compare", "--setting", "digits", "--methods", "ga", "--seeds", "1", "--out", str(tmp_path),
                   "--no-progress"])
    assert rc == 128 + int(getattr(signal, name))
    assert "interrupted; no run had finished" in capsys.readouterr().err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals to a child process")
@pytest.mark.parametrize("name", KILLS)
def test_a_signal_during_stage2_checkpoints_and_exits_with_its_code(tmp_path, name):
    """The real command in a child process: the signal arrives during Stage 2 (after Stage 1's
    checkpoint exists); the run stops at a step boundary, writes that step's checkpoint, prints the
    resume command and exits 143 / 129. SIGHUP was not handled at all: the process died at once."""
    pytest.importorskip("sklearn")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "entangle_ext", "--setting", "digits", "--out", str(out), *TINY,
           "--stage1-epochs", "1", "--epochs", "100000", "--threads", "1"]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 240
        while not list((out / "checkpoints").glob("stage1_*.pt")):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "Stage 1 did not finish in 240 s"
            time.sleep(0.2)
        time.sleep(0.5)
        proc.send_signal(getattr(signal, name))
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + int(getattr(signal, name)), err
    assert "Traceback" not in err and "--resume" in err.strip().splitlines()[-1]
    assert list(Path(out, "checkpoints").glob("stage2_*.pt")), err
