"""What ``compare`` computes once and shares: its cache keys do not depend on the thread count (the
``--jobs N`` workers run on ``threads // N`` threads, their parent on all of them: the parent must
find every record they wrote), the relearn threshold reads the forget split alone, and θ0's
evaluation before each run is made once per seed and settings (`original_eval_scope`) with
bit-identical runs, and the metrics' MIA takes its per-sample values from an evaluation already
made (the run's last one, `FinalOutputs`, or the metrics' own) with the same values."""
import dataclasses
import importlib

import pytest
import torch
from torch.utils.data import Dataset

import entangle_ext as ee
from entangle_ext.methods import get_method
from entangle_ext.unlearn.fingerprint import model_fingerprint
from entangle_ext.unlearn.evaluate import NonFiniteOutputError, per_sample, per_sample_of_outputs
from entangle_ext.unlearn.final_outputs import FinalOutputs
from entangle_ext.unlearn import metrics as M
from entangle_ext.unlearn.original_eval import original_eval_scope
from entangle_ext.unlearn.run import Run

from _tiny import mlp, params, tiny_config

C = importlib.import_module("entangle_ext.compare")
mia_mod = importlib.import_module("entangle_ext.unlearn.mia")

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")


@pytest.fixture(autouse=True)
def _needs_metrics_packages(one_thread):
    pytest.importorskip("sklearn")
    pytest.importorskip("scipy")


class ThreadShifted(torch.nn.Module):
    """`mlp` whose logits move with the torch thread count by much more than round-off (what
    float32 CPU kernels do in the last bits): a key computed from them on 1 and on 2 threads differs
    unless it is computed on a fixed count. Records (thread count, batch size) of every forward."""

    def __init__(self):
        super().__init__()
        self.net, self.seen = mlp(), []

    def forward(self, x):
        self.seen.append((torch.get_num_threads(), x.shape[0]))
        return self.net(x) + 1e-3 * torch.get_num_threads()


def test_model_fingerprint_outputs_do_not_depend_on_the_thread_count(small):
    m = ThreadShifted()
    fps = []
    for n in (1, 2, 1):
        torch.set_num_threads(n)
        fps.append(model_fingerprint(m, small))
        assert torch.get_num_threads() == n   # the caller's count is restored
    assert fps[0] == fps[1] == fps[2]
    assert {t for t, _ in m.seen} == {1}


def test_relearn_threshold_reads_the_forget_split_on_one_thread(small):
    m = ThreadShifted()
    torch.set_num_threads(2)
    rl = C._relearn_settings(None, m, small, torch.device("cpu"), 512)
    assert torch.get_num_threads() == 2
    assert m.seen == [(1, len(small.forget))]   # one batch: the forget split, nothing else
    torch.set_num_threads(1)
    full = ee.evaluate(m, small, keep_forget_losses=False)["forget"]["acc"]   # every split, as before
    assert rl["threshold"] == C.DEFAULT_RELEARN["fraction"] * full


def noise_spec(calls):
    """A fake method: seeded noise on the weights; records its runs."""
    def run(model, splits, *, seed, device, progress):
        calls.append(seed)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        return ee.UnlearnResult(model=model, report={})
    return C.MethodSpec("noise", run, {"scale": 0.05})


def test_records_written_on_one_thread_are_found_on_two(small, tmp_path):
    """The ``compare --jobs 2 --threads 2`` case: the workers (1 thread each) cache the runs, then
    the parent (2 threads) assembles the table from them without running any again. Before the
    keys were computed on one thread, a model whose outputs moved in a 6th digit with the thread
    count (the Tiny-ImageNet lite0 model) made the parent run the whole comparison again."""
    m, calls = ThreadShifted(), []
    kw = dict(seeds=[0, 1], out_dir=tmp_path, progress=False, relearn={"max_steps": 2})
    torch.set_num_threads(1)
    for seed in (0, 1):
        ee.compare(m, small, [noise_spec(calls)], **{**kw, "seeds": [seed]}, write_tables=False, session="q")
    assert calls == [0, 1]
    torch.set_num_threads(2)
    res = ee.compare(m, small, [noise_spec(calls)], session="q", **kw)
    assert calls == [0, 1] and sorted(res.runs["noise"]) == [0, 1]   # nothing ran again


class Items(Dataset):
    """A map-style Dataset (not a TensorDataset): its batches come through a DataLoader, which
    draws a base seed from torch's global generator at every pass."""

    def __init__(self, ds):
        self.x, self.y = ds.tensors

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def dropout_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 2))


def _as_items(splits):
    return ee.Splits(**{n: Items(d) for n, d in splits.named().items()})


def evaluations(monkeypatch, with_method=False):
    """The tags (or (method, tag) pairs) of every `Run.evaluate` from now on, in order."""
    tags, real = [], Run.evaluate

    def counting(self, tag, check_finite=False):
        tags.append((self.method, tag) if with_method else tag)
        return real(self, tag, check_finite)
    monkeypatch.setattr(Run, "evaluate", counting)
    return tags


@pytest.mark.parametrize("method", ["two_stage", "ft"])
def test_original_evaluation_is_reused_with_bit_identical_runs(small, monkeypatch, method):
    """Inside the scope θ0 is evaluated once for the runs of one seed and settings; a reusing run's
    parameters and report evaluations equal those of a run outside the scope to the bit (the
    generators are left as the evaluation leaves them: Dataset splits draw a DataLoader seed from
    the global generator, and FT's dropout, in train mode, then draws from it); another seed
    evaluates anew."""
    splits = _as_items(small)
    ft = dataclasses.replace(get_method("ft").config_for("digits"), train_mode=True)   # dropout on
    kw = {"config": tiny_config()} if method == "two_stage" else {"method": "ft", "config": ft}
    tags = evaluations(monkeypatch)

    def run(seed):
        res = ee.unlearn(dropout_mlp(), splits, seed=seed, progress=False, **kw)
        return params(res.model), res.report

    alone, alone_rep = run(0)
    assert tags.count("original") == 1
    tags.clear()
    with original_eval_scope():
        first, _ = run(0)
        second, rep = run(0)
        assert tags.count("original") == 1   # the second run took the first one's evaluation
        other, _ = run(1)
        assert tags.count("original") == 2   # another seed: another generator state, evaluated
    assert torch.equal(first, alone) and torch.equal(second, alone)
    assert rep["evals"]["original"] == alone_rep["evals"]["original"]
    assert rep["evals"]["final"] == alone_rep["evals"]["final"]
    assert not torch.equal(other, alone)


def test_original_evaluation_not_reused_for_another_model_or_batch_size(small, monkeypatch):
    tags = evaluations(monkeypatch)
    cfg = tiny_config()
    with original_eval_scope():
        ee.unlearn(mlp(0), small, config=cfg, seed=0, progress=False)
        ee.unlearn(mlp(1), small, config=cfg, seed=0, progress=False)   # other weights
        ee.unlearn(mlp(0), small, config=tiny_config(eval_batch_size=7), seed=0, progress=False)
    assert tags.count("original") == 3


def test_compare_evaluates_the_original_once_per_seed(small, monkeypatch):
    tags = evaluations(monkeypatch, with_method=True)
    net = mlp()
    res = ee.compare(net, small, ["ga", "gdr", "neggrad_plus"], seeds=[0, 1], setting="digits", relearn=False,
                     progress=False)
    assert [t for t in tags if t[1] == "original"] == [("ga", "original")] * 2   # once per seed
    assert all(res.runs[m][s]["acc_forget"] is not None for m in ("gdr", "neggrad_plus") for s in (0, 1))


def test_per_sample_of_outputs_equals_per_sample(small):
    """The logits `evaluate` keeps give `per_sample`'s values to the bit (same batch size)."""
    m = mlp(3)
    outputs = {}
    ee.evaluate(m, small, batch_size=16, outputs=outputs)
    assert sorted(outputs) == sorted(small.named())
    for name in small.named():
        mine = per_sample_of_outputs(outputs[name], name)
        ref = per_sample(m, small.source(name), batch_size=16, name=name)
        assert set(mine) == set(ref) and all(torch.equal(mine[k], ref[k]) for k in ref)
    with pytest.raises(NonFiniteOutputError, match="split 'forget'"):
        logits, y = outputs["forget"][0]
        per_sample_of_outputs([(logits * float("nan"), y)], "forget")


def test_compare_metrics_reuse_the_runs_float32_evaluation(small, monkeypatch):
    """A float32 run's last evaluation feeds the MIA (no second pass over the splits); the metrics
    equal those of the metrics' own pass. An autocast (bf16) run's evaluation is not used."""
    calls = []
    real = mia_mod.per_sample

    def counting(model, dataset, **kw):
        calls.append(kw.get("name"))
        return real(model, dataset, **kw)
    monkeypatch.setattr(mia_mod, "per_sample", counting)
    net = mlp()
    kw = dict(seeds=[0], setting="digits", relearn=False, progress=False)
    res = ee.compare(net, small, ["ga"], **kw)
    # no per_sample pass: GA's values came from its run's last evaluation, the original row's from
    # the evaluation unlearning_metrics makes itself
    assert calls == []
    n_mia = 5   # the MIA reads every split but forget_test

    class Off(FinalOutputs):   # the scope without the reuse: every run's own per_sample pass
        def features(self, *a, **k):
            return None
    monkeypatch.setattr(C, "FinalOutputs", Off)
    calls.clear()
    ref = ee.compare(net, small, ["ga"], **kw)
    assert sorted(calls) == ["adjacent", "adjacent_test", "forget", "remote", "remote_test"]
    strip = (lambda r: {k: v for k, v in r.items() if k != "time_s"})
    assert strip(res.runs["ga"][0]) == strip(ref.runs["ga"][0])
    assert strip(res.runs["original"][0]) == strip(ref.runs["original"][0])
    monkeypatch.setattr(C, "FinalOutputs", FinalOutputs)
    calls.clear()
    bf16 = dataclasses.replace(get_method("ga").config_for("digits"), amp="bf16")
    ee.compare(net, small, ["ga"], configs={"ga": bf16}, **kw)   # autocast: the metrics' own float32 pass
    assert len(calls) == n_mia


def test_features_not_used_for_another_model_batch_size_or_memory_format(small):
    m = mlp(3)
    with FinalOutputs() as kept:
        ee.evaluate(m, small, batch_size=16)   # outside a run: nothing kept
        assert kept.features(m, batch_size=16, channels_last=False) is None
        outputs = {}
        ee.evaluate(m, small, batch_size=16, outputs=outputs)
        kept.record(m, outputs, batch_size=16, channels_last=False)
        assert kept.features(m, batch_size=16, channels_last=False) is not None
        assert kept.features(m, batch_size=512, channels_last=False) is None
        assert kept.features(m, batch_size=16, channels_last=True) is None
        assert kept.features(mlp(4), batch_size=16, channels_last=False) is None   # other weights


class Counting(torch.nn.Module):
    """`mlp` that counts the samples of its forward passes."""

    def __init__(self):
        super().__init__()
        self.net, self.samples = mlp(5), 0

    def forward(self, x):
        self.samples += x.shape[0]
        return self.net(x)


def test_unlearning_metrics_without_evals_passes_each_split_once(small):
    """Without ``evals`` its evaluation also gives the MIA's per-sample values: one forward pass per
    split, and the same metrics as the former evaluation + per_sample passes."""
    m = Counting()
    new = M.unlearning_metrics(m, small, seed=1)
    assert m.samples == sum(len(d) for d in small.named().values())
    old = M.unlearning_metrics(m, small, seed=1, features={n: per_sample(m, small.source(n), name=n)
                                                          for n in M.MIA_SPLITS})
    assert {k: v for k, v in new.items() if k != "time_s"} == {k: v for k, v in old.items() if k != "time_s"}
