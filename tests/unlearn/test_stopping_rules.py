"""Issue 26: the opt-in stopping rules (``Stage1Config.until="forget_margin"``,
``Stage2Config.until="adjacent_recovered"``): off by default (the paper's fixed budget), need
curves, stop exactly at the first probe where their train-data condition holds, and resume
consistently."""
import pytest
import torch

import entangle_ext as ee
from _tiny import mlp, params, tiny_config


def test_a_rule_needs_curves(small):
    with pytest.raises(ValueError, match="eval_every > 0"):
        tiny_config(stage1={"until": "forget_margin"}).validate()
    with pytest.raises(ValueError, match="eval_every > 0"):
        ee.unlearn(mlp(), small, tiny_config(stage2={"until": "adjacent_recovered"}), progress=False)
    with pytest.raises(ValueError, match="margin_fraction"):
        tiny_config(eval_every=1, stage1={"until": "forget_margin", "margin_fraction": 0.0})
    assert ee.UnlearnConfig().stage1.until is None and ee.UnlearnConfig().stage2.until is None


def _first(records, stage, pred):
    """The step of the first non-final probe record of ``stage`` where ``pred`` holds (None)."""
    rs = [r for r in records if r["stage"] == stage]
    return next((r["step"] for r in rs[:-1] if pred(r)), None)


def test_stage1_stops_at_the_first_probe_where_the_forget_margin_holds(small, tmp_path):
    free = ee.unlearn(mlp(), small, tiny_config(eval_every=1, stage1={"margin": 0.56}), progress=False)
    shares = [r["forget_margin_share"] for r in free.report["curves"] if r["stage"] == 1]
    q = max(shares[:-1])
    assert 0 < q
    want = _first(free.report["curves"], 1, lambda r: r["forget_margin_share"] >= q and abs(r["violation"]) <= 1.0)
    assert want is not None and want < 7
    cfg = tiny_config(eval_every=1, checkpoint_every=2,
                      stage1={"margin": 0.56, "until": "forget_margin", "margin_fraction": q, "violation_tol": 1.0})
    r = ee.unlearn(mlp(), small, cfg, out_dir=tmp_path, progress=False)
    assert r.report["stopped"]["stage1"] == {"rule": "forget_margin", "step": want}
    assert r.report["stopped"]["stage2"] == {"rule": "budget", "step": 3}
    assert r.report["steps"] == {"stage1": want, "stage2": 3}
    n1 = 1 + want   # the original's record, then one per Stage-1 step
    assert r.report["curves"][:n1] == free.report["curves"][:n1]
    assert [c["global_step"] for c in r.report["curves"][n1:]] == [want + 1, want + 2, want + 3]
    # a violation tolerance nothing meets: the rule never holds, the budget ends Stage 1
    strict = ee.unlearn(mlp(), small, tiny_config(eval_every=1, stage1={
        "margin": 0.56, "until": "forget_margin", "margin_fraction": q, "violation_tol": 0.0}), progress=False)
    assert strict.report["stopped"]["stage1"] == {"rule": "budget", "step": 7}
    # resume before the stop and after it: the same stop, curves and weights
    for name in ("stage1_step000002.pt", "stage1_done.pt"):
        again = ee.unlearn(mlp(seed=9), small, resume=tmp_path / "checkpoints" / name, progress=False)
        assert again.report["stopped"] == r.report["stopped"], name
        assert again.report["curves"] == r.report["curves"], name
        torch.testing.assert_close(params(again.model), params(r.model), rtol=0, atol=0)


def test_stage2_stops_at_the_first_probe_where_the_adjacent_accuracy_recovered(small):
    base = dict(eval_every=1, stage2={"epochs": 2, "lr": 0.05})
    free = ee.unlearn(mlp(), small, tiny_config(**base), progress=False)
    recs, orig = free.report["curves"], free.report["curves"][0]
    gaps = [orig["adjacent_acc"] - r["adjacent_acc"] for r in recs if r["stage"] == 2][:-1]
    delta, eps = min(gaps), max(r["w2"] for r in recs if r["stage"] == 2) + 1e-9
    want = _first(recs, 2, lambda r: orig["adjacent_acc"] - r["adjacent_acc"] <= delta and r["w2"] <= eps)
    assert want is not None
    cfg = tiny_config(eval_every=1, stage2={"epochs": 2, "lr": 0.05, "until": "adjacent_recovered",
                                            "recover_delta": delta, "drift_eps": eps})
    r = ee.unlearn(mlp(), small, cfg, progress=False)
    assert r.report["stopped"]["stage2"] == {"rule": "adjacent_recovered", "step": want}
    assert r.report["steps"]["stage2"] == want
    assert r.report["curves"] == recs[:len(r.report["curves"])]
    # a drift bound nothing meets: the budget ends Stage 2
    tight = tiny_config(eval_every=1, stage2={"epochs": 2, "lr": 0.05, "until": "adjacent_recovered",
                                              "recover_delta": 1.0, "drift_eps": 0.0})
    full = ee.unlearn(mlp(), small, tight, progress=False)
    assert min(r["w2"] for r in recs if r["stage"] == 2) > 0
    assert full.report["stopped"]["stage2"] == {"rule": "budget", "step": 6}
