"""What a run prints besides its results: a stage that an opt-in stopping rule ends early says so
(the bar closes at that step, labelled "[stopped early]", and one line on stderr names the rule and
its values), only where progress is shown; the curves plot emits no matplotlib layout warning."""
import re
import warnings

import pytest

import entangle_ext as ee
from entangle_ext.unlearn import curves
from _tiny import mlp, tiny_config


def _bar_lines(err: str, label: str):
    """The renderings of the progress bar ``label`` in captured stderr (tqdm redraws with \\r)."""
    return [line for line in re.split(r"[\r\n]", err) if line.startswith(label) and re.search(r"\d+/\d+ \[", line)]


# Stage 2 stops at its first probe: any adjacent accuracy and any drift pass (a 6-step budget).
STAGE2_STOP = dict(eval_every=1, stage2={"epochs": 2, "until": "adjacent_recovered", "recover_delta": 1.0,
                                         "drift_eps": 100.0})
# Stage 1 stops at its first probe: every forget sample's CE is above a 0.01-nat margin (a 7-step budget).
STAGE1_STOP = dict(eval_every=1, stage1={"margin": 0.01, "until": "forget_margin", "margin_fraction": 0.05,
                                         "violation_tol": 10.0})


def test_an_early_stage2_stop_closes_the_bar_there_and_says_which_rule_fired(small, capsys):
    r = ee.unlearn(mlp(), small, tiny_config(**STAGE2_STOP), progress=True)
    assert r.report["stopped"]["stage2"] == {"rule": "adjacent_recovered", "step": 1}   # the report has it
    err = capsys.readouterr().err
    last = _bar_lines(err, "stage 2 (W-PGD)")[-1]
    assert last.startswith("stage 2 (W-PGD) [stopped early]:") and " 1/6 " in last, last
    notes = [line for line in err.splitlines() if "stopped early after" in line]
    assert len(notes) == 1, err
    assert re.fullmatch(r"stage 2 \(W-PGD\): stopped early after step 1 of 6: stopping rule 'adjacent_recovered' "
                        r"held: the adjacent train subsample's accuracy \d+\.\d\d% is within 100\.00 points of the "
                        r"original model's \d+\.\d\d% and the forget-loss W2 to θ̄ is \S+ nats \(<= 100\)", notes[0])
    assert err.index("[stopped early]") < err.index(notes[0])   # the bar closes, then the note
    # Stage 1 ran its budget: its bar is not labelled, nothing is said about it
    assert _bar_lines(err, "stage 1 (AL)")[-1].startswith("stage 1 (AL): 100%")


def test_an_early_stage1_stop_says_so_too(small, capsys):
    r = ee.unlearn(mlp(), small, tiny_config(**STAGE1_STOP), progress=True)
    assert r.report["stopped"]["stage1"] == {"rule": "forget_margin", "step": 1}
    err = capsys.readouterr().err
    assert " 1/7 " in _bar_lines(err, "stage 1 (AL) [stopped early]")[-1]
    notes = [line for line in err.splitlines() if "stopped early after" in line]
    assert len(notes) == 1 and re.fullmatch(
        r"stage 1 \(AL\): stopped early after step 1 of 7: stopping rule 'forget_margin' held: 100\.0% of the "
        r"forget train subsample has CE >= the margin m \(needed: >= 5\.0%\) and the constraint violation "
        r"\|g\| = \d\.\d{4} nats \(<= 10\)", notes[0]), err


def test_no_progress_means_no_stop_message(small, capsys):
    ee.unlearn(mlp(), small, tiny_config(**STAGE2_STOP), progress=False)
    ee.unlearn(mlp(), small, tiny_config(**STAGE1_STOP), progress=False)
    out, err = capsys.readouterr()
    assert "stopped early" not in out + err and err == ""


def test_a_stage_that_runs_its_budget_is_not_said_to_stop(small, capsys):
    # the rule never holds (no drift allowed): the budget ends Stage 2, as before
    cfg = tiny_config(eval_every=1, stage2={"until": "adjacent_recovered", "recover_delta": 1.0, "drift_eps": 0.0})
    r = ee.unlearn(mlp(), small, cfg, progress=True)
    assert r.report["stopped"]["stage2"] == {"rule": "budget", "step": 3}
    err = capsys.readouterr().err
    assert "stopped early" not in err and _bar_lines(err, "stage 2 (W-PGD)")[-1].startswith("stage 2 (W-PGD): 100%")


def _records(stages):
    """Curve records: the original's, then one per (stage, accuracy) of ``stages`` (every split alike)."""
    out = [{"kind": "curve", "stage": "original", "step": 0, "global_step": 0,
            **{f"{n}_acc": 1.0 for n in curves.CURVE_SPLITS}}]
    for stage, accs in stages:
        for i, a in enumerate(accs):
            out.append({"kind": "curve", "stage": stage, "step": i + 1, "global_step": len(out),
                        **{f"{n}_acc": a for n in curves.CURVE_SPLITS}})
    return out


@pytest.mark.parametrize("stages", [
    [(1, [0.99, 0.98]), (2, [0.97, 0.99])],                                    # warned: accuracies 97-100 %
    [(1, [0.99, 0.98]), (2, [0.97, 0.99]), ("ssd/select", [0.97]), ("ft", [0.9])],   # warned: four stages
    [(1, [0.5, 0.0]), (2, [0.3, 0.4])],                                        # the usual two-stage shape
], ids=["high", "four-stages", "low"])
def test_the_curves_plot_warns_nothing_and_labels_each_stage_end_inside_the_axes(tmp_path, stages):
    pytest.importorskip("matplotlib")
    recs = _records(stages)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)   # was: "Tight layout not applied" (a UserWarning)
        fig = curves.curves_figure(recs, {"forget": [(2, 0.99)]})
        path = curves.plot_curves(recs, str(tmp_path / "curves.png"))
        fig.canvas.draw()
    assert (tmp_path / "curves.png").stat().st_size > 0 and path.endswith("curves.png")
    ax = fig.axes[0]
    box = ax.get_window_extent()
    labels = [t for t in ax.texts if t.get_text().startswith(" end of")]
    assert len(labels) == len(stages) - 1
    for t in labels:   # was at y = 1 % in data coordinates: far below axes spanning 97-100 %
        ext = t.get_window_extent()
        assert box.y0 <= ext.y0 and ext.y1 <= box.y1, t.get_text()
