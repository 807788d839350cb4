"""Every method runs through the one lifecycle behind `entangle_ext.unlearn`
(``entangle_ext/unlearn/run.py``), so what used to drift between the two-stage family's and the
baselines' run paths (issue 21's list) is the same for both: global state restored, histogram
bins from the config, evaluation timings kept across a resume, the preset reported."""
import pytest
import torch

import entangle_ext as ee
from entangle_ext.methods import get_method
from entangle_ext.unlearn import load_checkpoint
import importlib
report_mod = importlib.import_module("entangle_ext.unlearn.report")
from _tiny import mlp, tiny_config


@pytest.mark.parametrize("method", ["ft", "two_stage"])
def test_every_method_restores_the_thread_count_and_deterministic_flags(small, method, monkeypatch):
    from entangle_ext.unlearn.evaluate import evaluate as real

    def changing(*a, **k):   # the method's run changes process-wide settings
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True, warn_only=True)
        return real(*a, **k)
    monkeypatch.setattr(importlib.import_module("entangle_ext.unlearn.run"), "evaluate", changing)
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(2)
    try:
        cfg = tiny_config() if method == "two_stage" else get_method(method).config_for("digits", epochs=1)
        ee.unlearn(mlp(), small, cfg, method=method, progress=False)
        assert torch.get_num_threads() == 2
        assert torch.are_deterministic_algorithms_enabled() is False
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det)


@pytest.mark.parametrize("method", ["ft", "two_stage"])
def test_the_histogram_has_the_configs_bins(small, method, tmp_path, monkeypatch):
    seen = []
    real = report_mod.plot_forget_histograms
    monkeypatch.setattr(report_mod, "plot_forget_histograms",
                        lambda *a, bins, **k: seen.append(bins) or real(*a, bins=bins, **k))
    cfg = tiny_config(histogram_bins=7) if method == "two_stage" else \
        get_method(method).config_for("digits", epochs=1, histogram_bins=7)
    ee.unlearn(mlp(), small, cfg, method=method, out_dir=tmp_path, progress=False)
    assert seen == [7]


def test_a_resumed_baseline_reports_the_evaluation_time_of_the_first_process(small, tmp_path):
    cfg = get_method("ft").config_for("digits", checkpoint_every=2, epochs=2, batch_size=32)
    full = ee.unlearn(mlp(), small, cfg, method="ft", out_dir=tmp_path, progress=False)
    mid = sorted((tmp_path / "checkpoints").glob("ft_step*.pt"))[0]
    r = ee.unlearn(mlp(seed=9), small, method="ft", resume=mid, progress=False)
    assert r.report["timings_s"]["eval_original"] == pytest.approx(full.report["timings_s"]["eval_original"])
    assert set(r.report["timings_s"]) == set(full.report["timings_s"])


@pytest.mark.parametrize("method", ["ft", "two_stage", "no_w2"])
def test_every_report_names_the_preset_it_ran(small, method):
    r = ee.unlearn(mlp(), small, method=method, setting="digits", progress=False)
    assert (r.report["hparams"], r.report["setting"]) == ("paper_code", "digits")
    explicit = tiny_config() if method != "ft" else get_method("ft").config_for("digits", epochs=1)
    r = ee.unlearn(mlp(), small, explicit, method=method, progress=False)
    assert (r.report["hparams"], r.report["setting"]) == (None, None)


@pytest.mark.parametrize("method", ["ft", "two_stage", "stage1_only"])
def test_every_method_runs_through_the_one_lifecycle(small, method, monkeypatch):
    """One `Run` per call, whatever the method: its stages go through `Run.stage` and its report
    through `Run.finish` (no second run path for the two-stage family)."""
    run_mod = importlib.import_module("entangle_ext.unlearn.run")
    seen = {"stage": [], "finish": 0}
    real_stage, real_finish = run_mod.Run.stage, run_mod.Run.finish

    def stage(self, key, *a, **k):
        seen["stage"].append(key)
        return real_stage(self, key, *a, **k)

    def finish(self, *a, **k):
        seen["finish"] += 1
        return real_finish(self, *a, **k)
    monkeypatch.setattr(run_mod.Run, "stage", stage)
    monkeypatch.setattr(run_mod.Run, "finish", finish)
    cfg = get_method(method).config_for("digits", epochs=1) if method == "ft" else None
    ee.unlearn(mlp(), small, cfg, method=method, setting=None if cfg is not None else "digits", progress=False)
    assert seen["finish"] == 1
    assert seen["stage"] == {"ft": ["ft"], "two_stage": [1, 2], "stage1_only": [1]}[method]


def test_a_resumed_baseline_keeps_the_unlearning_time_of_the_interrupted_process(small, tmp_path):
    """A mid-run checkpoint of a baseline records the unlearning time so far (the earlier baseline
    path recorded only evaluation times), and the resumed report adds this process's time to it."""
    cfg = get_method("ft").config_for("digits", checkpoint_every=2, epochs=2, batch_size=32)
    ee.unlearn(mlp(), small, cfg, method="ft", out_dir=tmp_path, progress=False)
    mid = sorted((tmp_path / "checkpoints").glob("ft_step*.pt"))[-1]
    before = load_checkpoint(mid)["timings"]["unlearn"]
    assert before > 0
    r = ee.unlearn(mlp(seed=9), small, method="ft", resume=mid, progress=False)
    assert r.report["timings_s"]["unlearn"] > before
