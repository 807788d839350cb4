"""The two run paths behind `entangle_ext.unlearn` (the two-stage family's and the baselines') do
the same things around the method (issue 21's list of drifts): global state restored, histogram
bins from the config, evaluation timings kept across a resume, the preset reported."""
import pytest
import torch

import entangle_ext as ee
from entangle_ext.methods import get_method
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
    for mod in ("entangle_ext.unlearn.method_run", "entangle_ext.unlearn.driver"):
        monkeypatch.setattr(importlib.import_module(mod), "evaluate", changing)
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
    mid = sorted((tmp_path / "checkpoints").glob("stageft_step*.pt"))[0]
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
