"""Issue 24 item 16, first-use frictions: a second demo run does not warn; the printed resume
command is one that works from a shell without the venv active; progress bars do not flood a log
that is not a terminal; a bad --forget names the flag; the comparison figure says what its error
bars are."""
import io
import os
import sys
import warnings

import pytest

from entangle_ext import cli
from entangle_ext.cli import run as cli_run
from entangle_ext.cli.common import PROG, command_prefix


def test_a_second_demo_run_does_not_warn(tmp_path, capsys):
    pytest.importorskip("sklearn")
    from entangle_ext import demo
    args = ["--out", str(tmp_path / "demo"), "--cache", str(tmp_path / "cache"), "--no-progress"]
    demo.main(args)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        demo.main(args)
    assert [str(w.message) for w in rec if "out_dir" in str(w.message) or "OutDir" in w.category.__name__] == []


def test_the_resume_command_works_without_an_active_venv(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))          # no entangle-unlearn on PATH
    assert command_prefix() == [sys.executable, "-m", "entangle_ext"]
    here = os.path.join(os.path.dirname(sys.executable), PROG)
    if os.path.exists(here):                           # the venv's own script on PATH: the short form
        monkeypatch.setenv("PATH", os.path.dirname(sys.executable))
        assert command_prefix() == [PROG]
    other = tmp_path / PROG                            # someone else's entangle-unlearn first on PATH
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert command_prefix() == [sys.executable, "-m", "entangle_ext"]


def test_the_interrupt_message_prints_that_command(monkeypatch, tmp_path, capsys):
    out = tmp_path / "o"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "step1.pt").write_bytes(b"x")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli_run._interrupted(["--setting", "digits", "--out", str(out)], str(out)) == 130
    err = capsys.readouterr().err
    assert f"{sys.executable} -m entangle_ext --setting digits --out {out} --resume {out}" in err


def test_progress_bars_in_a_log_update_at_most_every_30_s(monkeypatch):
    from entangle_ext import _progress
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stderr", buf)            # not a terminal
    with _progress.progress_bar(total=10_000, desc="x", enabled=True, file=buf) as bar:
        for _ in range(10_000):
            bar.update(1)
    assert bar.mininterval == _progress.LOG_INTERVAL_S
    assert buf.getvalue().count("\r") <= 3, buf.getvalue().count("\r")   # start, end (and at most one more)


def test_a_bad_forget_digit_names_the_flag(tmp_path, capsys):
    pytest.importorskip("sklearn")
    assert cli.main(["--setting", "digits", "--forget", "11", "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--forget" in err and "0-9" in err and "11" in err


def test_the_comparison_figure_says_what_its_error_bars_are():
    from entangle_ext.compare_report import error_bar_caption
    three = {"ft": {"acc_forget_test": {"mean": 1.0, "std": 0.5, "n": 3}}}
    assert error_bar_caption(three, ["ft"]) == \
        "bars: mean over 3 seeds; error bars: ± 1 sample standard deviation over the seeds"
    one = {"ft": {"acc_forget_test": {"mean": 1.0, "std": None, "n": 1}}}
    assert error_bar_caption(one, ["ft"]) == "one seed per method: no error bars"


def test_a_resume_of_other_data_is_refused_before_the_original_is_trained(tmp_path, capsys, monkeypatch):
    """A checkpoint of another setting (or other data flags) was noticed only after the original
    model of the new flags had been trained: hours for cifar100 on a CPU, for an error."""
    pytest.importorskip("sklearn")
    from entangle_ext import cli, settings
    out = tmp_path / "run"
    tiny = ["--setting", "digits", "--out", str(out), "--original-epochs", "2", "--epochs", "1", "--stage1-epochs",
            "1", "--batch-limit", "1", "--no-progress"]
    assert cli.main(tiny + ["--max-train-per-class", "10"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(settings, "train_original", lambda *a, **k: pytest.fail("trained before refusing"))
    argv = tiny + ["--max-train-per-class", "12", "--resume", str(out), "--allow-config-change"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"--resume {out}: resume: the splits differ" in err and "another --setting, --variant or data flags" in err
