"""Every method, the metrics and `compare` on the inputs users have: float64 / bfloat16 models
(floating inputs cast to the model's dtype), splits that are not TensorDatasets (map-style
datasets of (x, int) items, Subsets, dict items, DataLoaders, a `Splits` collate function), models
without parameters, and the argument checks of `unlearn` / `evaluate`; the caller's train/eval
flags are kept by `evaluate`, the metrics, `compare` and `extract_features`."""
import dataclasses
import importlib

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

import entangle_ext as ee
from entangle_ext.methods import METHODS, get_method
from entangle_ext.unlearn import metrics as M

from _tiny import BagOfTokens, DictDS, Keyword, Tokens, mlp, pad_collate, params, tiny_config

C = importlib.import_module("entangle_ext.compare")   # the module (the package attribute is the function)

pytestmark = [pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}"),
              pytest.mark.usefixtures("one_thread")]

NAMES = list(METHODS)
BASELINES = [n for n, c in METHODS.items() if not issubclass(c.Config, ee.UnlearnConfig)]


def _with(splits, fn):
    """``splits`` with fn(split) in place of every present split."""
    return dataclasses.replace(splits, **{n: fn(v) for n, v in splits.named().items()})


def _inputs_as(dtype):
    return lambda d: TensorDataset(d.tensors[0].to(dtype), d.tensors[1])


def _run(model, splits, name, **kw):
    return ee.unlearn(model, splits, method=name, setting="digits", progress=False, **kw)


def _same_run(a, b):
    assert torch.equal(params(a.model), params(b.model))
    assert a.report["evals"] == b.report["evals"]


# ------------------------------------------------------------------------- model dtypes
@pytest.mark.parametrize("name", BASELINES)
def test_every_baseline_casts_float32_inputs_to_a_float64_model(small, name):
    """float32 data on a float64 model runs exactly as the same data given in float64."""
    a = _run(mlp().double(), small, name)
    assert all(p.dtype == torch.float64 for p in a.model.parameters())
    _same_run(a, _run(mlp().double(), _with(small, _inputs_as(torch.float64)), name))


@pytest.mark.parametrize("name", ["retrain", "ga", "rl", "salun", "scrub", "gdr"])
def test_baselines_on_a_bfloat16_model(small, name):
    a = _run(mlp().to(torch.bfloat16), small, name)
    assert all(p.dtype == torch.bfloat16 and torch.isfinite(p).all() for p in a.model.parameters())
    _same_run(a, _run(mlp().to(torch.bfloat16), _with(small, _inputs_as(torch.bfloat16)), name))


@pytest.mark.parametrize("name", BASELINES)
def test_every_baseline_on_a_float16_model_tracks_its_float32_run(small, name):
    """The baselines step float32 master copies of float16 weights (`master_weight_optimizer`):
    Adam's eps = 1e-8 is 0 in float16, so a zero gradient gave 0/0 = NaN and every Adam-based
    baseline (and Retrain) stopped with a non-finite loss at step 0-1, leaving NaN weights. Now
    the float16 run stays finite, keeps the dtype and lands on its float32 run's accuracies."""
    torch.manual_seed(0)
    init = mlp().state_dict()
    m32, m16 = mlp(), mlp()
    m32.load_state_dict(init)
    m16.load_state_dict(init)
    a = _run(m32, small, name)
    b = _run(m16.half(), small, name)
    assert all(p.dtype == torch.float16 and torch.isfinite(p).all() for p in b.model.parameters())
    fa, fb = a.report["evals"]["final"], b.report["evals"]["final"]
    assert fa.keys() == fb.keys()
    for split in fa:
        assert abs(fa[split]["acc"] - fb[split]["acc"]) <= 0.03, (split, fa[split]["acc"], fb[split]["acc"])


def test_master_weight_optimizer_round_trips_its_float32_copies():
    """A resumed half-precision run continues from the same float32 weights: the optimizer's
    state_dict carries the master copies, load_state_dict restores them and the parameters."""
    from entangle_ext.unlearn.precision import master_weight_optimizer
    torch.manual_seed(0)
    net = mlp().half()
    opt = master_weight_optimizer(torch.optim.Adam, list(net.parameters()), lr=1e-3)
    x = torch.randn(8, 64).half()
    for _ in range(3):
        opt.zero_grad()
        net(x).float().square().mean().backward()
        opt.step()
        assert all(p.grad is None for p in net.parameters())
    state = opt.state_dict()
    masters = [m.clone() for m in opt.entangle_master.tensors]
    assert all(m.dtype == torch.float32 for m in masters)
    net2 = mlp().half()
    opt2 = master_weight_optimizer(torch.optim.Adam, list(net2.parameters()), lr=1e-3)
    opt2.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(opt2.entangle_master.tensors, masters))
    assert all(torch.equal(p, q) for p, q in zip(net2.parameters(), net.parameters()))
    with pytest.raises(ValueError, match="master weights do not match"):
        master_weight_optimizer(torch.optim.Adam, [torch.nn.Parameter(torch.zeros(3).half())]).load_state_dict(state)
    # a plain optimizer's state (no master copies): the next step starts from the parameters as
    # they are then (e.g. a model loaded from a checkpoint after the optimizer state)
    net3 = mlp().half()
    opt3 = master_weight_optimizer(torch.optim.SGD, list(net3.parameters()), lr=0.0)
    opt3.load_state_dict(torch.optim.SGD(list(mlp().half().parameters()), lr=0.0).state_dict())
    net3.load_state_dict(net.state_dict())
    opt3.zero_grad()
    net3(x).float().sum().backward()
    opt3.step()                                    # lr 0: the parameters stay what was loaded
    assert all(torch.equal(p, q) for p, q in zip(net3.parameters(), net.parameters()))
    plain = master_weight_optimizer(torch.optim.SGD, list(mlp().parameters()), lr=0.1)   # float32: a plain SGD
    assert type(plain) is torch.optim.SGD and not hasattr(plain, "entangle_master")


def test_metrics_on_a_float64_model(small):
    pytest.importorskip("sklearn")
    model, s64 = mlp().double(), _with(small, _inputs_as(torch.float64))
    a, b = M.per_sample(model, small.forget), M.per_sample(model, s64.forget)
    assert all(torch.equal(a[k], b[k]) for k in a) and a["loss"].dtype == torch.float64
    assert M.mia_efficacy(model, small) == M.mia_efficacy(model, s64)
    with torch.no_grad():
        model[2].bias.copy_(torch.tensor([20.0, -20.0]))   # every sample predicted 0: D_f (label 1) to relearn
    r = M.relearn_time(model, small.forget, threshold=1.0, max_steps=3)
    assert r == M.relearn_time(model, s64.forget, threshold=1.0, max_steps=3) and r["steps"] == 3


def _metrics(res):
    """The per-run metrics of a `ComparisonResult` without the wall-clock time."""
    return {m: {s: {k: v for k, v in r.items() if k != "time_s"} for s, r in runs.items()}
            for m, runs in res.runs.items()}


def test_compare_on_a_float64_model(small):
    pytest.importorskip("sklearn")
    pytest.importorskip("scipy")
    model = mlp().double()
    before = params(model)
    kw = dict(methods=["ga", "ssd", "two_stage"], seeds=[0], setting="digits", relearn={"max_steps": 3},
              progress=False)
    a = ee.compare(model, small, **kw)
    assert not a.failures and a.runs["ga"][0]["relearn_steps"] is not None
    assert _metrics(a) == _metrics(ee.compare(model, _with(small, _inputs_as(torch.float64)), **kw))
    assert torch.equal(params(model), before) and model[0].weight.dtype == torch.float64


# ------------------------------------------------------------------------- split forms
class TupleItems(Dataset):
    """A TensorDataset's samples as torchvision-style ``(x, int label)`` items."""

    def __init__(self, tds):
        self.x, self.y = tds.tensors

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


FORMS = {"tuple items": TupleItems, "subset": lambda d: Subset(d, list(range(len(d)))),
         "dataloader": lambda d: DataLoader(d, batch_size=7), "dict items": lambda d: DictDS(d, "labels", "pixels")}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", BASELINES)
def test_every_baseline_gives_the_tensor_numbers_on_other_split_forms(small, name, form):
    """RL and SalUn included (their stream carries each batch's dataset indices)."""
    model = Keyword() if form == "dict items" else mlp()
    _same_run(_run(model, _with(small, FORMS[form]), name), _run(mlp(), small, name))


@pytest.mark.parametrize("name", BASELINES)
def test_every_baseline_batches_with_the_splits_collate_fn(name):
    """Variable-length token sequences: the `Splits` collate function (or the DataLoaders' own)
    batches every stream of a baseline, also the unions of several splits."""
    parts = {"forget": Tokens(20, 1, 0), "adjacent": Tokens(40, 1, 1), "remote": Tokens(40, 0, 2)}
    a = _run(BagOfTokens(), ee.Splits(**parts, collate_fn=pad_collate), name)
    assert all(torch.isfinite(p).all() for p in a.model.parameters())
    b = _run(BagOfTokens(), ee.Splits(**{k: DataLoader(v, batch_size=5, collate_fn=pad_collate)
                                         for k, v in parts.items()}), name)
    _same_run(a, b)


def test_compare_on_dataloader_splits_equals_tensor_splits(small):
    pytest.importorskip("sklearn")
    pytest.importorskip("scipy")
    loaders = _with(small, lambda d: DataLoader(d, batch_size=7))
    model = mlp()
    assert C.fingerprint(model, loaders) == C.fingerprint(model, small)
    kw = dict(methods=["ga"], seeds=[0], setting="digits", relearn={"max_steps": 3}, progress=False)
    assert _metrics(ee.compare(model, loaders, **kw)) == _metrics(ee.compare(model, small, **kw))


# ------------------------------------------------------------------ models without parameters
class NoParams(torch.nn.Module):
    def forward(self, x):
        return torch.stack([x.sum(1), -x.sum(1)], 1)


@pytest.mark.parametrize("name", NAMES)
def test_a_model_without_parameters_is_the_documented_value_error(small, name):
    for device in (None, "cpu"):
        with pytest.raises(ValueError, match=r"^the model has no trainable parameters \(it has no parameters"):
            _run(NoParams(), small, name, device=device)


def test_evaluate_metrics_stages_and_compare_without_parameters(small):
    with pytest.raises(ValueError, match=r"no parameters and no buffers.*pass device="):
        ee.evaluate(NoParams(), small)
    assert set(ee.evaluate(NoParams(), small, device="cpu")) == set(small.named())
    with_buffer = NoParams()
    with_buffer.register_buffer("scale", torch.ones(()))
    assert set(ee.evaluate(with_buffer, small)) == set(small.named())    # the buffer's device
    for call in (lambda: M.per_sample(NoParams(), small.forget),
                 lambda: M.relearn_time(NoParams(), small.forget, threshold=0.5)):
        with pytest.raises(ValueError, match="no parameters and no buffers"):
            call()
    with pytest.raises(ValueError, match=r"^the model has no trainable parameters \(it has no parameters"):
        ee.compare(NoParams(), small, methods=["ga"], seeds=[0], setting="digits", progress=False)   # as unlearn
    for stage in ("stage1", "stage2"):
        with pytest.raises(ValueError, match="no trainable parameters"):
            getattr(ee, stage)(NoParams(), small, getattr(tiny_config(), stage), progress=False)


# ------------------------------------------------------------------------ argument checks
@pytest.mark.parametrize("name", ["ga", "two_stage"])
def test_unlearn_checks_setting_hparams_and_model_fn_also_with_a_config(small, name):
    cfg = tiny_config() if name == "two_stage" else get_method(name).config_for("digits")
    model = mlp()
    before = params(model)
    with pytest.raises(ValueError, match=r"hparams must be one of \('paper_code', 'original'\), got 'orig'"):
        ee.unlearn(model, small, cfg, method=name, hparams="orig", progress=False)
    with pytest.raises(ValueError, match="setting 'mnist'"):
        ee.unlearn(model, small, cfg, method=name, setting="mnist", progress=False)
    with pytest.raises(ValueError, match=rf"model_fn is used by method 'retrain' only.*method '{name}' takes none"):
        ee.unlearn(model, small, cfg, method=name, model_fn=mlp, progress=False)
    assert torch.equal(params(model), before)


def test_retrain_model_fn_must_build_a_module(small):
    with pytest.raises(TypeError, match="^model_fn must be a callable returning a fresh torch.nn.Module, got int$"):
        _run(mlp(), small, "retrain", model_fn=3)
    with pytest.raises(TypeError, match="^model_fn must return a fresh torch.nn.Module, it returned int$"):
        _run(mlp(), small, "retrain", model_fn=lambda: 3)


def test_evaluate_argument_errors(small):
    for bad in (0, -1, 2.5, True, "8"):
        with pytest.raises(ValueError, match=r"^evaluate: batch_size must be an integer >= 1"):
            ee.evaluate(mlp(), small, batch_size=bad)
    with pytest.raises(TypeError, match="^evaluate: splits must be an entangle_ext.Splits, got TensorDataset$"):
        ee.evaluate(mlp(), small.forget)
    with pytest.raises(TypeError, match="^evaluate: model must be a torch.nn.Module, got function$"):
        ee.evaluate(lambda x: x, small)
    with pytest.raises(ValueError, match="no split to evaluate"):
        ee.evaluate(mlp(), ee.Splits())
    with pytest.raises(ValueError, match=r"^per_sample: batch_size must be an integer >= 1"):
        M.per_sample(mlp(), small.forget, batch_size=0)


# ------------------------------------------------------------------------ train/eval flags
def _mixed_modes():
    """`mlp` in train mode with its ReLU held in eval mode (a per-submodule override)."""
    model = mlp().train()
    model[1].eval()
    return model


def _flags(model):
    return [m.training for m in model.modules()]


def test_evaluate_metrics_and_features_keep_the_callers_flags(small):
    from entangle_ext.splits import extract_features
    model = _mixed_modes()
    flags = _flags(model)
    ee.evaluate(model, small)
    M.per_sample(model, small.forget)
    extract_features(model, small.forget.tensors[0])
    assert _flags(model) == flags
    x, y = small.forget.tensors
    bad = dataclasses.replace(small, forget=TensorDataset(x, y + 5))     # labels outside [0, 2)
    with pytest.raises(ValueError, match="outside the model's classes"):
        ee.evaluate(model, bad)
    with pytest.raises(ValueError, match="outside the model's classes"):
        M.per_sample(model, bad.forget)
    assert _flags(model) == flags                                         # also on error
    feats = extract_features(mlp().double(), x)                           # inputs cast to the model's dtype
    assert torch.equal(feats, extract_features(mlp().double(), x.double()))


def test_compare_keeps_the_callers_flags_and_weights(small):
    pytest.importorskip("sklearn")
    pytest.importorskip("scipy")
    model = _mixed_modes()
    flags, before = _flags(model), params(model)
    ee.compare(model, small, methods=["ga"], seeds=[0], setting="digits", relearn={"max_steps": 3}, progress=False)
    assert _flags(model) == flags and torch.equal(params(model), before)
