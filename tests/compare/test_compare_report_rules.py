"""The comparison table does not reward degenerate results (issue 24 item 11): bold only among the
unlearning methods that keep the adjacent and remote splits within a stated band of the original
model (the rule is the line under the table), the KS statistic D beside the p-value, and relearn
time with a resolution that separates models that forgot to different depths."""
import copy

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from _tiny import mlp
from entangle_ext.compare_report import BOLD_BAND, format_markdown, summarize
from entangle_ext.unlearn import metrics as M


def _cells(table):
    """{method: {column header: cell}} of a markdown table."""
    lines = [ln for ln in table.splitlines() if ln.startswith("| ")]
    head = [c.strip() for c in lines[0].split("|")[1:-1]]
    return {ln.split("|")[1].strip(): dict(zip(head, (c.strip() for c in ln.split("|")[1:-1]))) for ln in lines[1:]}


def _runs():
    """Two seeds each: "wiped" has the best forget value (0) but wipes the adjacent split; "good" and
    "fair" keep adjacent / remote within a few points of the original."""
    rows = {"retrain": (85.0, 99.0, 98.0), "original": (96.0, 99.0, 98.0), "wiped": (0.0, 0.0, 100.0),
            "good": (5.0, 97.0, 97.5), "fair": (20.0, 98.5, 98.0)}
    return {m: {s: {"acc_forget_test": f + s, "acc_adjacent_test": a, "acc_remote_test": r, "avg_gap": 10.0 - s}
                for s in (0, 1)} for m, (f, a, r) in rows.items()}


def test_a_degenerate_best_value_is_not_bold_and_a_method_within_the_band_is():
    table = format_markdown(summarize(_runs()), seeds=[0, 1])
    cells = _cells(table)
    assert cells["wiped"]["forget test acc ↓"] == "0.5 ± 0.7"                  # the best forget value ...
    assert not any("**" in c for c in cells["wiped"].values())                 # ... but outside the band: bold nowhere
    assert cells["good"]["forget test acc ↓"] == "**5.5 ± 0.7**"               # within the band: the best
    assert cells["fair"]["adjacent test acc ↑"] == "**98.5 ± 0.0**"            # (remote 100 of "wiped" is not)
    assert (cells["good"]["remote test acc ↑"], cells["fair"]["remote test acc ↑"]) == ("97.5 ± 0.0", "**98.0 ± 0.0**")
    assert not any("**" in c for m in ("retrain", "original") for c in cells[m].values())
    rule = [ln for ln in table.splitlines() if ln.startswith("Bold rule:")]
    assert len(rule) == 1 and f"within {BOLD_BAND:g} points (either way) of the original" in rule[0]
    assert "adjacent test acc and remote test acc" in rule[0] and "Within the band: good, fair" in rule[0]
    assert "outside: wiped" in rule[0]


def test_means_that_print_the_same_are_bold_together():
    """Bold follows the printed digits: 5.51 and 5.54 both print 5.5, so both are the best on the
    page (ranking the unrounded means bolded one of two identical-looking cells)."""
    runs = _runs()
    for s in (0, 1):
        runs["good"][s]["acc_forget_test"] = 5.51 + s
        runs["fair"][s].update(acc_forget_test=5.54 + s, avg_gap=10.04 - s)   # avg_gap 9.5 vs 9.54: 9.5 both
    cells = _cells(format_markdown(summarize(runs), seeds=[0, 1]))
    assert cells["good"]["forget test acc ↓"] == "**6.0 ± 0.7**"
    assert cells["fair"]["forget test acc ↓"] == "**6.0 ± 0.7**"
    gap = next(h for h in cells["good"] if h.startswith("avg"))
    assert cells["good"][gap].startswith("**9.5") and cells["fair"][gap].startswith("**9.5")
    runs["fair"][0]["acc_forget_test"] = 5.71   # mean 6.125: prints 6.1, no longer a tie
    cells = _cells(format_markdown(summarize(runs), seeds=[0, 1]))
    assert cells["good"]["forget test acc ↓"] == "**6.0 ± 0.7**" and "**" not in cells["fair"]["forget test acc ↓"]


def test_the_band_is_an_argument_and_too_few_within_it_means_no_bold():
    summary = summarize(_runs())
    wide = format_markdown(summary, seeds=[0, 1], band=200.0)        # every method within: "wiped" ranks again
    assert _cells(wide)["wiped"]["forget test acc ↓"] == "**0.5 ± 0.7**" and "within 200 points" in wide
    narrow = format_markdown(summary, seeds=[0, 1], band=1.0)        # only "fair": one method, nothing to rank
    assert "**" not in "\n".join(ln for ln in narrow.splitlines() if ln.startswith("| "))
    assert "no value is bold: fewer than two methods within the band" in narrow
    no_original = {m: v for m, v in summary.items() if m != "original"}
    assert "**" not in format_markdown(no_original, seeds=[0, 1]).split("\n\n")[0]
    for bad, err in ((-1.0, ValueError), (float("nan"), ValueError), ("5", TypeError)):
        with pytest.raises(err, match="band"):
            format_markdown(summary, seeds=[0, 1], band=bad)


def _ecdf_distance(a, b):
    """max |F_a - F_b| over the pooled sample, by hand in float64."""
    a, b = np.sort(np.asarray(a, np.float64)), np.sort(np.asarray(b, np.float64))
    x = np.concatenate([a, b])
    fa = np.searchsorted(a, x, side="right") / a.size
    fb = np.searchsorted(b, x, side="right") / b.size
    return float(np.max(np.abs(fa - fb)))


def test_ks_statistic_is_the_ecdf_distance_and_the_table_shows_it():
    pytest.importorskip("scipy")
    g = np.random.default_rng(0)
    for a, b in (([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]), (g.normal(size=7), g.normal(0.5, 1.0, size=11)),
                 ([0.1, 0.1, 0.3, 0.9], [0.1, 0.2, 0.3])):
        ks = M.forget_ks_test(a, b)
        assert ks["statistic"] == pytest.approx(_ecdf_distance(a, b), abs=1e-15)
        assert ks["pvalue"] == M.forget_quality_ks(a, b) and 0 <= ks["pvalue"] <= 1
    assert M.METRICS["forget_ks"].direction == "down"
    runs = {m: {0: {"forget_quality": p, "forget_ks": d}} for m, p, d in (("a", 1e-260, 0.9), ("b", 1e-250, 0.4))}
    cells = _cells(format_markdown(summarize(runs), seeds=[0], band=None))
    assert cells["b"]["forget KS D ↓"] == "**0.400**" and cells["a"]["forget KS D ↓"] == "0.900"


def _forget_cluster():
    """An MLP that classifies a forget cluster (label 1) and its mirror (label 0) perfectly."""
    g = torch.Generator().manual_seed(0)
    mu = torch.randn(64, generator=g, dtype=torch.float64)
    x = mu + 0.3 * torch.randn(100, 64, generator=g, dtype=torch.float64)
    X, Y = torch.cat([x, -x]), torch.cat([torch.ones(100, dtype=torch.long), torch.zeros(100, dtype=torch.long)])
    net = mlp(0).double()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(200):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(X), Y).backward()
        opt.step()
    return net, TensorDataset(x, torch.ones(100, dtype=torch.long))


def _forgot(net, forget, depth):
    """``net`` with the forget logit lowered until every forget sample is wrong, by ``depth`` more."""
    m = copy.deepcopy(net)
    with torch.no_grad():
        z = m(forget.tensors[0])
        m[2].bias[1] -= (z[:, 1] - z[:, 0]).max() + depth
        assert (m(forget.tensors[0]).argmax(1) == 1).sum() == 0
    return m


def test_relearn_steps_separate_shallow_from_deep_forgetting():
    net, forget = _forget_cluster()
    shallow, deep = _forgot(net, forget, 0.1), _forgot(net, forget, 3.0)
    r = [M.relearn_time(m, forget, threshold=0.9) for m in (shallow, deep)]    # the default schedule
    assert all(x["reached"] for x in r) and r[1]["steps"] > r[0]["steps"] > 1
    # the schedule is the documented one: step k at lr 1e-5 * 1.1**k (a constant lr is lr_growth=1)
    assert (M.RELEARN_LR, M.RELEARN_LR_GROWTH) == (1e-5, 1.1)
    const = M.relearn_time(deep, forget, threshold=0.9, lr=M.RELEARN_LR, lr_growth=1.0, max_steps=r[1]["steps"])
    assert not const["reached"]                                  # the growth is what gets there in these steps
    with pytest.raises(ValueError, match="lr_growth"):
        M.relearn_time(deep, forget, threshold=0.9, lr_growth=0.5)
    from entangle_ext.compare import DEFAULT_RELEARN
    assert DEFAULT_RELEARN["lr"] == M.RELEARN_LR and DEFAULT_RELEARN["lr_growth"] == M.RELEARN_LR_GROWTH
