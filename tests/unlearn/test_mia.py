"""MIA-efficacy without signal (issue 24 item 10): when the SVC cannot tell its own members from its
non-members (balanced accuracy <= MIA_MIN_BALANCED_ACCURACY) the score is NaN with an
MIAUndefinedWarning, and every consumer (summary, table, bold, JSON, plot, cache, average gap)
treats it as undefined instead of as a coin-flip 0 or 100 %."""
import functools
import importlib
import json
import math

import pytest
import torch
from torch.utils.data import TensorDataset

import entangle_ext as ee
from entangle_ext.compare_report import format_markdown, plot_comparison, summarize
from entangle_ext.unlearn import metrics as M

C = importlib.import_module("entangle_ext.compare")   # the module (ee.compare is the function)
CC = importlib.import_module("entangle_ext.compare_cache")

pytestmark = pytest.mark.usefixtures("one_thread")


def _old(monkeypatch):
    """The code before the fix: every attack counts, whatever its balanced accuracy."""
    mia = importlib.import_module("entangle_ext.unlearn.mia")
    monkeypatch.setattr(mia, "mia_efficacy_from_features",
                        functools.partial(mia.mia_efficacy_from_features, min_balanced_accuracy=-1.0))


def _strict_loads(text):
    def no_constant(c):
        raise ValueError(f"non-standard JSON constant {c}")
    return json.loads(text, parse_constant=no_constant)


# ------------------------------------------------------------------ (a) and (b): the rule itself
def test_identical_members_and_nonmembers_is_nan_with_a_warning():
    pytest.importorskip("sklearn")
    assert issubclass(ee.MIAUndefinedWarning, UserWarning) and ee.MIAUndefinedWarning is M.MIAUndefinedWarning
    same = torch.full((40,), 0.7, dtype=torch.float64)
    targets = {"forget": torch.full((10,), 0.7), "remote": torch.full((5,), 0.1)}
    old = M.mia_efficacy_from_features(same, same, targets, min_balanced_accuracy=-1.0)
    assert set(old.values()) <= {0.0, 100.0}                 # the coin flip this replaces
    with pytest.warns(M.MIAUndefinedWarning, match=r"\['forget', 'remote'\].*balanced accuracy .* 0\.500 <= 0\.55"):
        out = M.mia_efficacy_from_features(same, same, targets)
    assert set(out) == {"forget", "remote"} and all(math.isnan(v) for v in out.values())


def test_separable_case_keeps_its_value(recwarn):
    pytest.importorskip("sklearn")
    from sklearn import svm
    members, nonmembers = torch.full((40,), 0.99), torch.full((40,), 0.2)
    t = torch.tensor([0.99, 0.99, 0.99, 0.2])
    s = M.mia_efficacy_from_features(members, nonmembers, {"t": t})
    x = torch.cat([members, nonmembers]).double().numpy()[:, None]        # the pre-fix computation
    clf = svm.SVC(C=3, gamma="auto", kernel="rbf").fit(x, [1] * 40 + [0] * 40)
    assert s["t"] == 100.0 * float((clf.predict(t.double().numpy()[:, None]) == 0).mean()) == 25.0
    assert not [w for w in recwarn if issubclass(w.category, M.MIAUndefinedWarning)]


# ------------------------------------------------------------------ (d) the GA-on-digits collapse
class Parity(torch.nn.Module):
    """p_true = 1 on even classes and ≈ 0 on odd ones (the argmax is the next class), exactly the
    same value for every sample of a class: a collapsed model with no member / non-member signal."""

    def __init__(self):
        super().__init__()
        self.register_buffer("anchor", torch.zeros((), dtype=torch.float64))   # (a device to run on)

    def forward(self, x):
        c = x.argmax(1)
        target = torch.where(c % 2 == 0, c, (c + 1) % 10)
        return 40.0 * torch.nn.functional.one_hot(target, 10).double()


def _parity_splits():
    def ds(classes, per):
        y = torch.tensor(classes).repeat_interleave(per)
        return TensorDataset(torch.nn.functional.one_hot(y, 10).double(), y)
    return ee.Splits(forget=ds([1], 50), adjacent=ds([3, 5], 100), remote=ds([0, 2], 100),
                     adjacent_test=ds([3, 5], 50), remote_test=ds([0, 2], 50))


def test_collapsed_model_was_a_coin_flip_per_seed_and_is_now_undefined(monkeypatch):
    pytest.importorskip("sklearn")
    model, s = Parity(), _parity_splits()
    seeds = range(6)
    with monkeypatch.context() as mp:
        _old(mp)
        old = [M.mia_efficacy(model, s, seed=k)["forget"] for k in seeds]
    assert set(old) == {0.0, 100.0}                          # 100 / 0 with the member subset's seed
    for k in seeds:
        with pytest.warns(M.MIAUndefinedWarning, match="balanced accuracy"):
            out = M.mia_efficacy(model, s, seed=k)
        assert all(math.isnan(v) for v in out.values()), (k, out)
    with pytest.warns(M.MIAUndefinedWarning):
        um = M.unlearning_metrics(model, s)
    assert math.isnan(um["mia_forget"]) and math.isnan(um["mia_adjacent"]) and math.isnan(um["mia_remote"])


def test_average_gap_skips_an_undefined_mia():
    m = {"UA": 10.0, "RA": 90.0, "TA": 80.0, "mia_forget": math.nan}
    r = {"UA": 20.0, "RA": 95.0, "TA": 80.0, "mia_forget": 30.0}
    assert M.average_gap(m, r) == pytest.approx(5.0) == M.average_gap(r, m)
    with pytest.raises(ValueError, match="defined in both"):
        M.average_gap({"mia_forget": math.nan}, r, keys=("mia_forget",))
    assert "NaN" in M.METRICS["mia_forget"].source


# ------------------------------------------------------------------ (c) summary, table, JSON, plot, cache
def _runs():
    nan = math.nan
    return {"retrain": {k: {"UA": 20.0, "mia_forget": 30.0} for k in range(3)},
            "ga": {0: {"UA": 50.0, "mia_forget": nan}, 1: {"UA": 51.0, "mia_forget": 40.0},
                   2: {"UA": 52.0, "mia_forget": 60.0}},
            "rl": {k: {"UA": 40.0, "mia_forget": nan} for k in range(3)},
            "salun": {k: {"UA": 30.0, "mia_forget": 45.0 + k} for k in range(3)}}


def test_summary_and_table_leave_undefined_values_out():
    summary = summarize(_runs())
    ga = summary["ga"]["mia_forget"]
    assert ga["mean"] == 50.0 and ga["n"] == 2 and ga["undefined"] == 1
    assert ga["std"] == pytest.approx(math.sqrt(200.0))
    assert summary["rl"]["mia_forget"] == {"mean": None, "std": None, "n": 0, "undefined": 3}
    assert "undefined" not in summary["salun"]["mia_forget"]
    table = format_markdown(summary, seeds=[0, 1, 2], order=list(_runs()), band=None)   # (no original row)
    rows, mia = _cells(table, "MIA forget ↑")
    assert rows["rl"] == "–"                                        # undefined on every seed, never bold
    assert rows["ga"] == "**50.0 ± 14.1 (2/3)**"                     # best of the defined means (50 > 46)
    assert rows["salun"] == "46.0 ± 1.0" and rows["retrain"] == "30.0 ± 0.0"
    assert "balanced accuracy <= 0.55" in table
    # ga undefined on every seed too: salun is the only defined unlearning row, nothing to rank
    runs = _runs()
    runs["ga"][1]["mia_forget"] = runs["ga"][2]["mia_forget"] = math.nan
    rows2, _ = _cells(format_markdown(summarize(runs), seeds=[0, 1, 2], order=list(runs), band=None), "MIA forget ↑")
    assert rows2 == {"retrain": "30.0 ± 0.0", "ga": "–", "rl": "–", "salun": "46.0 ± 1.0"}


def _cells(table, col):
    """{method: the cell of column ``col``} of a markdown table."""
    lines = [ln for ln in table.splitlines() if ln.startswith("| ")]
    j = [c.strip() for c in lines[0].split("|")].index(col)
    return {ln.split("|")[1].strip(): ln.split("|")[j].strip() for ln in lines[1:]}, j


def test_json_has_null_and_the_plot_skips_undefined_bars(tmp_path):
    runs = _runs()
    summary = summarize(runs)
    res = C.ComparisonResult(table=format_markdown(summary, seeds=[0, 1, 2]), summary=summary, runs=runs,
                             seeds=[0, 1, 2], methods=list(runs))
    C._write(res, tmp_path, "fp")
    text = (tmp_path / "comparison.json").read_text()
    assert ": NaN" not in text                                       # (strict parse below)
    js = _strict_loads(text)
    assert js["runs"]["ga"]["0"]["mia_forget"] is None and js["runs"]["ga"]["1"]["mia_forget"] == 40.0
    assert js["summary"]["rl"]["mia_forget"]["mean"] is None and js["summary"]["ga"]["mia_forget"]["n"] == 2
    pytest.importorskip("matplotlib")
    plot_comparison(summary, str(tmp_path / "c.png"))              # an all-undefined bar is left out
    assert (tmp_path / "c.png").stat().st_size > 0


def test_cached_nan_loads_back_as_nan(tmp_path):
    cache = CC.ResultCache(tmp_path)
    rec = {"key": "k", "method": "ga", "seed": 0, "metrics": {"UA": 50.0, "mia_forget": math.nan,
                                                              "mia_adjacent": None}}
    cache.save("ga", 0, rec)
    text = cache.path("ga", 0).read_text()
    assert "NaN" not in text and _strict_loads(text)["metrics"]["mia_forget"] is None
    back = cache.load("ga", 0, "k")
    assert math.isnan(back["metrics"]["mia_forget"]) and back["metrics"]["mia_adjacent"] is None
    assert back["metrics"]["UA"] == 50.0
