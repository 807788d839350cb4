"""Unlearning metrics (entangle_ext.unlearn.metrics): MIA-efficacy on known answers, the KS forget
quality, the average gap, relearn time, the combined dict and the errors of each."""
import dataclasses
import math
import sys

import pytest
import torch
from hypothesis import given, strategies as st
from torch.utils.data import TensorDataset

import entangle_ext as ee
from entangle_ext.data.digits import digits_splits
from entangle_ext.train import TrainRecipe, train_original
from entangle_ext.unlearn import metrics as M

pytestmark = [pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}"),
              pytest.mark.usefixtures("one_thread")]


class Lookup(torch.nn.Module):
    """Memorises (x, y): logits +20 on the stored label of a stored x; all-zero logits (uniform
    probabilities) for any x it never saw."""

    def __init__(self, x, y, num_classes):
        super().__init__()
        self.register_buffer("keys", x)
        self.register_buffer("labels", y)
        self.bias = torch.nn.Parameter(torch.zeros(num_classes))
        self.C = num_classes

    def forward(self, x):
        d = torch.cdist(x, self.keys, compute_mode="donot_use_mm_for_euclid_dist")
        hit = d.min(1).values < 1e-6
        logits = self.bias.expand(len(x), self.C).clone()
        logits[hit, self.labels[d.argmin(1)[hit]]] = 20.0
        return logits


def _data(n, seed, C=10, dim=20):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, dim, generator=g), torch.randint(0, C, (n,), generator=g)


def _splits(forget, retain, held_out):
    ds = lambda xy: TensorDataset(*xy)   # noqa: E731
    half = len(retain[0]) // 2
    return ee.Splits(forget=ds(forget), adjacent=ds((retain[0][:half], retain[1][:half])),
                     remote=ds((retain[0][half:], retain[1][half:])),
                     adjacent_test=ds(held_out), remote_test=None)


# ------------------------------------------------------------------------------ MIA-efficacy
def test_mia_exact_on_a_memorising_lookup_model():
    pytest.importorskip("sklearn")
    seen, retain, unseen, held = _data(30, 1), _data(200, 2), _data(30, 3), _data(150, 4)
    model = Lookup(torch.cat([seen[0], retain[0]]), torch.cat([seen[1], retain[1]]), 10)
    memorised = M.mia_efficacy(model, _splits(seen, retain, held), seed=0)
    never_seen = M.mia_efficacy(model, _splits(unseen, retain, held), seed=0)
    assert memorised == {"forget": 0.0, "adjacent": 0.0, "remote": 0.0}   # all look like members
    assert never_seen["forget"] == 100.0                                  # all look like held-out data


def test_mia_trained_model_memorised_vs_never_seen():
    """An over-parameterised MLP memorises random labels: its memorised set scores ~0 % non-member,
    a set it never saw scores like held-out data (≈ 90 % with 10 classes), higher = more forgotten."""
    pytest.importorskip("sklearn")
    C = 10
    seen, retain, unseen, held = _data(60, 11, C), _data(300, 12, C), _data(60, 13, C), _data(300, 14, C)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(20, 512), torch.nn.ReLU(), torch.nn.Linear(512, C))
    train_original(net, [TensorDataset(*seen), TensorDataset(*retain)],
                   TrainRecipe("adam", lr=3e-3, epochs=150, batch_size=120, schedule="constant"), progress=False)
    feats = {}
    mem = M.mia_efficacy(net, _splits(seen, retain, held), seed=0, features=feats)["forget"]
    new = M.mia_efficacy(net, _splits(unseen, retain, held), seed=0)["forget"]
    n = len(held[0])
    on_held = M.mia_efficacy_from_features(feats["adjacent"]["p_true"][:n], feats["adjacent_test"]["p_true"],
                                           {"held": feats["adjacent_test"]["p_true"]})["held"]
    assert mem <= 5.0
    assert new >= 70.0 and abs(new - on_held) <= 15.0


@given(st.lists(st.floats(0, 1), min_size=1, max_size=12), st.lists(st.floats(0, 1), min_size=1, max_size=12))
def test_mia_from_features_is_the_share_of_one_fixed_classifier(a, b):
    """All targets of one call share one SVC: the score of A ∪ B is the size-weighted mean of the
    scores of A and B, and every score is a percentage."""
    pytest.importorskip("sklearn")
    members = torch.linspace(0.8, 1.0, 20, dtype=torch.float64)
    nonmembers = torch.linspace(0.0, 0.6, 20, dtype=torch.float64)
    A, B = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    s = M.mia_efficacy_from_features(members, nonmembers, {"A": A, "B": B, "AB": torch.cat([A, B])})
    assert all(0.0 <= v <= 100.0 for v in s.values())
    assert s["AB"] == pytest.approx((len(a) * s["A"] + len(b) * s["B"]) / (len(a) + len(b)))


def test_mia_from_features_known_share():
    pytest.importorskip("sklearn")
    members, nonmembers = torch.full((40,), 0.99), torch.full((40,), 0.2)
    s = M.mia_efficacy_from_features(members, nonmembers, {"t": torch.tensor([0.99, 0.99, 0.99, 0.2])})
    assert s["t"] == 25.0


def test_mia_errors(monkeypatch):
    pytest.importorskip("sklearn")
    seen, retain, held = _data(10, 1), _data(40, 2), _data(20, 3)
    model = Lookup(retain[0], retain[1], 10)
    s = _splits(seen, retain, held)
    s.adjacent_test = None
    with pytest.raises(ValueError, match="held-out retain"):
        M.mia_efficacy(model, s)
    with pytest.raises(ValueError, match="max_samples"):
        M.mia_efficacy(model, _splits(seen, retain, held), max_samples=0)
    with pytest.raises(ValueError, match="target"):
        M.mia_efficacy(model, _splits(seen, retain, held), targets=("forget_test",))
    with pytest.raises(ValueError, match="not finite"):
        M.mia_efficacy_from_features(torch.ones(3), torch.tensor([0.1, float("nan")]), {"t": torch.ones(1)})
    with torch.no_grad():
        model.bias[0] = float("nan")
    with pytest.raises(ValueError, match="non-finite logits"):
        M.mia_efficacy(model, _splits(seen, retain, held))
    monkeypatch.setitem(sys.modules, "sklearn.svm", None)
    with pytest.raises(ImportError, match=r"'\.\[metrics\]'.*pip install scikit-learn"):
        M.mia_efficacy_from_features(torch.ones(3), torch.zeros(3), {"t": torch.ones(1)})


def test_mia_with_absent_splits():
    """Without D_adj / D_adj-test the members and non-members are the remote ones; an absent
    target, or no retain-train split at all, is a ValueError naming it."""
    pytest.importorskip("sklearn")
    seen, retain, held = _data(10, 1), _data(40, 2), _data(20, 3)
    model = Lookup(retain[0], retain[1], 10)      # memorises all of D_adj and D_rem
    s = _splits(seen, retain, held)
    remote_only = dataclasses.replace(s, adjacent=None, adjacent_test=None, remote_test=s.adjacent_test)
    assert M.mia_efficacy(model, remote_only, targets=("forget", "remote")) == {"forget": 100.0, "remote": 0.0}
    with pytest.raises(ValueError, match=r"target 'adjacent' is absent.*targets=\('forget', 'remote'\)"):
        M.mia_efficacy(model, remote_only)
    with pytest.raises(ValueError, match="needs retain-train samples"):
        M.mia_efficacy(model, dataclasses.replace(remote_only, remote=None), targets=("forget",))
    out = M.unlearning_metrics(model, remote_only)
    assert out["mia_adjacent"] is None and out["mia_remote"] == 0.0 and out["mia_forget"] == 100.0
    with pytest.raises(ValueError, match="needs the forget train split"):
        M.unlearning_metrics(model, dataclasses.replace(remote_only, forget=None))


# ---------------------------------------------------------------------- gap, KS, relearn time
def test_forget_quality_ks_known_values(monkeypatch):
    pytest.importorskip("scipy")
    assert M.forget_quality_ks([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == pytest.approx(0.1)   # exact: 2 / C(6, 3)
    x = torch.linspace(0, 1, 50)
    assert M.forget_quality_ks(x, x.clone()) == 1.0
    assert M.forget_quality_ks(x, x + 5) < 1e-10
    with pytest.raises(ValueError):
        M.forget_quality_ks([], [1.0])
    with pytest.raises(ValueError):
        M.forget_quality_ks([float("inf")], [1.0])
    monkeypatch.setitem(sys.modules, "scipy.stats", None)
    with pytest.raises(ImportError, match=r"'\.\[metrics\]'.*pip install scipy"):
        M.forget_quality_ks([1.0], [2.0])


def test_average_gap():
    m = {"UA": 10.0, "RA": 90.0, "TA": 80.0, "mia_forget": 50.0}
    r = {"UA": 20.0, "RA": 95.0, "TA": 80.0, "mia_forget": 30.0}
    assert M.average_gap(m, r) == pytest.approx((10 + 5 + 0 + 20) / 4)
    assert M.average_gap({**m, "TA": None}, r) == pytest.approx((10 + 5 + 20) / 3)
    assert M.average_gap(m, m) == 0.0
    with pytest.raises(ValueError):
        M.average_gap({"x": 1}, r)


@pytest.fixture(scope="module")
def digits():
    s, _ = digits_splits(max_train_per_digit=20)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    train_original(net, [s.forget, s.adjacent, s.remote],
                   TrainRecipe("adam", lr=1e-2, epochs=30, batch_size=64, schedule="constant"), progress=False)
    return s, net


def _forgot(net, forget):
    """A copy of ``net`` that gets every forget sample wrong (trained on flipped forget labels)."""
    import copy
    m = copy.deepcopy(net)
    x, y = forget.tensors
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    for _ in range(300):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), 1 - y).backward()
        opt.step()
    assert (m(x).argmax(1) == y).float().mean() == 0
    return m


def test_relearn_time(digits):
    s, net = digits
    forgot = _forgot(net, s.forget)
    before = [p.clone() for p in forgot.parameters()]
    r = M.relearn_time(forgot, s.forget, threshold=0.9, subset=5, lr=1e-2, max_steps=500)
    assert r["reached"] and 0 < r["steps"] < 500 and r["final_acc"] >= 0.9 and r["subset"] == 5
    assert all(torch.equal(a, b) for a, b in zip(before, forgot.parameters()))   # the model is untouched
    capped = M.relearn_time(forgot, s.forget, threshold=0.9, subset=5, lr=1e-6, max_steps=2)
    assert capped == {**capped, "steps": 2, "reached": False}
    assert M.relearn_time(net, s.forget, threshold=0.9)["steps"] == 0       # never forgotten: nothing to relearn
    deeper = M.relearn_time(forgot, s.forget, threshold=0.9, subset=5, lr=1e-3, max_steps=5000)
    assert deeper["steps"] > r["steps"]                                    # smaller steps take longer
    for bad in (dict(threshold=0.0), dict(threshold=0.9, subset=0), dict(threshold=0.9, subset=1.5)):
        with pytest.raises(ValueError):
            M.relearn_time(net, s.forget, **bad)


def test_per_sample_and_relearn_time_score_every_sample_inside_a_distributed_run(digits):
    """Inside a run of 2 ranks (simulated: rank 1's `Dist` as the current one, no collective is
    taken) the metrics are those of one process: their streams are not split over the ranks, so
    per_sample scores every sample and relearn_time steps on whole batches (docs/algorithm.md §11)."""
    from entangle_ext.unlearn import distributed as D
    s, net = digits
    forgot = _forgot(net, s.forget)

    def both():
        return (M.per_sample(net, s.forget, batch_size=16),
                M.relearn_time(forgot, s.forget, threshold=0.9, subset=10, lr=1e-2, max_steps=50, batch_size=4))
    want = both()
    token = D._CURRENT.set(D.Dist(rank=1, world=2, kind="replicated"))
    try:
        got = both()
    finally:
        D._CURRENT.reset(token)
    for k, v in want[0].items():
        assert torch.equal(got[0][k], v), k
    assert got[1] == want[1] and want[1]["steps"] > 0


def test_unlearning_metrics_on_digits(digits):
    pytest.importorskip("sklearn")
    pytest.importorskip("scipy")
    s, net = digits
    forgot = _forgot(net, s.forget)
    with pytest.warns(M.MIAUndefinedWarning):
        ref = M.unlearning_metrics(net, s, keep_losses=True)
    with pytest.warns(M.MIAUndefinedWarning):
        out = M.unlearning_metrics(forgot, s, retrained=ref, seconds=1.5, relearn={"threshold": 0.9, "lr": 1e-2})
    assert set(out) - {"relearn_reached"} <= set(M.METRICS) and all(v.direction in ("up", "down")
                                                                       for v in M.METRICS.values())
    assert out["acc_forget"] == 0.0 and out["UA"] == 100.0 and out["time_s"] == 1.5
    ev = ee.evaluate(forgot, s)
    ra = 100 * (ev["adjacent"]["acc"] * ev["adjacent"]["n"] + ev["remote"]["acc"] * ev["remote"]["n"]) \
        / (ev["adjacent"]["n"] + ev["remote"]["n"])
    assert out["RA"] == pytest.approx(ra)
    # on these 20-per-digit splits both models generalise: the attack has no signal on its own members
    # vs non-members (balanced accuracy 0.51-0.55), so MIA is undefined (it used to read 100 vs 10 at
    # seed 0, but 0 at seed 1: a coin flip, tests/unlearn/test_mia.py) and avg gap is UA, RA, TA's
    assert all(math.isnan(d[f"mia_{k}"]) for d in (out, ref) for k in ("forget", "adjacent", "remote"))
    assert out["avg_gap"] == pytest.approx(M.average_gap(out, ref, keys=("UA", "RA", "TA")))
    assert out["relearn_steps"] > 0 and out["relearn_reached"]
    assert out["avg_gap"] == pytest.approx(M.average_gap(out, ref))
    assert out["forget_quality"] < 1e-6 and len(ref["forget_losses"]) == len(s.forget)
    with pytest.warns(M.MIAUndefinedWarning):
        same = M.unlearning_metrics(net, s, retrained=net)     # a model against itself: no gap
    assert same["avg_gap"] == 0.0 and same["forget_quality"] == 1.0 and "relearn_steps" not in same
    assert not math.isnan(same["TA"])
