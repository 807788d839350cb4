"""What a comparison prints besides its table: an MIA attack without signal warns once per
`compare` call (naming every run and split it concerned; the ``--jobs`` parent too, for the runs
its workers scored), a lone `unlearning_metrics` call still warns itself; the comparison plot emits
no matplotlib layout warning for long method names."""
import warnings

import pytest
import torch

import entangle_ext as ee
from entangle_ext.compare import MethodSpec
from entangle_ext.compare_report import plot_comparison
from entangle_ext.unlearn.metrics import MIAUndefinedWarning, unlearning_metrics

from _tiny import mlp

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")


@pytest.fixture(autouse=True)
def _needs_metrics_packages(one_thread):
    pytest.importorskip("sklearn")
    pytest.importorskip("scipy")


def flat():
    """`mlp` with every weight and bias 0: p(true label) = 1/2 for every sample, so the MIA attack
    has no signal (every member and non-member feature is the same) on any split."""
    net = mlp()
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
    return net


def flat_spec(name):
    """A method that leaves the (flat) model as it is."""
    return MethodSpec(name, lambda model, splits, **_: ee.UnlearnResult(model=model, report={}), {"name": name})


def _mia_warnings(fn):
    """(fn's result, the MIAUndefinedWarnings it emitted, every one counted)."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in got if issubclass(w.category, MIAUndefinedWarning)]


def test_one_mia_warning_per_compare_call_naming_every_run(small):
    specs = [flat_spec(n) for n in ("ft", "ga", "two_stage")]
    res, got = _mia_warnings(lambda: ee.compare(flat(), small, specs, seeds=[0, 1], relearn=False, progress=False))
    assert len(got) == 1, got   # was 8: the original and each method, per seed
    assert got[0].startswith("MIA-efficacy undefined (NaN) for ['adjacent', 'forget', 'remote'] in 8 run(s) of this "
                             "comparison (original seeds 0,1; ft seeds 0,1; ga seeds 0,1; two_stage seeds 0,1): the "
                             "attack's balanced accuracy on its own members vs non-members was <= 0.55"), got[0]
    assert all(v != v for m in res.runs.values() for r in m.values() for k, v in r.items() if k.startswith("mia_"))
    # a lone scoring call still warns, once, with its own balanced accuracy
    _, alone = _mia_warnings(lambda: unlearning_metrics(flat(), small))
    assert len(alone) == 1 and "balanced accuracy" in alone[0] and "every member and non-member feature is the same" \
        in alone[0]


def test_the_jobs_parent_warns_once_for_its_workers_runs_and_a_rerun_from_the_cache_does_not(small, tmp_path):
    """What ``entangle-unlearn compare --jobs N`` does: workers (one compare call per (method, seed),
    write_tables=False, the queue's session) then the parent's call, which reads their records
    from the cache (was: the parent said nothing, the workers' warnings went to logs that are
    deleted when they succeed). The workers warn nothing themselves (each warned for its own task,
    and `run_workers` printed every one of those lines before the parent's: 8 for 3 methods x 2
    seeds on 2 workers)."""
    kw = dict(out_dir=tmp_path, relearn=False, progress=False)
    for seed in (0, 1):
        _, got = _mia_warnings(lambda: ee.compare(flat(), small, [flat_spec("ga")], seeds=[seed], write_tables=False,
                                                  session="q1", **kw))
        assert got == [], got
    _, got = _mia_warnings(lambda: ee.compare(flat(), small, [flat_spec("ga")], seeds=[0, 1], session="q1", **kw))
    assert len(got) == 1 and "in 4 run(s) of this comparison (original seeds 0,1; ga seeds 0,1)" in got[0], got
    # a later invocation reuses every result from the cache: nothing scored now, nothing to warn
    # about (the table says which results are cached and what "–" means)
    res, got = _mia_warnings(lambda: ee.compare(flat(), small, [flat_spec("ga")], seeds=[0, 1], **kw))
    assert got == [] and "cached: original seeds 0,1; ga seeds 0,1" in res.table


def _summary(names):
    keys = ("acc_forget_test", "acc_adjacent_test", "acc_remote_test", "mia_forget", "mia_adjacent", "mia_remote")
    return {m: {k: {"mean": 50.0, "std": 1.0, "n": 2} for k in keys} for m in names}


LONG = "two_stage_alpha0.7_lr3e-5_momentum0.95_basis_every4_forget_batch_limit20"   # 72 characters


@pytest.mark.parametrize("names", [["original", LONG], ["original"] + [f"variant_{i}_" + "x" * 150 for i in range(3)]],
                         ids=["72-chars", "160-chars"])   # (compare's order: the original's row first)
def test_the_comparison_plot_of_long_method_names_warns_nothing(tmp_path, names):
    pytest.importorskip("matplotlib")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)   # was: "Tight layout not applied" (a UserWarning)
        plot_comparison(_summary(names), str(tmp_path / "c.png"), order=names)
    assert (tmp_path / "c.png").stat().st_size > 0


def test_a_batch_larger_than_its_split_warns_once_per_compare_call(small):
    """It warned once per run (2 methods x 2 seeds: 4 identical messages); a lone run still warns."""
    import dataclasses
    from _tiny import tiny_config
    from entangle_ext.unlearn.data import BatchLargerThanSplitWarning
    cfg = tiny_config()
    cfg.stage2 = dataclasses.replace(cfg.stage2, forget_batch_size=64)   # the forget split has 20 samples
    from entangle_ext.compare import method_spec
    specs = [method_spec("two_stage", config=cfg), method_spec("no_w2", config=cfg)]

    def batch_warnings(fn):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            fn()
        return [str(w.message) for w in got if issubclass(w.category, BatchLargerThanSplitWarning)]
    got = batch_warnings(lambda: ee.compare(mlp(), small, specs, seeds=[0, 1], relearn=False, progress=False))
    assert len(got) == 1 and "stream 's2/forget': batch size 64 is larger than its split (20 samples)" in got[0], got
    assert len(batch_warnings(lambda: ee.unlearn(mlp(), small, cfg, progress=False))) == 1
