"""`compare` adds the gap metrics to Retrain (average gap, forget quality, KS D) when it assembles
the table, from the cached records (cache format 5): the same values as one `unlearning_metrics`
call given ``retrained``; a record's key does not hold Retrain's, so a changed Retrain reruns
Retrain alone; a `compare` call with no method (a ``--jobs`` worker's first task of a seed)
scores the original model alone."""
import importlib
import json
import math

import pytest
import torch

import entangle_ext as ee
from entangle_ext.compare_cache import CACHE_FORMAT, record_metrics
from entangle_ext.train import TrainRecipe, train_original
from entangle_ext.unlearn import metrics as M

from _tiny import mlp

C = importlib.import_module("entangle_ext.compare")

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")

RECIPE = TrainRecipe("adam", lr=1e-2, epochs=20, batch_size=64, schedule="constant")


@pytest.fixture(autouse=True)
def _needs_metrics_packages(one_thread):
    pytest.importorskip("sklearn")
    pytest.importorskip("scipy")


@pytest.fixture(scope="module")
def net(small):
    m = mlp()
    train_original(m, [small.forget, small.adjacent, small.remote], RECIPE, progress=False)
    return m


def same(a: dict, b: dict) -> bool:
    """Equal dicts, key order included, NaN equal to NaN (an undefined MIA-efficacy)."""
    if list(a) != list(b):
        return False
    nan = lambda v: isinstance(v, float) and math.isnan(v)
    return all(a[k] == b[k] or (nan(a[k]) and nan(b[k])) for k in a)


def test_gap_metrics_at_assembly_equal_one_metrics_call(small, net):
    ref_model = mlp(7)
    train_original(ref_model, [small.adjacent, small.remote], RECIPE, progress=False)
    ref = M.unlearning_metrics(ref_model, small, keep_losses=True, seed=3)
    run = M.unlearning_metrics(net, small, keep_losses=True, seed=3, seconds=1.5)
    direct = M.unlearning_metrics(net, small, retrained=ref, seed=3, seconds=1.5)
    assembled = record_metrics(run, ref)
    assert same(assembled, direct) and {"avg_gap", "forget_quality", "forget_ks"} <= assembled.keys()
    assert "forget_losses" not in assembled and assembled["time_s"] == 1.5
    assert same(record_metrics(run, None), {k: v for k, v in run.items() if k != "forget_losses"})
    assert record_metrics({}, ref) == {}   # a failed run: no metrics, no gaps
    gaps = M.gap_metrics(run, run["forget_losses"], ref)
    assert gaps == {k: direct[k] for k in ("avg_gap", "forget_quality", "forget_ks")}


def retrain_spec(calls, epochs):
    def go(model, splits, *, seed, device, progress):
        calls.append(("retrain", epochs))
        fresh = mlp(100 + seed)
        train_original(fresh, [splits.adjacent, splits.remote], RECIPE.replace(epochs=epochs), seed=seed,
                       progress=False)
        return ee.UnlearnResult(model=fresh, report={"timings_s": {"unlearn": 0.5}})
    return C.MethodSpec("retrain", go, {"epochs": epochs})


def noise_spec(calls):
    def go(model, splits, *, seed, device, progress):
        calls.append(("noise", seed))
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        return ee.UnlearnResult(model=model, report={})
    return C.MethodSpec("noise", go, {"scale": 0.05})


def test_a_changed_retrain_reruns_retrain_alone_and_the_gaps_follow_it(small, net, tmp_path):
    calls = []
    kw = dict(seeds=[0], out_dir=tmp_path, progress=False, relearn=False)
    first = ee.compare(net, small, [retrain_spec(calls, 20), noise_spec(calls)], **kw)
    assert calls == [("retrain", 20), ("noise", 0)]
    rec = json.loads((tmp_path / "cache" / "noise" / "seed0.json").read_text())
    assert rec["format"] == CACHE_FORMAT and len(rec["metrics"]["forget_losses"]) == len(small.forget)
    assert "avg_gap" not in rec["metrics"]   # the record is Retrain-free; the table adds the gaps
    second = ee.compare(net, small, [retrain_spec(calls, 5), noise_spec(calls)], **kw)
    assert calls[2:] == [("retrain", 5)]   # was: noise ran again (its key held Retrain's)
    assert "noise seed 0 " in second.table.splitlines()[-1]   # listed as cached
    noise, ref = second.runs["noise"][0], second.runs["retrain"][0]
    assert noise["avg_gap"] == pytest.approx(M.average_gap(noise, ref))
    assert noise["avg_gap"] != first.runs["noise"][0]["avg_gap"]   # measured against the new Retrain
    assert {k: v for k, v in noise.items() if k not in ("avg_gap", "forget_quality", "forget_ks")} == \
        {k: v for k, v in first.runs["noise"][0].items() if k not in ("avg_gap", "forget_quality", "forget_ks")}


def test_no_method_scores_the_original_alone_in_a_worker_only(small, net, tmp_path):
    res = ee.compare(net, small, [], seeds=[2], out_dir=tmp_path, progress=False, relearn=False,
                     write_tables=False)
    assert res.methods == ["original"] and list(res.runs["original"]) == [2]
    assert [p.parent.name for p in (tmp_path / "cache").rglob("*.json")] == ["original"]
    calls = []
    again = ee.compare(net, small, [noise_spec(calls)], seeds=[2], out_dir=tmp_path, progress=False, relearn=False,
                       write_tables=False, session="q")
    assert calls == [("noise", 2)] and same(again.runs["original"][2], res.runs["original"][2])   # from the cache
    with pytest.raises(ValueError, match="methods is empty"):
        ee.compare(net, small, [], seeds=[2], out_dir=tmp_path / "t", progress=False, relearn=False)
