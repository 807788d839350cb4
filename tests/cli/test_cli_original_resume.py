"""The original model's flags say what is used: ``--original`` with ``--original-epochs`` or ``--set
train.*`` (which would train the model it loads) is refused, and a ``--resume`` whose original model
is not the one the checkpoint's run started from warns and records none (the run goes on from the
checkpoint, its original's evaluations included: report.json recorded the new original, which
nothing used)."""
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


def test_a_resume_with_another_original_warns_and_records_no_original(tmp_path, capsys):
    """The run goes on from its checkpoint (its original's evaluations included): another original
    model changed nothing but report.json, which named it. Now one warning line, and no original-model
    file or recipe is recorded; the run's own flags (or its cached file) resume without a word."""
    pytest.importorskip("sklearn")
    from entangle_ext.data.digits import DigitsMLP
    out = tmp_path / "out"
    assert cli.main(_argv(out, "--original-epochs", "2")) == 0
    first = json.loads((out / "report.json").read_text())
    cached = first["run"]["original_model"]
    capsys.readouterr()
    other = tmp_path / "other.pt"
    torch.save(DigitsMLP().state_dict(), other)
    for flags in (["--original-epochs", "3"], ["--original", str(other)]):   # another trained / loaded original
        assert cli.main(_argv(out, *flags, "--resume", str(out))) == 0
        err = [ln for ln in capsys.readouterr().err.splitlines() if "warning" in ln]
        assert len(err) == 1 and f"--resume {out}: the original model this command made or loaded is not" in err[0]
        rep = json.loads((out / "report.json").read_text())
        assert rep["run"]["original_model"] is None and rep["run"]["original_recipe"] is None
        assert rep["evals"] == first["evals"]   # the run's own original and results
    for flags, where in ((["--original-epochs", "2"], out), (["--original", cached], tmp_path / "elsewhere")):
        assert cli.main(_argv(where, *flags, "--resume", str(out))) == 0
        assert "warning" not in capsys.readouterr().err
        run = json.loads((where / "report.json").read_text())["run"]
        assert run["original_model"] == (cached if flags[0] == "--original" else first["run"]["original_model"])
