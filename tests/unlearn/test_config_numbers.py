"""Numbers every config refuses or normalises before any data is read: an int in a float field is
its float (torch took 10**30 as an int64 and failed mid-run, "int too big to convert"), an int
beyond the float range there and one beyond torch's int64 in an int field are ValueErrors naming
the field (a batch size of 10**30 failed inside torch.split); `TrainRecipe` (the original model's
and Retrain's recipe) checks its field types like every other config (augment="no" was truthy,
epochs=2.0 failed mid-training, lr="fast" compared a str with an int)."""
import pytest

import entangle_ext as ee
from entangle_ext.train import TrainRecipe
from entangle_ext.unlearn import Stage1Config, Stage2Config


def _get(name):
    return ee.methods.get_method(name).Config


@pytest.mark.parametrize("make, field", [(lambda v: _get("ssd")(alpha=v), "alpha"),
                                         (lambda v: Stage1Config(clip=v), "clip"),
                                         (lambda v: Stage2Config(lr=v), "lr"),
                                         (lambda v: TrainRecipe(weight_decay=v), "weight_decay")])
def test_an_int_in_a_float_field_is_its_float_and_one_beyond_the_float_range_is_refused(make, field):
    cfg = make(10 ** 30)
    cfg = cfg.validate() if hasattr(cfg, "validate") else cfg
    assert getattr(cfg, field) == 1e30 and type(getattr(cfg, field)) is float
    with pytest.raises(ValueError, match=rf"\.{field} must be a finite float, got an integer of 401 digits"):
        c = make(10 ** 400)
        c.validate() if hasattr(c, "validate") else None


@pytest.mark.parametrize("make, field", [(lambda v: _get("ft")(batch_size=v), "batch_size"),
                                         (lambda v: _get("ft")(eval_batch_size=v), "eval_batch_size"),
                                         (lambda v: Stage2Config(adjacent_batch_size=v), "adjacent_batch_size"),
                                         (lambda v: TrainRecipe(batch_size=v), "batch_size")])
def test_an_int_beyond_int64_is_refused_naming_the_field(make, field):
    with pytest.raises(ValueError, match=rf"\.{field} must be at most 2\*\*63 - 1 in size \(torch's int64\)"):
        c = make(10 ** 30)
        c.validate() if hasattr(c, "validate") else None


def test_the_seed_keeps_torch_manual_seeds_range():
    assert ee.UnlearnConfig.preset("digits", seed=2 ** 64 - 1).seed == 2 ** 64 - 1


@pytest.mark.parametrize("kw, err, msg", [
    (dict(augment="no"), TypeError, "TrainRecipe.augment must be bool"),
    (dict(epochs=2.0), TypeError, r"TrainRecipe.epochs must be int \(an integer: write 2, not 2.0\)"),
    (dict(epochs=True), TypeError, "TrainRecipe.epochs must be int"),
    (dict(lr="fast"), TypeError, "TrainRecipe.lr must be float"),
    (dict(weight_decay=float("nan")), ValueError, r"TrainRecipe.weight_decay must be finite"),
    (dict(lr=float("inf")), ValueError, r"TrainRecipe.lr must be finite"),
])
def test_train_recipe_checks_its_field_types(kw, err, msg):
    with pytest.raises(err, match=msg):
        TrainRecipe(**kw)


def test_the_command_line_refuses_a_bad_recipe_value_in_one_line(tmp_path, capsys):
    """--set train.epochs=2.0 crashed mid-training with a traceback (exit 1)."""
    from entangle_ext import cli
    pytest.importorskip("sklearn")
    rc = cli.main(["--setting", "digits", "--variant", "reduced", "--out", str(tmp_path / "o"), "--no-progress",
                   "--method", "ga", "--set", "train.epochs=2.0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "TrainRecipe.epochs must be int" in err[0], err
