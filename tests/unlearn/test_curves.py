"""Issue 26: curves of every train split during the stages (``entangle_ext/unlearn/curves.py``),
the two-stage family's certificate (``entangle_ext/unlearn/certificate.py``), and what they cost
when off (nothing: no probe is built and the run is bit-identical)."""
import dataclasses
import importlib
import json

import pytest
import torch

import entangle_ext as ee
from entangle_ext.methods import get_method
from _tiny import mlp, params, tiny_config

curves_mod = importlib.import_module("entangle_ext.unlearn.curves")


def test_curves_off_builds_no_probe_and_curves_on_leave_the_run_bit_identical(small, monkeypatch):
    off = ee.unlearn(mlp(), small, tiny_config(), progress=False)
    on = ee.unlearn(mlp(), small, tiny_config(eval_every=2), progress=False)
    torch.testing.assert_close(params(on.model), params(off.model), rtol=0, atol=0)
    assert on.history == off.history
    assert off.report["curves"] == [] and off.report["curves_png"] is None
    assert len(on.report["curves"]) == 7

    def boom(*a, **k):
        raise AssertionError("a curve probe ran with eval_every=0")
    monkeypatch.setattr(curves_mod.CurveProbe, "measure", boom)
    again = ee.unlearn(mlp(), small, tiny_config(), progress=False)
    torch.testing.assert_close(params(again.model), params(off.model), rtol=0, atol=0)


def test_curve_records_every_eval_every_steps_and_at_each_stage_end(small, tmp_path):
    pytest.importorskip("matplotlib")
    r = ee.unlearn(mlp(), small, tiny_config(eval_every=2), out_dir=tmp_path, progress=False)
    recs = r.report["curves"]
    assert [(c["stage"], c["step"], c["global_step"]) for c in recs] == [
        ("original", 0, 0), (1, 2, 2), (1, 4, 4), (1, 6, 6), (1, 7, 7), (2, 2, 9), (2, 3, 10)]
    # curve_samples (256) covers the digits splits (20 / 80 / 100): a stage's end record is that
    # stage's full evaluation of the train splits
    for rec, tag in ((recs[0], "original"), (recs[4], "stage1"), (recs[6], "stage2")):
        for split in ("forget", "adjacent", "remote"):
            assert rec[f"{split}_acc"] == pytest.approx(r.report["evals"][tag][split]["acc"], abs=1e-12)
            assert rec[f"{split}_loss"] == pytest.approx(r.report["evals"][tag][split]["loss"], rel=1e-5)
    assert "violation" in recs[1] and "w2" not in recs[1] and recs[5]["w2"] >= 0
    assert recs[4]["violation"] == pytest.approx(recs[4]["remote_loss"] - recs[0]["remote_loss"])
    hist = json.loads((tmp_path / "history.json").read_text())
    assert [h for h in hist if h.get("kind") == "curve"] == json.loads(json.dumps(recs))
    assert len([h for h in hist if h.get("kind") != "curve"]) == 10
    assert r.report["curves_png"] == str(tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 1000
    assert json.loads((tmp_path / "report.json").read_text())["curves_png"] == str(tmp_path / "curves.png")


def test_the_curve_subsample_is_bounded_seeded_and_sorted(small):
    a = curves_mod.curve_indices(100, 16, 0, "remote")
    assert len(a) == 16 and len(set(a.tolist())) == 16 and a.tolist() == sorted(a.tolist())
    assert torch.equal(a, curves_mod.curve_indices(100, 16, 0, "remote"))
    assert not torch.equal(a, curves_mod.curve_indices(100, 16, 1, "remote"))
    assert curves_mod.curve_indices(5, 16, 0, "forget").tolist() == [0, 1, 2, 3, 4]
    r = ee.unlearn(mlp(), small, tiny_config(eval_every=3, curve_samples=16), progress=False)
    assert r.report["curves"][0]["forget_acc"] * 16 == pytest.approx(round(r.report["curves"][0]["forget_acc"] * 16))
    with pytest.raises(ValueError, match="curve_samples"):
        tiny_config(curve_samples=0)


def test_a_run_resumed_mid_stage_has_the_uninterrupted_runs_curves(small, tmp_path):
    cfg = tiny_config(eval_every=2, checkpoint_every=3)
    full = ee.unlearn(mlp(), small, cfg, out_dir=tmp_path / "a", progress=False)
    ck = tmp_path / "a" / "checkpoints"
    for name in ("stage1_step000003.pt", "stage1_step000006.pt", "stage1_done.pt"):
        r = ee.unlearn(mlp(seed=9), small, resume=ck / name, progress=False)
        assert r.report["curves"] == full.report["curves"], name
        torch.testing.assert_close(params(r.model), params(full.model), rtol=0, atol=0)
    # eval_every may change on resume (the curves change from there on), curve_samples may not
    r = ee.unlearn(mlp(seed=9), small, dataclasses.replace(cfg, eval_every=1), resume=ck / "stage1_step000006.pt",
                   progress=False)
    assert [(c["stage"], c["step"]) for c in r.report["curves"]][-4:] == [(1, 7), (2, 1), (2, 2), (2, 3)]
    with pytest.raises(ValueError, match="curve_samples"):
        ee.unlearn(mlp(seed=9), small, dataclasses.replace(cfg, curve_samples=8), resume=ck / "stage1_step000006.pt",
                   progress=False)


def test_a_baseline_gets_curves_through_the_one_lifecycle_and_no_certificate(small):
    cfg = get_method("ft").config_for("digits", epochs=1, eval_every=2)
    r = ee.unlearn(mlp(), small, cfg, method="ft", progress=False)
    steps = r.report["steps"]["ft"]
    assert [c["stage"] for c in r.report["curves"]] == ["original"] + ["ft"] * len(r.report["curves"][1:])
    assert r.report["curves"][-1]["step"] == steps and r.report["curves"][1]["step"] == 2
    assert r.report["certificate"] == {"applies": False}
    assert r.report["stopped"] == {"ft": {"rule": "budget", "step": steps}}
    assert "certificate" not in r.table


def test_the_certificate_is_always_there_and_says_why_an_assumption_failed(small):
    # one Stage-1 step at a tiny learning rate cannot push every forget loss above log C + 1
    cfg = tiny_config(stage1={"max_steps": 1, "lr": 1e-9})
    r = ee.unlearn(mlp(), small, cfg, progress=False)
    cert = r.report["certificate"]
    assert cert["applies"] is True and cert["held"] is False
    assert cert["margin"] == pytest.approx(torch.log(torch.tensor(2.0)).item() + 1)
    assert cert["stage1"]["margin_share"] < 1 and cert["stage1"]["n"] == 20
    assert "forget train samples have loss >= m" in cert["reason"]
    ev = r.report["evals"]
    assert cert["stage2"]["mean_forget_loss_change"] == pytest.approx(
        abs(ev["stage2"]["forget"]["loss"] - ev["stage1"]["forget"]["loss"]))
    assert cert["stage2"]["w2"] >= 0
    assert r.table.splitlines()[-1].startswith("certificate (Prop. 4.2): NOT held · loss ≥ m=1.69: ")
    assert max(len(line) for line in r.table.splitlines()) <= 100   # the table's width (tests/test_cli.py)
    assert r.report["stopped"] == {"stage1": {"rule": "budget", "step": 1}, "stage2": {"rule": "budget", "step": 3}}


def test_the_certificate_holds_when_both_assumptions_hold(small):
    # a margin every forget loss exceeds and a loose ε: both of Prop. 4.2's assumptions hold
    r = ee.unlearn(mlp(), small, tiny_config(stage1={"margin": 0.01}, stage2={"drift_eps": 5.0}), progress=False)
    cert = r.report["certificate"]
    assert cert["stage1"]["margin_share"] == 1.0 and cert["held"] is True
    assert r.table.splitlines()[-1].startswith("certificate (Prop. 4.2): held")
    only1 = ee.unlearn(mlp(), small, tiny_config(stage1={"margin": 0.01}), method="stage1_only", progress=False)
    assert only1.report["certificate"]["held"] is False and "Stage 2 did not run" in only1.report["certificate"]["reason"]


def test_an_old_checkpoint_resumes_with_curves_turned_on(small):
    from pathlib import Path
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "resume" / "two_stage.pt"
    from entangle_ext.unlearn import load_checkpoint
    ck = load_checkpoint(fixture)
    cfg = ee.UnlearnConfig.from_dict({**ck["config"], "eval_every": 2})
    r = ee.unlearn(mlp(seed=9), small, cfg, resume=fixture, progress=False)
    # no original record (the original model is gone), so no violation; Stage 2's records end it
    assert r.report["curves"] and all(c["stage"] != "original" and "violation" not in c for c in r.report["curves"])
    assert r.report["curves"][-1]["step"] == r.report["steps"]["stage2"]
    assert r.report["resume"]["config_changes"] == {}   # eval_every is a resumable field
