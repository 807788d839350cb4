"""The methods registry and its plumbing: names and errors, every method through
`entangle_ext.unlearn` with the agreed report structure, presets, checkpoint/resume, non-finite
losses, the two-stage ablations and the shared data streams."""
import dataclasses
import json

import pytest
import torch
from torch.utils.data import TensorDataset

import entangle_ext as ee
from entangle_ext.methods import available_methods, get_method
from entangle_ext.methods.base import PAPER_SETTINGS, ZipStream
from entangle_ext.unlearn import NonFiniteLossError
from entangle_ext.unlearn.data import BatchStream

from _tiny import NaNAfter, mlp, params

pytestmark = [pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}"),
              pytest.mark.usefixtures("one_thread")]

NAMES = ["retrain", "ft", "ga", "neggrad_plus", "rl", "l1_sparse", "salun", "scrub", "ssd", "gdr", "munba",
         "delete", "two_stage", "no_w2", "pgd_mean", "stage1_only", "two_stage_basis4"]
SPLITS = ("forget", "adjacent", "remote", "forget_test", "adjacent_test", "remote_test")


# ------------------------------------------------------------------------------------ registry
def test_registry_names_and_unknown_name(small):
    assert available_methods() == NAMES
    for n in NAMES:
        assert get_method(n).name == n and get_method(n).__doc__
    with pytest.raises(ValueError, match="unknown unlearning method 'nope'.*salun"):
        get_method("nope")
    with pytest.raises(ValueError, match="unknown unlearning method 'nope'"):
        ee.unlearn(mlp(), small, method="nope", progress=False)


@pytest.mark.parametrize("name", NAMES)
def test_a_missing_split_is_named_before_any_compute(small, name):
    """Every method declares the train splits its objective reads; without one of them it
    raises a ValueError naming the split and the method (not a TypeError from deep inside), and
    without any other split it runs."""
    required = get_method(name).required_splits
    assert set(required) <= {"forget", "adjacent", "remote"} and required
    for miss in ("forget", "adjacent", "remote"):
        splits = dataclasses.replace(small, **{miss: None})
        if miss in required:
            with pytest.raises(ValueError, match=f"^split '{miss}' is required by method '{name}'$"):
                ee.unlearn(mlp(), splits, method=name, setting="digits", progress=False)
        else:
            res = ee.unlearn(mlp(), splits, method=name, setting="digits", progress=False)
            assert miss not in res.report["evals"]["final"]


def test_bad_setting_hparams_and_config_type(small):
    with pytest.raises(ValueError, match="no preset for setting 'mnist'"):
        ee.unlearn(mlp(), small, method="ft", setting="mnist", progress=False)
    with pytest.raises(ValueError, match="hparams"):
        ee.unlearn(mlp(), small, method="ft", setting="digits", hparams="blog", progress=False)
    with pytest.raises(ValueError, match="hparams"):
        ee.unlearn(mlp(), small, method="no_w2", setting="digits", hparams="blog", progress=False)
    with pytest.raises(TypeError, match="ft"):
        ee.unlearn(mlp(), small, get_method("ga").Config(), method="ft", progress=False)
    with pytest.raises(TypeError, match="UnlearnConfig"):
        ee.unlearn(mlp(), small, get_method("ga").Config(), method="no_w2", progress=False)
    cfg = get_method("salun").Config()
    cfg.mask_fraction = 0.0          # assigned after construction: checked at the entry
    model = mlp()
    before = params(model)
    with pytest.raises(ValueError, match="mask_fraction"):
        ee.unlearn(model, small, cfg, method="salun", progress=False)
    assert torch.equal(params(model), before)


@pytest.mark.parametrize("name", NAMES)
def test_presets_build_valid_configs(name):
    cls = get_method(name)
    for setting in PAPER_SETTINGS + ("digits",):
        for hp in ("paper_code", "original"):
            cfg = cls.config_for(setting, hp)
            assert isinstance(cfg, cls.Config)
            if hasattr(cfg, "from_dict") and not issubclass(cls.Config, ee.UnlearnConfig):
                assert cls.Config.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_preset_values_from_the_sources():
    g = lambda n, s, h="paper_code": get_method(n).config_for(s, h)   # noqa: E731
    assert (g("ft", "cifar100").optimizer, g("ft", "cifar100").lr) == ("adam", 2.5e-5)
    assert (g("ft", "cifar100", "original").optimizer, g("ft", "cifar100", "original").lr) == ("sgd", 0.01)
    assert g("ssd", "tinyimagenet").lam == 10.0 and g("ssd", "tinyimagenet").alpha == 1.0
    assert g("ssd", "cifar100", "original").alpha == 10.0 and g("ssd", "celeba", "original").alpha == 25.0
    s = g("salun", "toxigen")
    assert (s.mask_granularity, s.objective, s.mask_fraction, s.epochs) == ("tensor", "ga", 0.3, 2)
    o = g("salun", "cifar100", "original")
    assert (o.mask_granularity, o.objective, o.label_mode, o.lr) == ("element", "rl", "uniform", 0.013)
    assert g("rl", "cifar100").label_mode == "never_true" and get_method("rl").Config().label_mode == "never_true"
    assert g("rl", "cifar100", "original").label_mode == "uniform"
    assert g("scrub", "cifar100", "original").temperature == 4.0 and g("scrub", "cifar100").temperature == 1.0
    assert g("munba", "toxigen").lr == 1e-5 and g("munba", "toxigen").forget_cycle
    assert g("gdr", "toxigen").epochs == 3 and g("gdr", "celeba").forget_batch_size == 32
    assert g("retrain", "cifar100", "original").recipe.epochs == 160
    assert g("no_w2", "cifar100").stage2.alpha == 0.0 and g("two_stage", "cifar100").stage2.alpha == 0.5
    assert g("two_stage", "toxigen", "original").recipe == "paper"


# --------------------------------------------------------------------------- every method runs
def _model_fn():
    return mlp(seed=3)


@pytest.mark.parametrize("name", NAMES)
def test_every_method_runs_with_the_agreed_report(small, name, tmp_path):
    model = mlp()
    res = ee.unlearn(model, small, method=name, setting="digits", model_fn=_model_fn if name == "retrain" else None,
                     out_dir=tmp_path, progress=False)
    rep = res.report
    assert res.model is model and model.training      # handed back in the caller's mode (mlp(): train mode)
    assert rep["method"] == name
    for tag in ("original", "final"):
        assert set(rep["evals"][tag]) == set(SPLITS)
        for split in SPLITS:
            r = rep["evals"][tag][split]
            assert 0.0 <= r["acc"] <= 1.0 and r["loss"] >= 0 and r["n"] == len(getattr(small, split))
    assert isinstance(rep["timings_s"]["unlearn"], float) and rep["timings_s"]["unlearn"] >= 0
    assert json.loads((tmp_path / "report.json").read_text())["method"] == name
    assert all(torch.isfinite(p).all() for p in model.parameters())
    if name != "pgd_mean":    # pgd_mean keeps the forget loss to first order: it may barely move
        assert not torch.equal(params(model), params(mlp()))
    evals_f = ee.evaluate(model, small)
    assert evals_f["forget"]["acc"] == pytest.approx(rep["evals"]["final"]["forget"]["acc"])


def test_two_stage_family_reports_and_configs(small):
    res = {m: ee.unlearn(mlp(), small, method=m, setting="digits", progress=False).report
           for m in ("no_w2", "pgd_mean", "stage1_only")}
    assert res["no_w2"]["config"]["stage2"]["alpha"] == 0.0 and set(res["no_w2"]["evals"]) >= {"stage1", "stage2"}
    p = res["pgd_mean"]
    assert not p["config"]["run_stage1"] and p["config"]["stage2"]["alpha"] == 0.0 and "stage1" not in p["evals"]
    assert p["evals"]["final"] == p["evals"]["stage2"] and p["steps"]["stage1"] == 0
    s = res["stage1_only"]
    assert "stage2" not in s["evals"] and s["evals"]["final"] == s["evals"]["stage1"]
    assert s["timings_s"]["unlearn"] == pytest.approx(s["timings_s"]["stage1"])
    # an explicit config is rewritten, not replaced
    cfg = ee.UnlearnConfig.preset("digits", seed=5)
    r = ee.unlearn(mlp(), small, cfg, method="stage1_only", progress=False).report
    assert r["config"]["seed"] == 5 and not r["config"]["run_stage2"] and cfg.run_stage2


def _unseeded_mlp():
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))


@pytest.mark.parametrize("name", ["retrain", "ft", "rl", "salun", "scrub", "two_stage"])
def test_seed_argument_replaces_the_config_seed(small, name):
    """``unlearn(..., seed=k)``: the run is a function of k (data order, random labels, Retrain's
    initial weights), whatever seed the preset or an explicit config carries."""
    def run(seed, config=None):
        model = mlp()
        rep = ee.unlearn(model, small, config, method=name, setting="digits", seed=seed, progress=False,
                         model_fn=_unseeded_mlp if name == "retrain" else None).report
        assert rep["config"]["seed"] == seed
        return params(model)

    a = run(1)
    assert torch.equal(a, run(1)) and not torch.equal(a, run(2))
    cfg = dataclasses.replace(get_method(name).config_for("digits"), seed=9)
    assert torch.equal(run(1, cfg), a) and cfg.seed == 9        # the caller's config is left as it was


def test_retrain_takes_a_bare_train_recipe(small):
    from entangle_ext.train import TrainRecipe
    rec = TrainRecipe("adam", lr=1e-2, epochs=2, batch_size=32, schedule="constant")
    rep = ee.unlearn(mlp(), small, rec, method="retrain", progress=False).report
    assert rep["config"]["recipe"]["epochs"] == 2 and rep["method"] == "retrain"


def test_retrain_reports_its_optimizer_steps(small, tmp_path):
    """Retrain's report counts the optimizer steps of its training from scratch (was 0): 180
    retain samples in batches of 64 are 3 steps an epoch; a resumed run reports the same."""
    from entangle_ext.train import TrainRecipe
    rec = TrainRecipe("adam", lr=1e-2, epochs=2, batch_size=64, schedule="constant")
    assert len(small.adjacent) + len(small.remote) == 180
    rep = ee.unlearn(mlp(), small, rec, method="retrain", out_dir=tmp_path, progress=False).report
    assert rep["steps"] == {"retrain": 6} and rep["stopped"] == {"retrain": {"rule": "budget", "step": 6}}
    again = ee.unlearn(mlp(), small, method="retrain", resume=tmp_path, progress=False).report
    assert again["steps"] == {"retrain": 6} and again["stopped"]["retrain"]["step"] == 6


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("split, value", [("forget", float("nan")), ("remote", float("inf"))])
def test_non_finite_loss_of_the_original_is_named_before_any_training(small, name, split, value):
    """Every method checks the original model's per-sample losses first: a NaN/Inf input is a
    ValueError naming the split and sample (not a NonFiniteLossError blaming the method, nor a run
    that completes with a NaN loss), and the model is left as it was."""
    x, y = getattr(small, split).tensors
    x = x.clone()
    x[5, 3] = value
    model = mlp()
    before = params(model).clone()
    with pytest.raises(ValueError, match=rf"^split '{split}': the model's cross-entropy is non-finite .NaN/Inf. "
                                         r"for 1 of \d+ samples, dataset indices \[5\]") as ei:
        ee.unlearn(model, dataclasses.replace(small, **{split: TensorDataset(x, y)}), method=name,
                   setting="digits", progress=False)
    assert type(ei.value) is ValueError
    assert torch.equal(params(model), before)


@pytest.mark.parametrize("name", ["ga", "scrub", "munba", "ssd"])
def test_non_finite_loss_names_method_and_step(small, name):
    with pytest.raises(NonFiniteLossError, match=f"non-finite loss in {name}(/[a-z]+)? at step") as ei:
        ee.unlearn(NaNAfter(3), small, method=name, setting="digits", progress=False)
    assert ei.value.step >= 0


def test_baseline_leaves_the_callers_rng_alone(small):
    model = mlp()
    torch.manual_seed(999)
    expected = torch.rand(3)
    torch.manual_seed(999)
    ee.unlearn(model, small, method="rl", setting="digits", progress=False)
    assert torch.equal(torch.rand(3), expected)


# ---------------------------------------------------------------------------------- streams
def _ids(n):
    return TensorDataset(torch.arange(n, dtype=torch.float32)[:, None], torch.zeros(n, dtype=torch.long))


def _stream(n, bs, name):
    return BatchStream(_ids(n), bs, shuffle=True, seed=0, name=name, device="cpu")


def test_zip_stream_lengths_cycling_and_resume():
    a, b = _stream(10, 2, "a"), _stream(3, 2, "b")     # 5 and 2 batches
    z = ZipStream({"a": a, "b": b}, length="max")
    assert len(z) == 5 and len(ZipStream({"a": a, "b": b}, length="min")) == 2
    assert len(ZipStream({"a": a, "b": b}, length="b")) == 2
    ep = list(z.epoch_batches(1))
    got_a = torch.cat([s["a"][0] for s in ep]).flatten().long().sort().values
    assert torch.equal(got_a, torch.arange(10))           # one full pass of the longest
    seen_b = [s["b"][0].flatten().long().tolist() for s in ep]
    assert all(len(x) in (1, 2) for x in seen_b)           # cycled: a fresh pass after 2 batches
    assert sorted(sum(seen_b[:2], [])) == [0, 1, 2] and sorted(sum(seen_b[2:4], [])) == [0, 1, 2]
    again = list(z.epoch_batches(1, start=3))              # resume mid-epoch: same batches
    for x, y in zip(again, ep[3:]):
        assert torch.equal(x["a"][0], y["a"][0]) and torch.equal(x["b"][0], y["b"][0])
    nz = list(ZipStream({"a": a, "b": b}, length="a", cycle=False).epoch_batches(0))
    assert [s["b"] is None for s in nz] == [False, False, True, True, True]
    with pytest.raises(ValueError, match="length"):
        ZipStream({"a": a}, length="c")


def test_a_run_whose_unlearned_model_overflows_is_a_non_finite_loss_error(tmp_path):
    """GA with its digits preset on the digits 'reduced' model, in float32 (the setting runs in
    float64, whose range the weights do not leave): no checked training loss is NaN, but the
    weights grow past float32 range (logits overflow), so every final loss is NaN. That is a
    diverged run (NonFiniteLossError), not a report with NaN in it."""
    pytest.importorskip("sklearn")
    from torch.utils.data import TensorDataset
    from entangle_ext.settings import prepare
    run = prepare("digits", "reduced", device="cpu", cache_dir=tmp_path, progress=False)
    splits = ee.Splits(**{k: TensorDataset(d.tensors[0].float(), d.tensors[1]) for k, d in run.splits.named().items()})
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss in ga: the unlearned model's loss on "
                       r"'adjacent'.* is NaN/Inf after its last step \(\d+\); the run diverged") as info:
        ee.unlearn(run.model.float(), splits, method="ga", setting="digits", out_dir=tmp_path / "ga", progress=False)
    assert info.value.stage == "ga" and not (tmp_path / "ga" / "report.json").exists()
