"""The pieces of the report every run writes (entangle_ext.unlearn.report): the accuracy table,
the forget-loss histogram and the split fingerprint; and those of a comparison
(entangle_ext.compare_report): the summary over seeds and the markdown table."""
import math

import pytest
import torch

_EVALS = {t: {n: {"acc": a, "loss": l, "n": 4} for n, (a, l) in row.items()} for t, row in {
    "original": {"forget": (1.0, 0.01), "adjacent": (1.0, 0.02), "remote": (0.75, 0.3),
                 "forget_test": (0.5, 0.7), "adjacent_test": (1.0, 0.1), "remote_test": (1.0, 0.05)},
    "stage1": {"forget": (0.0, 25.35), "adjacent": (0.25, 9.5), "remote": (1.0, 0.0),
               "forget_test": (0.0, 20.0), "adjacent_test": (0.0, 9.0), "remote_test": (1.0, 0.01)},
    "stage2": {"forget": (0.0, 24.5), "adjacent": (1.0, 0.01), "remote": (1.0, 0.0),
               "forget_test": (0.25, 19.0), "adjacent_test": (0.75, 0.2), "remote_test": (0.75, 0.02)}}.items()}


def test_format_table_blocks_directions_and_change():
    from entangle_ext.unlearn.report import format_table
    t = format_table(_EVALS)
    lines = t.splitlines()
    assert max(map(len, lines)) <= 100
    train, held = lines.index(next(l for l in lines if l.startswith("train "))), \
        lines.index(next(l for l in lines if l.startswith("held-out ")))
    assert "forget ↓" in lines[train] and "adjacent ↑" in lines[train] and "remote ↑" in lines[train]
    row = lambda block, tag: next(l for l in lines[block:] if l.startswith(tag)).split()
    assert row(train, "original") == ["original", "100.00", "0.01", "100.00", "0.02", "75.00", "0.30"]
    assert row(train, "stage1") == ["stage1", "0.00", "-100.00", "25.35", "25.00", "-75.00", "9.50",
                                    "100.00", "+25.00", "0.00"]
    assert row(held, "stage2") == ["stage2", "25.00", "-25.00", "19.00", "75.00", "-25.00", "0.20",
                                   "75.00", "-25.00", "0.02"]
    only_train = {t: {n: r for n, r in e.items() if not n.endswith("_test")} for t, e in _EVALS.items()}
    assert "held-out" not in format_table(only_train)


def test_histogram_overlays_the_stages_and_labels_log_c(tmp_path):
    from entangle_ext.unlearn.report import forget_histogram_figure, plot_forget_histograms
    ev = {t: {n: dict(r) for n, r in e.items()} for t, e in _EVALS.items()}
    for t, shift in (("original", 0.0), ("stage1", 20.0), ("stage2", 18.0)):
        ev[t]["forget"]["losses"] = [shift + 0.1 * i for i in range(4)]
    fig = forget_histogram_figure(ev, bins=10, num_classes=4)
    stages = fig.axes[-1]
    labels = stages.get_legend_handles_labels()[1]
    assert any(l.startswith("after Stage 1") for l in labels) and any(l.startswith("after Stage 2") for l in labels)
    assert any(l.startswith(f"log C = {math.log(4):.2f} nats") for l in labels)
    assert len(stages.patches) == 2                      # the two stage distributions, on one axes
    assert "nats" in stages.get_xlabel()
    assert plot_forget_histograms(ev, str(tmp_path / "h.png"), bins=10, num_classes=4) == str(tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 0


def test_split_fingerprint_sees_labels_sizes_and_inputs():
    from entangle_ext.unlearn import Splits
    from entangle_ext.unlearn.report import split_fingerprint
    x, y = torch.rand(6, 3), torch.tensor([0, 1, 0, 1, 0, 1])
    td = torch.utils.data.TensorDataset
    mk = lambda x, y: Splits(forget=td(x[:2], y[:2]), adjacent=td(x[2:4], y[2:4]), remote=td(x[4:], y[4:]))
    a = split_fingerprint(mk(x, y))
    assert a == split_fingerprint(mk(x.clone(), y.clone().int()))      # label dtype does not matter
    assert {k: v["n"] for k, v in a.items()} == {"forget": 2, "adjacent": 2, "remote": 2}
    assert split_fingerprint(mk(x, 1 - y)) != a and split_fingerprint(mk(x + 1, y)) != a

    class Dicts(torch.utils.data.Dataset):                                 # HF-style dict items
        def __init__(self, y):
            self.y = y

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return {"input_ids": torch.zeros(3, dtype=torch.long), "labels": self.y[i]}
    d = lambda y: Splits(forget=Dicts(y[:2]), adjacent=Dicts(y[2:4]), remote=Dicts(y[4:]))
    assert split_fingerprint(d(y)) == split_fingerprint(d(y)) != split_fingerprint(d(1 - y))


# ------------------------------------------------------------------ comparison table (compare_report)
def _runs(methods, seeds):
    """{method: {seed: metrics}}: UA = 10·(row index + 1) + seed, so the rows rank as listed."""
    return {m: {k: {"UA": 10.0 * (i + 1) + k, "TA": 50.0 - i} for k in seeds} for i, m in enumerate(methods)}


def test_one_seed_has_no_std_and_the_table_no_plus_minus(tmp_path):
    import json
    from entangle_ext.compare_report import format_markdown, plot_comparison, summarize
    summary = summarize(_runs(["original", "ga", "rl"], [0]))
    assert summary["ga"]["UA"] == {"mean": 20.0, "std": None, "n": 1}      # undefined, not 0
    assert json.loads(json.dumps(summary))["ga"]["UA"]["std"] is None      # stored as null
    table = format_markdown(summary, seeds=[0], order=["original", "ga", "rl"], band=None)   # (no accuracies)
    assert "±" not in table and "| **30.0** |" in table                    # rl: the best UA ↑ of the two
    assert "no std" in table and "ddof" not in table
    plot_comparison(summary, str(tmp_path / "c.png"))                      # no error bars, no error
    two = summarize(_runs(["ga", "rl"], [0, 1]))
    assert two["rl"]["UA"]["std"] == pytest.approx(2 ** -0.5)             # ddof 1 of (20, 21)
    t2 = format_markdown(two, seeds=[0, 1])
    assert "20.5 ± 0.7" in t2 and "Mean ± std (ddof 1)" in t2


def test_bold_only_with_two_or_more_unlearning_methods():
    from entangle_ext.compare_report import format_markdown, summarize
    rows = lambda t: [ln for ln in t.splitlines() if ln.startswith("| ") and not ln.startswith("| method")]
    one = format_markdown(summarize(_runs(["retrain", "original", "two_stage"], [0, 1])), seeds=[0, 1], band=None)
    assert "**" not in "\n".join(rows(one)) and "no value is bold" in one
    two = format_markdown(summarize(_runs(["retrain", "original", "ga", "rl"], [0, 1])), seeds=[0, 1], band=None)
    bold = [ln.split("|")[1].strip() for ln in rows(two) if "**" in ln]
    assert bold == ["ga", "rl"]                       # rl: best UA ↑; ga: best TA ↑; references never
    assert "**bold** = best among the unlearning methods" in two
