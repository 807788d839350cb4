"""The original model's flags say what is used: ``--original`` with ``--original-epochs`` or ``--set
train.*`` (which would train the model it loads) is refused, and a ``--resume`` whose original model
is not the one the checkpoint's run started from is refused (the run goes on from the checkpoint, its
original's evaluations included: report.json recorded the new original, which nothing used)."""
import json

import pytest
import torch

import entangle_ext as ee
from entangle_ext import cli

pytestmark = pytest.mark.skipif(not ee.available(), reason="extension not loaded")
CAPS = ["--max-train-per-class", "10", "--no-progress", "--epochs", "1", "--stage1-epochs", "1", "--batch-limit", "1"]


def _argv(out, *extra):
    return ["--setting", "digits", "--out", str(out), "--device", "cpu", "--threads", "1", *CAPS, *extra]


@pytest.mark.parametrize("train", [["--original-epochs", "3"], ["--set", "train.lr=0.5"]])
def test_original_with_a_training_flag_is_refused(tmp_path, capsys, train):
    pytest.importorskip("sklearn")
    from entangle_ext.data.digits import DigitsMLP
    model = tmp_path / "m.pt"
    torch.save(DigitsMLP().state_dict(), model)
    assert cli.main(_argv(tmp_path / "out", "--original", str(model), *train)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--original {model} loads the original model" in err[0] and train[0] in err[0]
    assert not (tmp_path / "out").exists()


def test_a_resume_with_another_original_is_refused(tmp_path, capsys):
    pytest.importorskip("sklearn")
    from entangle_ext.data.digits import DigitsMLP
    out = tmp_path / "out"
    assert cli.main(_argv(out, "--original-epochs", "2")) == 0
    first = json.loads((out / "report.json").read_text())
    capsys.readouterr()
    assert cli.main(_argv(out, "--original-epochs", "3", "--resume", str(out))) == 2   # another trained original
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--resume {out}: the checkpoint's run started from another original model" in err[0]
    other = tmp_path / "other.pt"
    torch.save(DigitsMLP().state_dict(), other)
    assert cli.main(_argv(out, "--original", str(other), "--resume", str(out))) == 2   # another file
    assert "started from another original model" in capsys.readouterr().err
    assert json.loads((out / "report.json").read_text()) == first   # nothing rewritten
    assert cli.main(_argv(out, "--original-epochs", "2", "--resume", str(out))) == 0   # its own flags: resumes
    cached = json.loads((out / "report.json").read_text())["run"]["original_model"]
    assert cli.main(_argv(tmp_path / "elsewhere", "--original", cached, "--resume", str(out))) == 0   # its file
