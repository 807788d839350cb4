"""Issue 24 item 15: two ways of setting one field with different values (a flag and ``--set``, or
``--set`` twice) exit 2 with one line naming both, before any data is read; equal values, and a
``--set`` beside a flag left at its default, are accepted. So does a single-valued flag given twice
with two values (``--seed 1 --seed 2``), in ``entangle-unlearn`` and ``compare`` alike, instead of
silently taking the last."""
import pytest

from entangle_ext import cli
from entangle_ext.cli import run as cli_run

BASE = ["--setting", "digits", "--out", "unused_out_dir"]


def _refused_before_any_data(extra, capsys, monkeypatch, tmp_path):
    """The stderr lines of ``BASE + extra``, which must exit 2 before any data is read."""
    import entangle_ext.settings as settings

    def no_data(*a, **k):
        raise AssertionError("data was read before the flags were checked")
    monkeypatch.setattr(settings, "prepare", no_data)
    monkeypatch.chdir(tmp_path)
    assert cli.main(BASE + extra) == 2
    return capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("extra,named", [
    (["--stage2-lr", "5e-4", "--set", "stage2.lr=1e-3"], ("--stage2-lr 0.0005", "--set stage2.lr=0.001")),
    (["--batch-limit", "2", "--set", "stage2.forget_batch_limit=3"],
     ("--batch-limit 2", "--set stage2.forget_batch_limit=3")),
    (["--alpha", "0.3", "--set", "stage2.alpha=0.5"], ("--alpha 0.3", "--set stage2.alpha=0.5")),
    (["--stage1-epochs", "2", "--set", "stage1.epochs=3"], ("--stage1-epochs 2", "--set stage1.epochs=3")),
    (["--original-epochs", "3", "--set", "train.epochs=5"], ("--original-epochs 3", "--set train.epochs=5")),
    (["--seed", "1", "--set", "seed=2"], ("--seed 1", "--set seed=2")),
    (["--log-every", "5", "--set", "log_every=7"], ("--log-every 5", "--set log_every=7")),
    (["--deterministic", "--set", "deterministic=false"], ("--deterministic", "--set deterministic=False")),
    (["--set", "stage2.lr=1e-3", "--set", "stage2.lr=2e-3"], ("'stage2.lr=1e-3'", "'stage2.lr=2e-3'")),
    (["--method", "ft", "--set", "epochs=2", "--set", "epochs=3"], ("'epochs=2'", "'epochs=3'")),
])
def test_conflicting_values_exit_2_naming_both_before_any_data(extra, named, capsys, monkeypatch, tmp_path):
    err = _refused_before_any_data(extra, capsys, monkeypatch, tmp_path)
    assert len(err) == 1 and err[0].startswith("entangle-unlearn: error:"), err
    for n in named:
        assert n in err[0], (n, err[0])
    assert not (tmp_path / "unused_out_dir").exists()


@pytest.mark.parametrize("extra,field,value", [
    (["--stage2-lr", "1e-3", "--set", "stage2.lr=1e-3"], ("stage2", "lr"), 1e-3),    # equal values
    (["--set", "seed=2"], ("top", "seed"), 2),                                      # --seed left at its default
    (["--set", "stage2.lr=1e-3", "--set", "stage2.lr=0.001"], ("stage2", "lr"), 1e-3),
])
def test_equal_values_and_defaulted_flags_are_accepted(extra, field, value):
    argv = BASE + extra
    args = cli.build_parser().parse_args(argv)
    args.given_flags = cli_run._typed_flags(argv)
    plan = cli_run._plan(args)
    section, name = field
    got = getattr(plan.config, name) if section == "top" else getattr(getattr(plan.config, section), name)
    assert got == value


@pytest.mark.parametrize("command,extra,named", [
    ([], ["--seed", "1", "--seed", "2"], "--seed 1 and --seed 2"),
    ([], ["--epochs", "1", "--epochs=2"], "--epochs 1 and --epochs 2"),
    ([], ["--setting", "cifar100"], "--setting digits and --setting cifar100"),
    ([], ["--superclasses", "fish,flowers", "--superclasses", "fish"], "--superclasses fish,flowers and --superclasses fish"),
    (["compare"], ["--jobs", "1", "--jobs", "2"], "--jobs 1 and --jobs 2"),
    (["compare"], ["--methods", "retrain", "--methods", "salun"], "--methods retrain and --methods salun"),
])
def test_a_flag_given_twice_with_two_values_exits_2_naming_both(command, extra, named, capsys, monkeypatch, tmp_path):
    import entangle_ext.settings as settings

    def no_data(*a, **k):
        raise AssertionError("data was read before the flags were checked")
    monkeypatch.setattr(settings, "prepare", no_data)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        cli.main([*command, *BASE, *extra])
    err = capsys.readouterr().err.strip().splitlines()
    prog = "entangle-unlearn compare" if command else "entangle-unlearn"
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith(f"{prog}: error: {named} set one flag to two "
                                                                     "values; give it once"), err
    assert not (tmp_path / "unused_out_dir").exists()


def test_a_flag_given_twice_with_one_value_and_repeated_set_are_accepted():
    from entangle_ext.cli import compare as cli_compare
    argv = BASE + ["--seed", "3", "--seed", "3", "--set", "stage2.lr=1e-3", "--set", "stage1.lr=1e-4"]
    args = cli.build_parser().parse_args(argv)
    assert args.seed == 3 and args.overrides == ["stage2.lr=1e-3", "stage1.lr=1e-4"]
    assert "seed" in cli_run._typed_flags(argv) and not [k for k in vars(args) if k.startswith("_")]
    args = cli_compare.build_parser().parse_args(["--setting", "digits", "--jobs", "2", "--jobs", "2"])
    assert args.jobs == 2


@pytest.mark.parametrize("extra", [["--set", "run_stage1=false", "--set", "run_stage2=false"],
                                   ["--method", "pgd_mean", "--set", "run_stage2=false"]])
def test_both_stages_off_exits_2_before_any_data(extra, capsys, monkeypatch, tmp_path):
    """It ran nothing, exited 0 and reported a two_stage run."""
    err = _refused_before_any_data(extra, capsys, monkeypatch, tmp_path)
    assert err == ["entangle-unlearn: error: run_stage1 and run_stage2 are both False: nothing would run; leave "
                   "at least one stage on"], err
