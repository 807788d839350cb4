"""Issue 24 item 12: a missing optional dependency is named (with the extra that brings it) before
any work, and a missing matplotlib skips only the plots: the report and tables are written."""
import json
import sys

import pytest

import entangle_ext as ee
from entangle_ext import cli
from _tiny import mlp, tiny_config


def _block(monkeypatch, top):
    """Make ``import top`` (and its submodules) raise ImportError for this test."""
    for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, top, None)


def test_compare_without_sklearn_fails_before_any_run(small, monkeypatch, tmp_path):
    import importlib
    entry = importlib.import_module("entangle_ext.unlearn.entry")

    def no_run(*a, **k):
        raise AssertionError("a method ran before the metrics' dependencies were checked")
    monkeypatch.setattr(entry, "run_method", no_run)   # the one lifecycle of every method
    _block(monkeypatch, "sklearn")
    with pytest.raises(ImportError, match=r"MIA-efficacy .* needs scikit-learn.*entangle_ext\[metrics\]|"
                                          r"MIA-efficacy .* needs scikit-learn.*\.\[metrics\]"):
        ee.compare(mlp(), small, methods=["ft"], seeds=[0], setting="digits", out_dir=tmp_path / "cmp")
    assert not any((tmp_path / "cmp").rglob("*.json")) if (tmp_path / "cmp").exists() else True


def test_cli_without_sklearn_names_the_extra(monkeypatch, tmp_path, capsys):
    _block(monkeypatch, "sklearn")
    rc = cli.main(["--setting", "digits", "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert len(err) == 1 and "needs scikit-learn" in err[0] and "[demo]" in err[0], err


def test_without_matplotlib_the_report_is_written_and_the_plot_skipped(small, monkeypatch, tmp_path):
    from entangle_ext.unlearn.report import PlotSkippedWarning
    _block(monkeypatch, "matplotlib")
    with pytest.warns(PlotSkippedWarning, match="forget_loss_hist.png is not drawn"):
        res = ee.unlearn(mlp(), small, tiny_config(), out_dir=tmp_path / "run", progress=False)
    rep = json.loads((tmp_path / "run" / "report.json").read_text())
    assert rep["histogram_png"] is None and rep["evals"]["final"] == res.report["evals"]["final"]
    assert (tmp_path / "run" / "history.json").exists()
    assert not (tmp_path / "run" / "forget_loss_hist.png").exists()


def test_without_matplotlib_the_cli_exits_0_with_a_report(monkeypatch, tmp_path, capsys):
    pytest.importorskip("sklearn")
    _block(monkeypatch, "matplotlib")
    out = tmp_path / "o"
    rc = cli.main(["--setting", "digits", "--variant", "reduced", "--out", str(out), "--no-progress",
                   "--set", "stage2.epochs=1", "--original-epochs", "2"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert (out / "report.json").exists() and "warning: matplotlib is not installed" in err


def test_without_matplotlib_compare_exits_0_and_lists_what_it_wrote(monkeypatch, tmp_path, capsys):
    """It wrote the tables, then died on res.paths['png'] (KeyError, exit 1)."""
    pytest.importorskip("sklearn")
    pytest.importorskip("scipy")
    _block(monkeypatch, "matplotlib")
    out = tmp_path / "c"
    rc = cli.main(["compare", "--setting", "digits", "--variant", "reduced", "--methods", "ga", "--seeds", "1",
                   "--no-relearn", "--no-progress", "--out", str(out), "--budget", "0.1"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    wrote = [line for line in cap.out.splitlines() if line.startswith("wrote ")]
    assert wrote == [wrote[0]] and str(out / "comparison.md") in wrote[0] and ".png" not in wrote[0]
    assert (out / "comparison.json").exists() and not (out / "comparison.png").exists()
