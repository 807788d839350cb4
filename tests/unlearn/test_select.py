"""Issue 26: checkpoint selection ``select="first_within"`` (``entangle_ext/unlearn/run.py``,
`curves.first_within_rule`): off by default, needs curves, keeps exactly the first probed state
within its train-data bounds (the returned model *is* that state), says so in the report and the
table, warns when none is within, resumes to the same choice, and works for a baseline."""
import importlib
import json

import numpy as np
import pytest
import torch

import entangle_ext as ee
from entangle_ext.methods import get_method
from entangle_ext.train import load_model_file
from _tiny import mlp, params, tiny_config

curves_mod = importlib.import_module("entangle_ext.unlearn.curves")
selection_mod = importlib.import_module("entangle_ext.unlearn.selection")


def _first_within(records, forget_max, delta):
    """Our own transcription of the rule: the first stage record (not the original's) with forget
    accuracy <= forget_max and adjacent / remote accuracy at most delta below the original's."""
    orig = records[0]
    for r in records[1:]:
        if r["forget_acc"] <= forget_max and all(orig[f"{n}_acc"] - r[f"{n}_acc"] <= delta
                                                 for n in ("adjacent", "remote")):
            return r
    return None


def test_selection_is_off_by_default_and_needs_curves(small):
    assert ee.UnlearnConfig().select is None and get_method("ft").Config().select is None
    with pytest.raises(ValueError, match="eval_every > 0"):
        tiny_config(select="first_within").validate()
    with pytest.raises(ValueError, match="eval_every > 0"):
        get_method("ft").config_for("digits", select="first_within")
    with pytest.raises(ValueError, match="select_forget_acc"):
        tiny_config(eval_every=1, select="first_within", select_forget_acc=1.5)
    with pytest.raises(ValueError, match="select_delta"):
        tiny_config(eval_every=1, select="first_within", select_delta=-0.1)
    with pytest.raises(ValueError, match="first_within"):
        tiny_config(eval_every=1, select="best")
    r = ee.unlearn(mlp(), small, tiny_config(eval_every=1), progress=False)
    assert r.report["selected"] is None and "selected" not in r.report["evals"]


# Stage 1 at a large step size: on these curves the forget accuracy falls to 0 at once while the
# adjacent one falls with it, and both come back within a few steps
FAST = {"lr": 1e-2}


def _free_and_bounds(small, **top):
    """A run with curves and no selection, and bounds whose first qualifying record is a
    mid-run one (neither the first probe nor the last) that comes after an earlier record
    within the forget bound but not within δ (so both bounds matter)."""
    free = ee.unlearn(mlp(), small, tiny_config(eval_every=1, stage1=FAST, **top), progress=False)
    recs = free.report["curves"]
    for forget_max in sorted({r["forget_acc"] for r in recs[1:]}):
        for delta in (0.05, 0.1, 0.2):
            want = _first_within(recs, forget_max, delta)
            first_forgot = next(r for r in recs[1:] if r["forget_acc"] <= forget_max)
            if want is not None and first_forgot is not want and recs.index(want) < len(recs) - 1:
                return free, forget_max, delta, want
    pytest.fail(f"no bounds pick a mid-run state behind a rejected one on these curves: {recs}")


def test_first_within_keeps_exactly_the_first_probed_state_within_the_bounds(small, tmp_path):
    free, forget_max, delta, want = _free_and_bounds(small)
    cfg = tiny_config(eval_every=1, stage1=FAST, select="first_within", select_forget_acc=forget_max,
                      select_delta=delta)
    r = ee.unlearn(mlp(), small, cfg, out_dir=tmp_path, progress=False)
    label = f"stage{want['stage']}"
    assert r.report["selected"] == {"rule": "first_within", "forget_acc_max": forget_max, "delta": delta,
                                    "kept": "selected", "stage": label, "step": want["step"],
                                    "global_step": want["global_step"], "model_file": str(tmp_path / "selected_model.pt")}
    # the stages ran their whole budget as without selection: same curves, history and stage ends
    assert r.report["curves"] == free.report["curves"] and r.history == free.history
    assert r.report["evals"]["stage2"] == free.report["evals"]["stage2"]
    # the returned model is the kept state: its train-subsample accuracies are that record's
    probe = curves_mod.CurveProbe(r.model, small, samples=256, seed=0, device=torch.device("cpu"), batch_size=512)
    again = probe.measure()
    for split in ("forget", "adjacent", "remote"):
        assert again[f"{split}_acc"] == pytest.approx(want[f"{split}_acc"], abs=1e-12), split
        assert again[f"{split}_loss"] == pytest.approx(want[f"{split}_loss"], rel=1e-6), split
    assert not torch.equal(params(r.model), params(free.model))
    assert r.report["evals"]["final"] == r.report["evals"]["selected"]
    assert r.report["evals"]["final"] != free.report["evals"]["final"]
    # the kept state is a model file of its own; the checkpoints keep the stages' end states
    assert json.loads((tmp_path / "report.json").read_text())["selected"] == r.report["selected"]
    kept = load_model_file(mlp(seed=5), tmp_path / "selected_model.pt")
    torch.testing.assert_close(params(kept), params(r.model), rtol=0, atol=0)
    end = load_model_file(mlp(seed=5), tmp_path / "checkpoints" / "stage2_done.pt")
    torch.testing.assert_close(params(end), params(free.model), rtol=0, atol=0)
    line = r.table.splitlines()[-1]
    assert line.startswith("selected (first_within: ") and line.endswith(
        f"{label} step {want['step']} (global step {want['global_step']})")
    assert max(len(x) for x in r.table.splitlines()) <= 100


def test_first_within_with_no_state_in_bounds_warns_and_keeps_the_final_state(small):
    free = ee.unlearn(mlp(), small, tiny_config(eval_every=1), progress=False)
    assert min(c["forget_acc"] for c in free.report["curves"]) > 0
    cfg = tiny_config(eval_every=1, select="first_within", select_forget_acc=0.0)
    with pytest.warns(curves_mod.SelectionWarning, match="no probed state"):
        r = ee.unlearn(mlp(), small, cfg, progress=False)
    torch.testing.assert_close(params(r.model), params(free.model), rtol=0, atol=0)
    assert r.report["selected"]["kept"] == "final" and r.report["selected"]["step"] is None
    assert "selected" not in r.report["evals"]
    assert r.report["evals"]["final"] == free.report["evals"]["final"]
    assert r.table.splitlines()[-1].endswith("no probed state within; the final state is kept")


def test_the_default_forget_bound_is_chance_level(small):
    cfg = tiny_config(eval_every=1, stage1=FAST, select="first_within", select_delta=1.0)
    free = ee.unlearn(mlp(), small, tiny_config(eval_every=1, stage1=FAST), progress=False)
    want = _first_within(free.report["curves"], 0.5, 1.0)   # 2 classes: 1/C = 0.5
    assert want is not None and want["forget_acc"] <= 0.5
    r = ee.unlearn(mlp(), small, cfg, progress=False)
    assert r.report["selected"]["forget_acc_max"] == 0.5
    assert r.report["selected"]["global_step"] == want["global_step"]


def test_a_resumed_run_keeps_the_same_state(small, tmp_path):
    free, forget_max, delta, want = _free_and_bounds(small)
    assert want["stage"] == 1 and want["step"] > 2   # kept after the first checkpoint below
    cfg = tiny_config(eval_every=1, checkpoint_every=2, stage1=FAST, select="first_within",
                      select_forget_acc=forget_max, select_delta=delta)
    r = ee.unlearn(mlp(), small, cfg, out_dir=tmp_path, progress=False)
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt"))
    assert "stage1_step000002.pt" in ckpts and "stage2_done.pt" in ckpts
    for name in ("stage1_step000002.pt", f"stage1_step{2 * (want['step'] // 2 + 1):06d}.pt", "stage1_done.pt",
                 "stage2_done.pt"):
        again = ee.unlearn(mlp(seed=9), small, resume=tmp_path / "checkpoints" / name, progress=False)
        assert again.report["selected"] == {**r.report["selected"], "model_file": None}, name   # no out_dir
        torch.testing.assert_close(params(again.model), params(r.model), rtol=0, atol=0, msg=name)
        assert again.report["evals"]["final"] == r.report["evals"]["final"], name


def test_a_resume_may_not_change_the_selection(small, tmp_path):
    free, forget_max, delta, want = _free_and_bounds(small)
    kw = dict(eval_every=1, checkpoint_every=2, stage1=FAST)
    ee.unlearn(mlp(), small, tiny_config(**kw), out_dir=tmp_path / "off", progress=False)
    ee.unlearn(mlp(), small, tiny_config(**kw, select="first_within", select_forget_acc=forget_max,
                                         select_delta=delta), out_dir=tmp_path / "on", progress=False)
    cases = [("off", dict(select="first_within"), "select None vs 'first_within'"),
             ("on", dict(select=None), "select 'first_within' vs None"),
             ("on", dict(select="first_within", select_forget_acc=forget_max, select_delta=0.5), "select_delta")]
    for run, change, names in cases:
        for ck in ("stage1_step000002.pt", "stage2_done.pt"):
            cfg = tiny_config(**kw, **change)
            with pytest.raises(ValueError, match="cannot change on resume") as e:
                ee.unlearn(mlp(), small, cfg, resume=tmp_path / run / "checkpoints" / ck, allow_config_change=True,
                           progress=False)
            assert names in str(e.value) and "not even with allow_config_change" in str(e.value)


def test_accuracy_gaps_of_exactly_the_bound_count(monkeypatch):
    origin = {"forget_acc": 1.0, "adjacent_acc": 1.0, "remote_acc": 1.0}
    assert 1.0 - 0.98 > 0.02   # float round-off: the rules must not read this as outside δ
    rule = curves_mod.first_within_rule(origin, 0.65, 0.02)
    assert rule({"forget_acc": 0.65, "adjacent_acc": 0.98, "remote_acc": 1.0})
    assert not rule({"forget_acc": 0.65, "adjacent_acc": 0.97, "remote_acc": 1.0})
    assert not rule({"forget_acc": 0.66, "adjacent_acc": 1.0, "remote_acc": 1.0})
    assert curves_mod.adjacent_recovered_rule(1.0, 0.02, 0.1)({"adjacent_acc": 0.98, "w2": 0.1})
    cfg = tiny_config(eval_every=1, select="first_within", select_forget_acc=np.float32(0.5),
                      select_delta=np.float64(0.02), stage2={"lr": np.float32(0.25)})
    assert type(cfg.select_forget_acc) is float and type(cfg.select_delta) is float
    assert type(cfg.stage2.lr) is float and json.dumps(cfg.to_dict())


def test_a_sharded_model_is_refused_before_any_step(small, monkeypatch):
    monkeypatch.setattr(selection_mod, "has_dtensor", lambda x: True)
    with pytest.raises(NotImplementedError, match="sharded"):
        ee.unlearn(mlp(), small, tiny_config(eval_every=1, select="first_within"), progress=False)


def test_a_baseline_selects_through_the_one_lifecycle(small):
    base = get_method("ft").config_for("digits", epochs=2, eval_every=1)
    free = ee.unlearn(mlp(), small, base, method="ft", progress=False)
    recs = free.report["curves"]
    forget_max = max(r["forget_acc"] for r in recs[1:])
    want = _first_within(recs, forget_max, 1.0)
    assert want is recs[1]
    cfg = get_method("ft").config_for("digits", epochs=2, eval_every=1, select="first_within",
                                      select_forget_acc=forget_max, select_delta=1.0)
    r = ee.unlearn(mlp(), small, cfg, method="ft", progress=False)
    assert r.report["selected"]["stage"] == "ft" and r.report["selected"]["step"] == 1
    assert r.report["evals"]["final"] == r.report["evals"]["selected"]
    # the baseline's own end-of-budget evaluation is kept, as "end"
    assert r.report["evals"]["end"] == free.report["evals"]["final"]
    assert [line.split()[0] for line in r.table.splitlines() if line.startswith(("end ", "selected  "))] == \
        ["end", "selected", "end", "selected"]
    probe = curves_mod.CurveProbe(r.model, small, samples=256, seed=0, device=torch.device("cpu"), batch_size=512)
    assert probe.measure()["forget_acc"] == pytest.approx(want["forget_acc"], abs=1e-12)
