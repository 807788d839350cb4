"""The fingerprints (entangle_ext/unlearn/fingerprint.py, issue 24 item 5): every item of a user's
own Dataset counts (a relabelling makes `compare` recompute and a resume refuse, naming the split),
the model's forward counts (same weights, other outputs: `compare` recomputes), an unchanged run is
reused and the table says so, and the old names are the one function."""
import dataclasses
import importlib

import pytest
import torch
from torch.utils.data import Dataset

import entangle_ext as ee
from entangle_ext.methods import get_method
from entangle_ext.unlearn import checkpoint as CK, fingerprint as FP, report as R

from _tiny import mlp

C = importlib.import_module("entangle_ext.compare")

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")


class Items(Dataset):
    """A user's own Dataset: items are (tensor, int), no ``.tensors``, no ``.targets``."""

    def __init__(self, x, y):
        self.x, self.y = x, [int(v) for v in y]

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def as_items(splits):
    """The splits as `Items` (new objects over the same data)."""
    def conv(ds):
        return Items(ds.x, ds.y) if isinstance(ds, Items) else Items(*ds.tensors)
    return dataclasses.replace(splits, **{n: conv(ds) for n, ds in splits.named().items()})


def relabel(splits, name="adjacent", rows=(1, 2)):   # rows the old 16-item sample skipped
    ds = getattr(splits, name)
    y = list(ds.y)
    for i in rows:
        y[i] = 1 - y[i]
    return dataclasses.replace(splits, **{name: Items(ds.x, y)})


def counting_spec(calls):
    """A fake method: records the call, returns the model unchanged."""
    def run(model, splits, *, seed, device, progress):
        calls.append(seed)
        return ee.UnlearnResult(model=model, report={})
    return C.MethodSpec("same", run, {})


class Scaled(torch.nn.Sequential):
    """The MLP's layers, logits times ``k`` (a plain attribute: not in the state dict)."""

    def __init__(self, k=2.0):
        super().__init__(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
        self.k = k

    def forward(self, x):
        return self.k * super().forward(x)


@pytest.fixture
def items(small):
    return as_items(small)


def _compare(net, splits, out, calls):
    return ee.compare(net, splits, [counting_spec(calls)], seeds=[0, 1], out_dir=out, progress=False,
                      relearn={"max_steps": 2})


def test_relabelled_user_dataset_recomputes_and_refuses_resume(items, tmp_path, one_thread):
    pytest.importorskip("scipy")
    other = relabel(items)
    a, b = FP.splits_fingerprint(items), FP.splits_fingerprint(other)
    assert a["adjacent"] != b["adjacent"] and {k: v for k, v in a.items() if k != "adjacent"} == \
        {k: v for k, v in b.items() if k != "adjacent"}
    net, calls = mlp(), []
    _compare(net, items, tmp_path / "cmp", calls)
    _compare(net, other, tmp_path / "cmp", calls)
    assert calls == [0, 1, 0, 1]                                      # not taken from the cache
    out = tmp_path / "ft"
    cfg = get_method("ft").config_for("digits", checkpoint_every=2, epochs=1, batch_size=32)
    ee.unlearn(mlp(), items, cfg, method="ft", out_dir=out, progress=False)
    with pytest.raises(ValueError, match=r"resume: the splits differ.*split 'adjacent': same size \(80\) but "
                                         r"different content"):
        ee.unlearn(mlp(), other, None, method="ft", resume=out, progress=False)
    ee.unlearn(mlp(), as_items(items), None, method="ft", resume=out, progress=False)   # same data: resumes


def test_same_weights_other_forward_recomputes(small, tmp_path, one_thread):
    pytest.importorskip("scipy")
    net = mlp()
    scaled = Scaled(2.0)
    scaled.load_state_dict(net.state_dict())
    halved = Scaled(0.5)
    halved.load_state_dict(net.state_dict())
    f = [FP.model_fingerprint(m, small) for m in (net, scaled, halved)]
    assert f[0]["state"] == f[1]["state"] == f[2]["state"] and f[0]["class"] != f[1]["class"] == f[2]["class"]
    assert len({x["outputs"] for x in f}) == 3                        # the forward itself is seen
    assert scaled.training and FP.model_fingerprint(scaled, small) == f[1]     # train flags kept, stable
    calls = []
    for m in (scaled, halved):
        _compare(m, small, tmp_path, calls)
    assert calls == [0, 1, 0, 1]


def test_unchanged_run_is_reused_and_the_table_says_so(items, tmp_path, monkeypatch, one_thread):
    pytest.importorskip("scipy")
    net, calls = mlp(), []
    first = _compare(net, items, tmp_path, calls)
    assert "cached" not in first.table
    again = _compare(net, as_items(items), tmp_path, calls)          # equal data in new objects
    assert calls == [0, 1]
    assert f"cached: original seeds 0,1; same seeds 0,1 (from {tmp_path / 'cache'}; delete to recompute)" \
        in again.table
    assert again.table in (tmp_path / "comparison.md").read_text()


def test_the_old_names_are_the_one_function(small):
    assert CK.splits_fingerprint is FP.splits_fingerprint and R.split_fingerprint is FP.splits_fingerprint
    assert C.fingerprint is FP.fingerprint
    fp = FP.splits_fingerprint(small)
    assert R.split_fingerprint(small) == CK.splits_fingerprint(small) == fp
    assert FP.splits_fingerprint(as_items(small)) == fp               # items, not the container, count
    net = mlp()
    assert C.fingerprint(net, small) == FP.fingerprint(net, small, fp)


def test_the_model_fingerprint_takes_namedtuple_inputs(small):
    """The probe inputs were rebuilt with type(x)(generator), which a namedtuple refuses: `compare`
    died fingerprinting a model whose items are (Halves(a, b), y)."""
    import collections
    Halves = collections.namedtuple("Halves", ["a", "b"])

    class Split(Dataset):
        def __init__(self, tds):
            self.x, self.y = tds.tensors

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return Halves(self.x[i, :32], self.x[i, 32:]), self.y[i]

    class OnHalves(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def forward(self, h):
            return self.net(torch.cat([h.a, h.b], 1))
    splits = dataclasses.replace(small, **{n: Split(ds) for n, ds in small.named().items()})
    first, again = FP.model_fingerprint(OnHalves(), splits), FP.model_fingerprint(OnHalves(), splits)
    assert first == again and "outputs" in first
