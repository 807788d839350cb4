"""Flags that the command lines must not accept silently: a seed outside what the data loaders took
(``--seed -1`` now runs; ``--seed 5e9`` names the flag), a setting-option flag on a setting that
ignores it (``--weights`` / ``--model-path`` with digits, in ``entangle-unlearn`` and ``compare``
alike) and a flag whose feature another flag turns off (``--no-relearn --relearn-steps N``). Each
is one ``...: error: ...`` line and exit code 2, before any data is loaded."""
import json

import pytest
import torch

import entangle_ext as ee
from entangle_ext import cli
from entangle_ext import settings as settings_mod
from entangle_ext.unlearn.fields import SEED_MAX, SEED_MIN

TINY = ["--max-train-per-class", "10", "--original-epochs", "2", "--no-progress", "--epochs", "1",
        "--stage1-epochs", "1", "--batch-limit", "1"]


@pytest.fixture(autouse=True)
def _threads_restored():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _no_prepare(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("prepare() was reached: the input was not validated up front")
    monkeypatch.setattr(settings_mod, "prepare", boom)


def _one_line(capsys, prog="entangle-unlearn"):
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith(f"{prog}: error: ") and "Traceback" not in "\n".join(err), err
    return err[-1]


# ------------------------------------------------------------------------------------ seeds
@pytest.mark.skipif(not ee.available(), reason="extension not loaded")
@pytest.mark.parametrize("seed", ["-1", str(2 ** 40)])
def test_a_documented_seed_outside_scikit_learns_range_runs(seed, tmp_path, capsys):
    pytest.importorskip("sklearn")
    out = tmp_path / "run"
    rc = cli.main(["--setting", "digits", "--out", str(out), "--device", "cpu", f"--seed={seed}", *TINY])
    assert rc == 0, capsys.readouterr().err
    assert json.loads((out / "report.json").read_text())["config"]["seed"] == int(seed)


@pytest.mark.parametrize("flag", ["--seed"])
@pytest.mark.parametrize("value, msg", [("5e9", "(write 5000000000)"), ("1.5", "is not an integer"),
                                        (str(SEED_MAX + 1), "is outside"), (str(SEED_MIN - 1), "is outside")])
def test_a_seed_that_is_not_an_integer_of_the_range_names_the_flag(flag, value, msg, tmp_path, capsys, monkeypatch):
    _no_prepare(monkeypatch)
    with pytest.raises(SystemExit) as e:
        cli.main(["--setting", "digits", "--out", str(tmp_path), f"{flag}={value}"])
    line = _one_line(capsys)
    assert e.value.code == 2 and f"argument {flag}:" in line and msg in line, line
    assert f"[{SEED_MIN}, {SEED_MAX}]" in line


@pytest.mark.parametrize("flag", ["--first-seed", "--model-seed"])
def test_compare_seed_flags_name_themselves(flag, tmp_path, capsys, monkeypatch):
    _no_prepare(monkeypatch)
    with pytest.raises(SystemExit) as e:
        cli.main(["compare", "--setting", "digits", "--out", str(tmp_path / "o"), f"{flag}=5e9"])
    line = _one_line(capsys, "entangle-unlearn compare")
    assert e.value.code == 2 and f"argument {flag}:" in line and "5000000000" in line, line


def test_compare_seeds_past_the_range_are_refused_before_any_data(tmp_path, capsys, monkeypatch):
    _no_prepare(monkeypatch)
    rc = cli.main(["compare", "--setting", "digits", "--out", str(tmp_path / "o"), "--first-seed", str(SEED_MAX - 1),
                   "--seeds", "3"])
    line = _one_line(capsys, "entangle-unlearn compare")
    assert rc == 2 and "--first-seed" in line and "--seeds 3" in line, line


# ------------------------------------------------------------- setting-option flags: one shared check
@pytest.mark.parametrize("flag, takers", [("--weights", "tinyimagenet, celeba"), ("--model-path", "toxigen")])
@pytest.mark.parametrize("command", [[], ["compare"]])
def test_a_model_flag_the_setting_ignores_is_refused(command, flag, takers, tmp_path, capsys, monkeypatch):
    _no_prepare(monkeypatch)
    rc = cli.main([*command, "--setting", "digits", "--out", str(tmp_path / "o"), flag, "X"])
    line = _one_line(capsys, "entangle-unlearn compare" if command else "entangle-unlearn")
    assert rc == 2 and f"{flag} does not apply to setting 'digits'; it applies to {takers} only" in line, line


@pytest.mark.parametrize("command", [[], ["compare"]])
def test_weights_on_toxigen_is_refused_too(command, tmp_path, capsys, monkeypatch):
    _no_prepare(monkeypatch)
    assert cli.main([*command, "--setting", "toxigen", "--out", str(tmp_path / "o"), "--weights", "X"]) == 2
    assert "--weights does not apply to setting 'toxigen'" in _one_line(
        capsys, "entangle-unlearn compare" if command else "entangle-unlearn")


def test_a_data_flag_the_setting_ignores_names_the_flag(tmp_path, capsys, monkeypatch):
    _no_prepare(monkeypatch)
    assert cli.main(["--setting", "digits", "--out", str(tmp_path / "o"), "--max-test-per-class", "3"]) == 2
    assert "--max-test-per-class does not apply to setting 'digits'; it applies to cifar100, tinyimagenet, " \
           "celeba only" in _one_line(capsys)


def test_model_flags_still_reach_the_settings_that_take_them(tmp_path):
    from entangle_ext.cli import compare as cli_compare
    args = cli_compare.build_parser().parse_args(["--setting", "toxigen", "--model-path", "m", "--variant", "reduced"])
    _, _, _, data, model, _, _ = cli_compare._plan(args, str(tmp_path / "o"))
    assert data == {"model_path": "m"} and model == {}
    args = cli_compare.build_parser().parse_args(["--setting", "celeba", "--weights", "w.pth"])
    _, _, variant, data, model, _, _ = cli_compare._plan(args, str(tmp_path / "o"))
    assert model == {"weights": "w.pth"} and variant.name == "full"


# ------------------------------------------------- a flag whose feature another flag turns off
def test_no_relearn_with_relearn_steps_is_refused(tmp_path, capsys, monkeypatch):
    _no_prepare(monkeypatch)
    rc = cli.main(["compare", "--setting", "digits", "--out", str(tmp_path / "o"), "--no-relearn",
                   "--relearn-steps", "5"])
    line = _one_line(capsys, "entangle-unlearn compare")
    assert rc == 2 and "--relearn-steps 5" in line and "--no-relearn" in line, line
    assert not (tmp_path / "o").exists()


def test_micro_batch_takes_auto_as_its_help_says(capsys):
    from entangle_ext.cli.run import build_parser
    ap = build_parser()
    assert ap.parse_args(["--setting", "digits", "--out", "o", "--micro-batch", "auto"]).micro_batch == "auto"
    assert ap.parse_args(["--setting", "digits", "--out", "o", "--micro-batch", "64"]).micro_batch == 64
    with pytest.raises(SystemExit) as ei:
        ap.parse_args(["--setting", "digits", "--out", "o", "--micro-batch", "many"])
    assert ei.value.code == 2
    assert "argument --micro-batch: 'many' is not an int >= 1 or 'auto'" in capsys.readouterr().err


def test_compare_help_gives_the_defaults_that_start_hours_of_work(capsys):
    with pytest.raises(SystemExit):
        cli.main(["compare", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "'all' (default: every method" in out and "(default 3;" in out
    for help_line in ("--data-root DATA_ROOT data file or directory", "--mia-max-samples MIA_MAX_SAMPLES cap on",
                      "--no-progress no progress bars"):
        assert help_line in out, help_line


def test_package_warnings_print_as_one_line_in_both_commands(tmp_path, capsys):
    """Warnings of the package (its categories, and those raised from its files, e.g. more threads
    than CPUs) were printed by Python with a source path and the echoed line, beside the
    commands' own one-line 'warning:' style."""
    import os
    too_many = len(os.sched_getaffinity(0)) + 1
    assert cli.main(["--setting", "digits", "--out", str(tmp_path / "r"), "--threads", str(too_many), *TINY]) == 0
    err = capsys.readouterr().err
    assert f"entangle-unlearn: warning: {too_many} torch threads on " in err and "RuntimeWarning" not in err
    assert cli.main(["compare", "--setting", "digits", "--variant", "reduced", "--methods", "ga", "--seeds", "1",
                     "--out", str(tmp_path / "c"), "--no-progress"]) == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "arning" in ln]
    assert lines and all(ln.startswith("entangle-unlearn compare: warning: ") for ln in lines), lines


def test_an_interrupted_compare_says_what_it_kept(tmp_path, capsys, monkeypatch):
    """It said "finished runs are cached in OUT/cache" when no run had finished (no cache existed)."""
    import importlib
    mod = importlib.import_module("entangle_ext.cli.compare")

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(mod, "_compare", interrupted)
    argv = ["compare", "--setting", "digits", "--methods", "ga", "--seeds", "1", "--out", str(tmp_path), "--no-progress"]
    assert cli.main(argv) == 130
    assert "interrupted; no run had finished, so none is cached" in capsys.readouterr().err
    (tmp_path / "cache" / "ga").mkdir(parents=True)
    (tmp_path / "cache" / "ga" / "seed0.json").write_text("{}")
    assert cli.main(argv) == 130
    assert f"interrupted; 1 finished run(s) are cached in {tmp_path}/cache" in capsys.readouterr().err


@pytest.mark.parametrize("argv, starts", [
    (["--epochs", "-1"], "--epochs -1: Stage2Config.epochs must be >= 0"),
    (["--alpha", "1.5"], "--alpha 1.5: Stage2Config.alpha must be in [0, 1]"),
    (["--log-every", "0"], "--log-every 0: UnlearnConfig.log_every must be >= 1"),
    (["--batch-limit", "0"], "--batch-limit 0: Stage2Config.forget_batch_limit must be >= 1"),
    (["--checkpoint-every", "-1"], "--checkpoint-every -1: UnlearnConfig.checkpoint_every must be >= 0"),
    (["--original-epochs", "-1"], "--original-epochs -1: TrainRecipe.epochs must be an integer >= 0"),
    (["--set", "stage2.alpha=3"], "Stage2Config.alpha must be in [0, 1]"),   # --set names the field itself
    (["--set", "log_every=0"], "UnlearnConfig.log_every must be >= 1"),   # not "--log-every 10" (its default)
    (["--set", "checkpoint_every=-1"], "UnlearnConfig.checkpoint_every must be >= 0"),
])
def test_a_refused_flag_value_names_the_flag(argv, starts, tmp_path, capsys, monkeypatch):
    """The message named the config field only (Stage2Config.epochs), not the flag typed."""
    _no_prepare(monkeypatch)
    assert cli.main(["--setting", "digits", "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"entangle-unlearn: error: {starts}") and len(err.splitlines()) == 1, err


def test_torch_threads_refuses_a_count_beyond_the_cap():
    """torch.set_num_threads(100000) broke later imports ("failed to map segment") and crashed the
    process at exit; every entry point's thread count now goes through one bound."""
    import torch
    from entangle_ext.threads import MAX_THREADS, check_thread_count, torch_threads
    before = torch.get_num_threads()
    for bad in (0, MAX_THREADS + 1, 100_000, True, 2.0):
        with pytest.raises(ValueError, match=rf"must be an integer in \[1, {MAX_THREADS}\]"):
            with torch_threads(bad):
                pass
    assert torch.get_num_threads() == before and check_thread_count(3) == 3


# ------------------------------------------------------------------ celeba --forget: each attribute once
@pytest.mark.parametrize("spec", ["Young=1,Young=0", "Young=1, Young=1", "Young=1,Eyeglasses=0,Young=true"])
def test_celeba_forget_attribute_given_twice_is_refused(spec, tmp_path, capsys):
    """``Young=1,Young=0`` was accepted (the last value won); now a ValueError naming the attribute,
    which the command line turns into one error line and exit code 2."""
    from entangle_ext.data.celeba import forget_subclass_of
    with pytest.raises(ValueError, match="attribute 'Young' more than once"):
        forget_subclass_of(spec)
    assert forget_subclass_of("Young=1,Eyeglasses=1")["Young"] is True     # distinct attributes still work
    rc = cli.main(["--setting", "celeba", "--variant", "scratch", "--out", str(tmp_path / "o"), "--device", "cpu",
                   "--data-root", str(tmp_path), "--no-progress", "--forget", spec])
    line = _one_line(capsys)
    assert rc == 2 and "'Young' more than once" in line, line
