"""Issue 24 item 13: a device this process cannot use, a wrong feature width and integer features
are named in one clear ValueError before any training, for every entry point (unlearn for the
two-stage family and a baseline, evaluate, prepare), instead of the driver's or torch's raw error."""
import pytest
import torch
from torch.utils.data import TensorDataset

import entangle_ext as ee
from _tiny import mlp, params, tiny_config


def _unlearn(model, splits, method, **kw):
    cfg = tiny_config() if method == "two_stage" else None
    return ee.unlearn(model, splits, cfg, method=method, setting=None if cfg else "digits", progress=False, **kw)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is usable here")
@pytest.mark.parametrize("method", ["two_stage", "ft"])
def test_cuda_without_a_gpu_is_one_clear_error(small, method):
    model = mlp()
    before = params(model)
    with pytest.raises(ValueError, match=r"device 'cuda': no CUDA GPU is usable here .*pass device='cpu'"):
        _unlearn(model, small, method, device="cuda")
    torch.testing.assert_close(params(model), before, rtol=0, atol=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is usable here")
def test_cuda_without_a_gpu_in_evaluate_and_prepare(small):
    pytest.importorskip("sklearn")
    from entangle_ext.settings import prepare
    from entangle_ext.unlearn.evaluate import evaluate
    with pytest.raises(ValueError, match="no CUDA GPU is usable"):
        evaluate(mlp(), small, device="cuda")
    with pytest.raises(ValueError, match="no CUDA GPU is usable"):
        prepare("digits", "reduced", device="cuda", progress=False)


def test_an_index_past_the_visible_gpus_is_named():
    from entangle_ext.unlearn.inputs import check_device_usable
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match=f"device 'cuda:{n}'"):
        check_device_usable(torch.device("cuda", n))
    assert check_device_usable(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.parametrize("method", ["two_stage", "ft"])
def test_a_wrong_feature_width_names_the_split_and_its_inputs(small, method):
    x, y = small.remote.tensors
    bad = ee.Splits(forget=small.forget, adjacent=small.adjacent, remote=TensorDataset(x[:, :63].contiguous(), y))
    model = mlp()
    before = params(model)
    with pytest.raises(ValueError, match=r"split 'remote': the model \(Sequential\) cannot take this split's inputs "
                                         r"\(shape \(2, 63\) torch.float32; the model's parameters are torch.float32\)"):
        _unlearn(model, bad, method)
    torch.testing.assert_close(params(model), before, rtol=0, atol=0)


def test_integer_features_name_the_split(small):
    x, y = small.forget.tensors
    bad = ee.Splits(forget=TensorDataset((x * 16).long(), y), adjacent=small.adjacent, remote=small.remote)
    with pytest.raises(ValueError, match=r"split 'forget': .*shape \(2, 64\) torch.int64"):
        _unlearn(mlp(), bad, "two_stage")


# --- the model's output, grad mode, the meta device, device strings, loader options (review of
# the driver, stop 40): each one clear ValueError/TypeError before any training, model untouched.

class _Wrapped(torch.nn.Module):
    """`mlp` whose logits go through ``post`` (a forward a user may write wrong)."""

    def __init__(self, post):
        super().__init__()
        self.net, self.post = mlp(), post

    def forward(self, x):
        return self.post(self.net(x))


@pytest.mark.parametrize("method", ["two_stage", "ft", "retrain"])
def test_a_forward_that_detaches_is_named_at_the_first_gradient(small, method):
    model = _Wrapped(lambda z: z.detach())
    before = params(model)
    kw = {"model_fn": lambda: _Wrapped(lambda z: z.detach())} if method == "retrain" else {}
    with pytest.raises(ValueError, match=r"^the loss has no autograd graph to the model's trainable parameters.*"
                                         r"detaches its output \(\.detach\(\), .*torch.is_grad_enabled\(\) is True\)$"):
        _unlearn(model, small, method, **kw)
    torch.testing.assert_close(params(model), before, rtol=0, atol=0)


def test_relearn_time_and_grads_of_name_a_detaching_forward(small):
    from entangle_ext.unlearn.losses import grads_of
    from entangle_ext.unlearn.metrics import relearn_time
    x, y = small.forget.tensors
    wrong = torch.nn.functional.one_hot(1 - y, 2).float()   # every forget sample misclassified: relearning runs
    model = _Wrapped(lambda z: (z * 0 + wrong[:len(z)]).detach())
    with pytest.raises(ValueError, match=r"^the loss has no autograd graph"):
        relearn_time(model, small.forget, threshold=1.0, max_steps=2)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    with pytest.raises(ValueError, match=r"^the loss has no autograd graph"):
        grads_of(loss, list(model.parameters()))


@pytest.mark.parametrize("method", ["two_stage", "ft"])
@pytest.mark.parametrize("post, match", [
    (lambda z: z[:1], r"split 'forget': .* shape \(1, 2\) .* for 2 samples: expected one row per sample"),
    (lambda z: z.round().long(), r"split 'forget': .* dtype torch.int64 .*: logits must be a real floating dtype"),
    (lambda z: z[:, :1], r"split 'forget': .* shape \(2, 1\) .*: a classifier needs at least 2 classes"),
])
def test_logits_that_cannot_be_trained_are_named(small, method, post, match):
    model = _Wrapped(post)
    before = params(model)
    with pytest.raises(ValueError, match=match):
        _unlearn(model, small, method)
    torch.testing.assert_close(params(model), before, rtol=0, atol=0)


@pytest.mark.parametrize("inplace", [True, False])
@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_unlearn_under_no_grad_or_inference_mode_trains_as_outside(small, mode, inplace):
    """A call inside torch.no_grad() / torch.inference_mode() (the model built outside) runs as
    it would outside, and the caller's mode is back afterwards. With inplace=False the copy was
    made under inference_mode: its parameters were inference tensors, refused as "built or loaded
    under torch.inference_mode", which the model was not."""
    ref, model = mlp(), mlp()
    _unlearn(ref, small, "two_stage")
    before = params(model)
    with mode():
        out = _unlearn(model, small, "two_stage", inplace=inplace).model
        assert not torch.is_grad_enabled()
    assert (out is model) == inplace
    torch.testing.assert_close(params(out), params(ref), rtol=0, atol=0)
    assert not torch.equal(params(out), before)
    if not inplace:
        torch.testing.assert_close(params(model), before, rtol=0, atol=0)
        assert not any(p.is_inference() for p in out.parameters())


def test_stage_functions_and_training_under_no_grad(small):
    from entangle_ext.train import TrainRecipe, train_original
    cfg = tiny_config()
    ref, model = mlp(), mlp()
    ee.stage1(ref, small, cfg.stage1, progress=False)
    with torch.no_grad():
        ee.stage1(model, small, cfg.stage1, progress=False)
    torch.testing.assert_close(params(model), params(ref), rtol=0, atol=0)
    recipe = TrainRecipe("adam", lr=1e-2, epochs=1, batch_size=32)
    ref, model = mlp(), mlp()
    train_original(ref, [small.remote], recipe, progress=False)
    with torch.inference_mode():
        train_original(model, [small.remote], recipe, progress=False)
    torch.testing.assert_close(params(model), params(ref), rtol=0, atol=0)


def test_a_model_built_under_inference_mode_is_named(small):
    with torch.inference_mode():
        model = mlp()
    with pytest.raises(ValueError, match=r"parameter '0.weight' is an inference tensor .*outside inference_mode"):
        _unlearn(model, small, "two_stage")


@pytest.mark.parametrize("method", ["two_stage", "ft"])
def test_a_meta_model_is_named(small, method):
    with torch.device("meta"):
        model = mlp()
    with pytest.raises(ValueError, match=r"tensors on the meta device \(e.g. '0.weight'\).*to_empty"):
        _unlearn(model, small, method)


@pytest.mark.parametrize("device, match", [
    ("tpu:0", r"device 'tpu:0' is not a device torch knows"),
    ("gpu", r"device 'gpu' is not a device torch knows"),
    (3.5, r"device 3.5 is not a device torch knows"),
    ("meta", r"device 'meta': the meta device holds no values"),
    ("xla", r"device 'xla': this torch .* cannot make a tensor there"),
])
def test_a_device_this_process_cannot_run_on_is_named(small, device, match):
    model = mlp()
    before = params(model)
    with pytest.raises(ValueError, match=match):
        _unlearn(model, small, "two_stage", device=device)
    torch.testing.assert_close(params(model), before, rtol=0, atol=0)
    from entangle_ext.unlearn.evaluate import evaluate
    with pytest.raises(ValueError, match=match):
        evaluate(mlp(), small, device=device)


@pytest.mark.parametrize("kw, err, match", [
    ({"num_workers": -1}, ValueError, r"^Splits: num_workers must be >= 0 .*got -1$"),
    ({"num_workers": 1.5}, TypeError, r"^Splits: num_workers must be an int .*got float 1.5$"),
    ({"num_workers": True}, TypeError, r"^Splits: num_workers must be an int .*got bool True$"),
    ({"collate_fn": 3}, TypeError, r"^Splits: collate_fn must be a function .*got int 3$"),
])
def test_loader_options_of_splits_are_checked_when_made(small, kw, err, match):
    with pytest.raises(err, match=match):
        ee.Splits(forget=small.forget, adjacent=small.adjacent, remote=small.remote, **kw)


def test_retrain_checks_model_fn_against_the_model_before_training(small):
    built = []

    def model_fn():
        built.append(torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3)))
        return built[-1]
    model = mlp()
    before = params(model)
    with pytest.raises(ValueError, match=r"model_fn\(\) built a model whose state dict does not fit the given model "
                                         r".*other shapes: '2.weight': \(3, 32\) in model_fn\(\)'s model vs \(2, 32\)"):
        ee.unlearn(model, small, method="retrain", setting="digits", model_fn=model_fn, progress=False)
    torch.testing.assert_close(params(model), before, rtol=0, atol=0)
    # refused before training: model_fn's model still has its initial weights
    assert all(p.grad is None for p in built[0].parameters())


@pytest.mark.parametrize("form", ["collate_fn", "dataloader"])
@pytest.mark.parametrize("method", ["two_stage", "ft"])
def test_a_collate_function_of_ones_own_builds_tensor_dataset_batches(small, form, method):
    """A TensorDataset was batched by indexing even when a collate function was given (Splits'
    or a DataLoader's): it was never called, silently. Now it builds those batches: a counting
    wrapper of default_collate is called and gives the indexing run's weights; one that zeroes
    the inputs changes them."""
    from torch.utils.data import DataLoader, default_collate
    calls = []

    def counting(items):
        calls.append(len(items))
        return default_collate(items)

    def zeroing(items):
        x, y = default_collate(items)
        return torch.zeros_like(x), y

    def splits(fn):
        if form == "collate_fn":
            return ee.Splits(**small.named(), collate_fn=fn)
        return ee.Splits(**{k: DataLoader(v, batch_size=4, collate_fn=fn) for k, v in small.named().items()})
    ref, counted, zeroed = mlp(), mlp(), mlp()
    _unlearn(ref, small, method)
    _unlearn(counted, splits(counting), method)
    assert len(calls) > 0
    torch.testing.assert_close(params(counted), params(ref), rtol=0, atol=0)
    _unlearn(zeroed, splits(zeroing), method)
    assert not torch.equal(params(zeroed), params(ref))


@pytest.mark.parametrize("method", ["two_stage", "rl", "ssd"])
def test_train_splits_of_different_item_forms_are_refused_before_training(small, method):
    """A dict-item forget split beside (x, y) ones passed the per-split probe and failed mid-method
    (KeyError in concat_batches, torch's collate TypeError); a held-out split of another form is
    fine (never concatenated)."""
    from _tiny import DictDS, Keyword
    model = Keyword()
    before = params(model)
    mixed = ee.Splits(**{**small.named(), "forget": DictDS(small.forget)})
    with pytest.raises(ValueError, match=r"^the train splits give batches of different forms.*split 'forget': dict "
                                         r"keys \['pixels'\]; split 'adjacent': a tensor"):
        ee.unlearn(model, mixed, method=method, setting="digits", progress=False)
    torch.testing.assert_close(params(model), before, rtol=0, atol=0)
    ee.unlearn(Keyword(), ee.Splits(**{**small.named(), "forget_test": DictDS(small.forget_test)}),
               tiny_config(), progress=False)


class _MixedDtypes(torch.nn.Module):
    """A float64 hidden layer and a float32 head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.o = torch.nn.Linear(64, 32).double(), torch.nn.Linear(32, 2)

    def forward(self, x):
        return self.o(torch.relu(self.a(x.double())).float())


def test_parameters_of_several_dtypes_are_refused_before_stage1(small, tmp_path):
    """They failed inside Stage 2's projection, after Stage 1 had changed the model; now refused
    before the model moves or a file is written; a baseline (no projection) still runs them, and
    float32 with bfloat16 / float16 parameters (float32 master gradients) still runs Stage 2."""
    def weights(m):
        return torch.cat([p.detach().double().reshape(-1) for p in m.parameters()])
    model = _MixedDtypes()
    before = weights(model)
    with pytest.raises(ValueError, match=r"^stage 2: the trainable parameters' gradients are of 2 dtypes "
                                         r"\('a.weight': torch.float64, 'o.weight': torch.float32\)"):
        _unlearn(model, small, "two_stage", out_dir=tmp_path / "out")
    assert torch.equal(weights(model), before) and not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match=r"^stage 2: the trainable parameters' gradients are of 2 dtypes"):
        ee.stage2(_MixedDtypes(), small, tiny_config().stage2, progress=False)
    _unlearn(_MixedDtypes(), small, "ft")
    for low in (torch.bfloat16, torch.float16):
        head = torch.nn.Sequential(mlp(), torch.nn.Linear(2, 2).to(low))
        head.forward = lambda x, h=head: h[1](h[0](x).to(low)).float()
        _unlearn(head, small, "two_stage")


def test_a_sparse_embedding_is_refused(small):
    class Bag(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.e, self.o = torch.nn.EmbeddingBag(17, 8, sparse=True), torch.nn.Linear(8, 2)

        def forward(self, x):
            return self.o(self.e((x * 16).long()))
    with pytest.raises(ValueError, match=r"embedding 'e' has sparse=True.*build it with sparse=False"):
        _unlearn(Bag(), small, "two_stage")


@pytest.mark.parametrize("kw", [{"inplace": "False"}, {"progress": "yes"}, {"allow_config_change": 1}])
def test_flags_must_be_bools(small, kw):
    """inplace="False" is truthy: it updated the model in place."""
    model = mlp()
    before = params(model)
    name = next(iter(kw))
    with pytest.raises(TypeError, match=rf"^unlearn: {name} must be True or False, got "):
        ee.unlearn(model, small, tiny_config(), **{"progress": False, **kw})
    torch.testing.assert_close(params(model), before, rtol=0, atol=0)


@pytest.mark.parametrize("stage", ["stage1", "stage2"])
@pytest.mark.parametrize("change, err, match", [
    ({"config": "run"}, TypeError, r"config must be a Stage\dConfig \(a run config's .stage\d is one\), got UnlearnConfig"),
    ({"model": "m"}, TypeError, r"model must be a torch.nn.Module, got str"),
    ({"splits": {}}, TypeError, r"splits must be an entangle_ext.Splits, got dict"),
    ({"checkpoint_every": 2, "checkpoint_fn": 3}, TypeError, r"checkpoint_fn must be callable .*got int 3"),
    ({"seed": 1.5}, TypeError, r"seed must be an int, got float 1.5"),
    ({"seed": -2 ** 63 - 1}, ValueError, r"seed must be in \["),
    ({"progress": "no"}, TypeError, r"progress must be True or False"),
])
def test_stage_functions_check_their_arguments(small, stage, change, err, match):
    cfg = tiny_config()
    model = mlp()
    before = params(model)
    kw = {"model": model, "splits": small, "config": getattr(cfg, stage), "progress": False, **change}
    if kw["config"] == "run":
        kw["config"] = cfg
    fn = getattr(ee, stage)
    with pytest.raises(err, match=rf"^{stage}: {match}"):
        fn(kw.pop("model"), kw.pop("splits"), kw.pop("config"), **kw)
    torch.testing.assert_close(params(model), before, rtol=0, atol=0)


@pytest.mark.parametrize("c0, err", [("0.1", TypeError), (float("nan"), ValueError), (True, TypeError),
                                     (torch.tensor(float("inf")), ValueError), (torch.zeros(2), TypeError)])
def test_stage1_checks_c0(small, c0, err):
    with pytest.raises(err, match=r"^stage1: c0 must be"):
        ee.stage1(mlp(), small, tiny_config().stage1, c0=c0, progress=False)
    ee.stage1(mlp(), small, tiny_config().stage1, c0=torch.tensor(0.5), progress=False)   # a 0-d tensor is a number


def test_evaluate_checks_num_classes_and_counts_nan_logits_wrong(small):
    from entangle_ext.unlearn.evaluate import evaluate
    with pytest.raises(TypeError, match=r"^evaluate: num_classes must be None or an int >= 2 .*got str '2'"):
        evaluate(mlp(), small, num_classes="2")
    with pytest.raises(ValueError, match=r"^evaluate: num_classes must be None or an int >= 2 .*got 1$"):
        evaluate(mlp(), small, num_classes=1)
    with pytest.raises(TypeError, match=r"^evaluate: check_finite must be True or False"):
        evaluate(mlp(), small, check_finite="no")
    x, y = small.forget.tensors
    nan = ee.Splits(forget=TensorDataset(x * float("nan"), torch.zeros_like(y)))
    r = evaluate(mlp(), nan)["forget"]   # argmax of NaN logits is 0, which counted as correct: acc 1.0
    assert r["acc"] == 0.0 and r["loss"] != r["loss"]


def test_an_empty_out_dir_or_resume_and_a_resume_of_another_type_are_refused(small, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"^unlearn: out_dir is an empty path: pass None for no files"):
        ee.unlearn(mlp(), small, tiny_config(), out_dir="", progress=False)
    assert list(tmp_path.iterdir()) == []   # the run wrote its files into the current directory
    with pytest.raises(TypeError, match=r"^resume must be a checkpoint file, .*got int 3$"):
        ee.unlearn(mlp(), small, tiny_config(), resume=3, progress=False)
    with pytest.raises(ValueError, match=r"^resume is an empty path"):
        ee.unlearn(mlp(), small, tiny_config(), resume="", progress=False)


def test_retrains_progress_bar_is_not_labelled_original_model(small, capsys):
    ee.unlearn(mlp(), small, method="retrain", setting="digits", model_fn=mlp, progress=True)
    err = capsys.readouterr().err
    assert "retrain (from scratch)" in err and "original model" not in err


def test_a_complex_model_that_cannot_take_the_inputs_names_its_dtype(small):
    model = torch.nn.Linear(64, 2, dtype=torch.complex64)   # the message said "parameters are None"
    with pytest.raises(ValueError, match=r"the model's parameters are torch.complex64\)"):
        _unlearn(model, small, "two_stage")


def test_an_explicit_bf16_that_cannot_apply_warns(small):
    """amp='bf16' on a float64 model was dropped silently (the report said amp None); "auto" falls
    back quietly as documented."""
    import warnings
    with pytest.warns(UserWarning, match=r"amp='bf16' autocasts float32 models only: this torch.float64 model"):
        res = ee.unlearn(mlp().double(), small, tiny_config(amp="bf16"), progress=False)
    assert res.report["amp"] is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        ee.unlearn(mlp().double(), small, tiny_config(amp="auto"), progress=False)


class _OptionalBias(torch.nn.Module):
    """Takes nested dict inputs {"feat": {"a": x, "bias": b (optional)}}."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, feat):
        out = self.lin(feat["a"])
        return out + feat["bias"] if "bias" in feat else out


def test_batches_whose_nests_differ_are_not_concatenated():
    """concat_batches took the first batch's nested keys / sequence lengths: Stage 1's remote and
    forget batches of one top-level form but another nest ({"a"} vs {"a", "bias"}) were cut to the
    first's, the forget samples' "bias" silently dropped and their CE wrong. Now they do not
    concatenate (one pass each)."""
    from entangle_ext.unlearn.batch import concat_batches
    from entangle_ext.unlearn.losses import per_sample_ce
    from entangle_ext.unlearn.stage1_al import _remote_and_forget_ce
    model = _OptionalBias()
    rb = ({"feat": {"a": torch.randn(2, 3)}}, torch.tensor([0, 1]))
    fb = ({"feat": {"a": torch.randn(2, 3), "bias": torch.tensor([[5.0, -5.0]] * 2)}}, torch.tensor([0, 1]))
    _, ce_f = _remote_and_forget_ce(model, rb, fb)
    torch.testing.assert_close(ce_f, per_sample_ce(model, fb))
    short, long = ([torch.ones(2, 3)], torch.tensor([0, 1])), ([torch.ones(2, 3)] * 2, torch.tensor([0, 1]))
    assert concat_batches([short, long]) is None and concat_batches([long, short]) is None
    listed = ([torch.ones(2, 3)], torch.tensor([0, 1]))
    tupled = ((torch.zeros(1, 3),), torch.tensor([1]))   # a list and a tuple are one form
    assert concat_batches([listed, tupled])[0][0].shape == (3, 3)


def test_a_batch_that_is_not_cut_into_samples_still_gives_its_empty_part():
    """The 0-sample batch of a split whose inputs are a dict holding a tuple of str (an empty part
    of a global batch on one rank): ``dict[0:0]`` raised TypeError. Dicts are entered, tensors and
    sequences cut."""
    from entangle_ext.unlearn.batch import slice_batch
    batch = ({"text": ("a", "b", "c"), "x": torch.ones(3, 4)}, torch.tensor([0, 1, 1]))
    (inputs, y) = slice_batch(batch, 0, 0)
    assert inputs["text"] == () and inputs["x"].shape == (0, 4) and y.shape == (0,)
    (inputs, y) = slice_batch(batch, 1, 3)
    assert inputs["text"] == ("b", "c") and inputs["x"].shape == (2, 4) and y.tolist() == [1, 1]
    flat = slice_batch({"text": ["a", "b"], "labels": torch.tensor([0, 1])}, 0, 1)
    assert flat["text"] == ["a"] and flat["labels"].tolist() == [0]
