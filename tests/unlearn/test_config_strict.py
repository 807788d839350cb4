"""Issue 24 item 14: a typo'd attribute on any configuration dataclass raises instead of running
silently with the default; a training batch larger than its split warns (the batches are cut)."""
import copy
import dataclasses
import pickle
import warnings

import pytest
import torch
from torch.utils.data import TensorDataset

import entangle_ext as ee
from entangle_ext.unlearn import BatchLargerThanSplitWarning, Stage1Config, Stage2Config, UnlearnConfig
from entangle_ext.unlearn.method import METHODS, available_methods
from _tiny import mlp, tiny_config


def _configs():
    out = [("UnlearnConfig", UnlearnConfig()), ("Stage1Config", Stage1Config()), ("Stage2Config", Stage2Config())]
    for name in available_methods():
        spec = METHODS[name]
        if not issubclass(spec.Config, UnlearnConfig):   # the two-stage family: UnlearnConfig, above
            out.append((name, spec.Config()))
    return out


@pytest.mark.parametrize("name,cfg", _configs(), ids=[n for n, _ in _configs()])
def test_unknown_attributes_are_refused_with_the_closest_field(name, cfg):
    field = sorted(f.name for f in dataclasses.fields(cfg))[0]
    typo = field[:-1] + ("x" if field[-1] != "x" else "y")
    with pytest.raises(AttributeError, match=rf"has no field '{typo}'"):
        setattr(cfg, typo, getattr(cfg, field))
    assert not hasattr(cfg, typo)
    setattr(cfg, field, getattr(cfg, field))   # a real field is still settable
    # copies, pickles and replace keep working (they do not go through __setattr__ for new names)
    for other in (copy.deepcopy(cfg), pickle.loads(pickle.dumps(cfg)), dataclasses.replace(cfg)):
        assert other == cfg


def test_the_issue_example_names_alpha():
    cfg = UnlearnConfig()
    with pytest.raises(AttributeError, match="Stage2Config has no field 'alhpa'; did you mean 'alpha'"):
        cfg.stage2.alhpa = 0.3
    cfg.stage2.alpha = 0.3
    assert cfg.stage2.alpha == 0.3
    with pytest.raises(AttributeError, match="did you mean 'stage2'"):
        cfg.stage_2 = Stage2Config()
    with pytest.raises(AttributeError, match="has no field 'budget_fields'"):   # a ClassVar is not a field
        cfg.budget_fields = ()


def _caught(fn):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        fn()
    return [w for w in rec if issubclass(w.category, BatchLargerThanSplitWarning)]


def test_a_stage_batch_larger_than_its_split_warns_naming_the_stream(small):
    cfg = tiny_config(stage2={"adjacent_batch_size": 10**7})
    got = _caught(lambda: ee.unlearn(mlp(), small, cfg, progress=False))
    msgs = [str(w.message) for w in got]
    assert any("s2/adjacent" in m and "10000000" in m and f"({len(small.adjacent)} samples)" in m
               for m in msgs), msgs
    assert len(msgs) == 1, msgs   # evaluation streams (eval_batch_size 512 > every split) do not warn


def test_a_baseline_batch_larger_than_its_split_warns(small):
    cfg = METHODS["ft"].Config(batch_size=10**7, epochs=1)
    got = _caught(lambda: ee.unlearn(mlp(), small, cfg, method="ft", progress=False))
    assert got and "ft/" in str(got[0].message), [str(w.message) for w in got]


def test_the_original_training_warns_too():
    from entangle_ext.train import TrainRecipe, train_original
    data = TensorDataset(torch.randn(10, 64), torch.randint(0, 2, (10,)))
    got = _caught(lambda: train_original(mlp(), [data], TrainRecipe("adam", epochs=1, batch_size=64),
                                         device="cpu", seed=0, progress=False))
    assert got and "train/original" in str(got[0].message)
    ok = _caught(lambda: train_original(mlp(), [data], TrainRecipe("adam", epochs=1, batch_size=4),
                                        device="cpu", seed=0, progress=False))
    assert ok == []


def test_a_seed_torch_cannot_take_is_refused_by_the_config_not_by_torch_mid_run():
    import entangle_ext as ee
    from entangle_ext.methods import get_method
    from entangle_ext.unlearn.fields import SEED_MAX, SEED_MIN
    for ok in (SEED_MIN, 0, SEED_MAX):
        assert ee.UnlearnConfig(seed=ok).seed == ok and get_method("ga").Config(seed=ok).seed == ok
    for bad in (SEED_MAX + 1, SEED_MIN - 1, 2 ** 70):
        with pytest.raises(ValueError, match=r"seed must be in \[.*torch.manual_seed"):
            ee.UnlearnConfig(seed=bad)
        with pytest.raises(ValueError, match=r"seed must be in \["):
            get_method("ga").Config(seed=bad)


@pytest.mark.parametrize("make", [
    lambda m: Stage2Config(momentum=m),
    lambda m: METHODS["ft"].Config(momentum=m),
    lambda m: METHODS["neggrad_plus"].Config(momentum=m),
    lambda m: __import__("entangle_ext.train", fromlist=["TrainRecipe"]).TrainRecipe(momentum=m),
])
def test_every_momentum_field_is_in_zero_one(make):
    """A momentum of 1.5 was accepted (torch's SGD takes it too) and the run went on to diverge."""
    make(0.0), make(0.99)
    for bad in (1.0, 1.5, -0.1):
        with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\) .* got " + repr(bad)):
            make(bad)


@pytest.mark.parametrize("make", [lambda b: UnlearnConfig(histogram_bins=b),
                                  lambda b: METHODS["ga"].Config(histogram_bins=b)])
def test_histogram_bins_are_bounded(make):
    """10**6 bins ran for minutes and took gigabytes drawing one PNG."""
    make(1), make(10_000)
    for bad in (0, 10_001, 10 ** 6):
        with pytest.raises(ValueError, match=rf"histogram_bins must be an integer in \[1, 10000\] .* got {bad}"):
            make(bad)


def test_both_stages_off_is_refused_as_nothing_would_run():
    """run_stage1=False with run_stage2=False ran nothing and returned a "finished" two_stage run."""
    nothing = "run_stage1 and run_stage2 are both False: nothing would run"
    assert not UnlearnConfig(run_stage1=False).run_stage1 and not UnlearnConfig(run_stage2=False).run_stage2
    with pytest.raises(ValueError, match=nothing):
        UnlearnConfig(run_stage1=False, run_stage2=False)
    cfg = UnlearnConfig(run_stage2=False)
    cfg.run_stage1 = False
    with pytest.raises(ValueError, match=nothing):
        cfg.validate()
    with pytest.raises(ValueError, match=nothing):   # pgd_mean turns Stage 1 off itself
        METHODS["pgd_mean"].resolve_config(UnlearnConfig(run_stage2=False), "digits", "paper_code")


@pytest.mark.parametrize("call, err, says", [
    (lambda: UnlearnConfig.preset("digits", epochs=3), ValueError,
     r"unknown UnlearnConfig field\(s\) \['epochs'\].*go in stage1=\{\.\.\.\} / stage2=\{\.\.\.\}"),
    (lambda: UnlearnConfig.preset("digits", stage1=[("lr", 1e-3)]), TypeError,
     r"preset\(stage1=\.\.\.\) takes a dict of Stage1Config fields, got list"),
    (lambda: UnlearnConfig.from_dict([]), TypeError, "takes a dict of UnlearnConfig fields, got list"),
    (lambda: UnlearnConfig.from_dict(""), TypeError, "got str"),
    (lambda: UnlearnConfig.from_dict(None), TypeError, "got NoneType"),
    (lambda: UnlearnConfig.from_dict({"sed": 1}), ValueError, r"\['sed'\] \(did you mean 'seed'\?\)"),
    (lambda: UnlearnConfig.from_dict({"stage2": {"alhpa": 0.2}}), ValueError, r"Stage2Config field\(s\) \['alhpa'\]"),
    (lambda: METHODS["ga"].Config.from_dict({"lrr": 1}), ValueError, r"GAConfig.from_dict: unknown GAConfig field"),
    (lambda: METHODS["retrain"].Config.from_dict({"recipe": {"epoch": 1}}), ValueError,
     r"unknown TrainRecipe field\(s\) \['epoch'\] \(did you mean 'epochs'\?\)"),
])
def test_config_dicts_of_the_wrong_form_say_so(call, err, says):
    """from_dict([]) / from_dict("") returned the default config, from_dict(None) and unknown keys
    raised Python's bare "unexpected keyword argument"/"not iterable" errors."""
    with pytest.raises(err, match=says):
        call()


def test_config_dicts_round_trip():
    for cfg in (UnlearnConfig.preset("cifar100", "paper"), METHODS["retrain"].Config(), METHODS["scrub"].Config()):
        assert type(cfg).from_dict(json_round_trip(cfg.to_dict())) == cfg


def json_round_trip(d):
    import json
    return json.loads(json.dumps(d))
