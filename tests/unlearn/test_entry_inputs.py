"""`unlearn` on the inputs users have: labels of any integer dtype, channels_last / strided
parameters, float16/bfloat16 models and autocast, non-finite data, DataLoaders with workers,
variable-length token batches, Hugging Face ``label`` columns, Stage-1-only runs, models without
trainable parameters, ``inplace=False``."""
import dataclasses

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

import entangle_ext as ee
from entangle_ext.unlearn import load_checkpoint

from _tiny import AutocastProbe, BagOfTokens, DictDS, Tokens, mlp, pad_collate, params, tiny_config

pytestmark = [pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}"),
              pytest.mark.usefixtures("one_thread")]


def _map(splits, fn):
    """Splits with fn(x, y) -> (x, y) applied to every TensorDataset."""
    return ee.Splits(**{k: TensorDataset(*fn(*v.tensors)) for k, v in splits.named().items()})


# --------------------------------------------------------------------------------- labels
@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.int8, torch.uint8])
def test_integer_labels_of_any_dtype(small, dtype):
    ref = ee.unlearn(mlp(), small, tiny_config(), progress=False)
    res = ee.unlearn(mlp(), _map(small, lambda x, y: (x, y.to(dtype))), tiny_config(), progress=False)
    assert torch.equal(params(res.model), params(ref.model))
    assert res.report["evals"] == ref.report["evals"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_float_and_bool_labels_are_rejected_before_any_compute(small, dtype):
    model = mlp()
    before = params(model)
    s = dataclasses.replace(small, adjacent=TensorDataset(small.adjacent.tensors[0],
                                                          small.adjacent.tensors[1].to(dtype)))
    with pytest.raises(ValueError, match=r"split 'adjacent'.*integer dtype: torch.int64, torch.int32"):
        ee.unlearn(model, s, tiny_config(), progress=False)
    assert torch.equal(params(model), before)


# ------------------------------------------------------------------- layouts and strides
class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c1, self.c2 = torch.nn.Conv2d(1, 4, 3), torch.nn.Conv2d(4, 6, 3)
        self.fc = torch.nn.Linear(6 * 4 * 4, 2)

    def forward(self, x):
        x = torch.relu(self.c2(torch.relu(self.c1(x.view(-1, 1, 8, 8)))))
        return self.fc(x.flatten(1))


class TransposedLinear(torch.nn.Module):
    """A 2-layer MLP whose first weight is a transposed view (strides (1, out))."""

    def __init__(self, transposed: bool):
        super().__init__()
        torch.manual_seed(0)
        w = torch.randn(32, 64) * 0.1
        self.w = torch.nn.Parameter(w.t().contiguous().t() if transposed else w)
        self.b = torch.nn.Parameter(torch.zeros(32))
        self.out = torch.nn.Linear(32, 2)

    def forward(self, x):
        return self.out(torch.relu(x @ self.w.t() + self.b))


@pytest.mark.parametrize("kind", ["channels_last", "transposed"])
def test_non_contiguous_parameters_give_the_contiguous_result(small, kind):
    s = _map(small, lambda x, y: (x.double(), y))
    if kind == "channels_last":
        plain, strided = ConvNet().double(), ConvNet().double().to(memory_format=torch.channels_last)
    else:
        plain, strided = TransposedLinear(False).double(), TransposedLinear(True).double()
    assert not all(p.is_contiguous() for p in strided.parameters())
    start = params(plain)
    a = ee.unlearn(plain, s, tiny_config(), progress=False)
    b = ee.unlearn(strided, s, tiny_config(), progress=False)
    assert not all(p.is_contiguous() for p in b.model.parameters())   # layout kept
    torch.testing.assert_close(params(b.model), params(a.model), rtol=1e-9, atol=1e-12)
    assert (params(a.model) - start).abs().max() > 1e-3   # the run moved the weights


# --------------------------------------------------------------------------- precision
def _digits_original(cache_dir):
    """The digits 'reduced' splits and original model, cast to float32 (the setting's float64 is
    not what these precision tests are about)."""
    pytest.importorskip("sklearn")
    from torch.utils.data import TensorDataset
    from entangle_ext.settings import prepare
    run = prepare("digits", "reduced", cache_dir=cache_dir, progress=False)
    splits = ee.Splits(**{k: TensorDataset(d.tensors[0].float(), d.tensors[1]) for k, d in run.splits.named().items()})
    return splits, run.model.float()


@pytest.mark.parametrize("mode", ["bf16_model", "amp_bf16"])
def test_bfloat16_end_to_end_on_digits(mode, tmp_path):
    s, model = _digits_original(tmp_path)   # float32 data in both modes
    cfg = ee.UnlearnConfig.preset("digits")
    cfg.stage2 = dataclasses.replace(cfg.stage2, epochs=8)
    if mode == "bf16_model":
        model = model.to(torch.bfloat16)
    else:
        cfg.amp = "bf16"
    r = ee.unlearn(model, s, cfg, progress=False)
    ev = r.report["evals"]
    assert r.report["config"]["amp"] == (None if mode == "bf16_model" else "bf16")
    assert all(p.dtype == (torch.bfloat16 if mode == "bf16_model" else torch.float32)
               for p in r.model.parameters())
    assert ev["original"]["forget"]["acc"] > 0.9
    assert ev["stage1"]["forget"]["acc"] < 0.2 and ev["stage2"]["forget"]["acc"] < 0.3
    assert ev["stage2"]["adjacent"]["acc"] > ev["stage1"]["adjacent"]["acc"] + 0.3
    assert ev["stage2"]["remote"]["acc"] > 0.8


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_models_keep_float32_state(small, dtype, tmp_path):
    cfg = dataclasses.replace(tiny_config(), checkpoint_every=2)
    r = ee.unlearn(mlp().to(dtype), small, cfg, out_dir=tmp_path, progress=False)
    assert all(torch.isfinite(p).all() and p.dtype == dtype for p in r.model.parameters())
    s1 = load_checkpoint(tmp_path / "checkpoints" / "stage1_step000002.pt")
    assert s1["lagrangian"]["lam"].dtype == s1["lagrangian"]["c0"].dtype == torch.float32
    assert s1["lagrangian"]["mu"].dtype == torch.float32
    assert all(t.dtype == torch.float32 for t in s1["master"])
    assert all(st["exp_avg"].dtype == torch.float32 for st in s1["optimizer"]["state"].values())
    s2 = load_checkpoint(tmp_path / "checkpoints" / "stage2_step000002.pt")
    assert all(t.dtype == torch.float32 for t in s2["momentum"] + s2["master"])


def test_amp_runs_every_forward_under_autocast(small):
    seen = []
    r = ee.unlearn(AutocastProbe(seen), small, tiny_config(amp="bf16"), progress=False)
    assert seen and all(s == (True, torch.bfloat16) for s in seen)
    assert all(p.dtype == torch.float32 for p in r.model.parameters())
    assert not torch.is_autocast_enabled("cpu")


def test_floating_inputs_are_cast_to_the_model_dtype(small):
    a = ee.unlearn(mlp(), small, tiny_config(), progress=False)
    b = ee.unlearn(mlp(), _map(small, lambda x, y: (x.double(), y)), tiny_config(), progress=False)
    assert torch.equal(params(a.model), params(b.model))


# ------------------------------------------------------------------------ non-finite data
@pytest.mark.parametrize("split, rows", [("forget", [3]), ("adjacent", [5, 17]), ("remote_test", [0])])
def test_non_finite_samples_are_named_before_stage1(small, split, rows):
    x, y = (t.clone() for t in getattr(small, split).tensors)
    x[rows[0], 4] = float("nan")
    for r in rows[1:]:
        x[r, 0] = float("inf")
    model = mlp()
    before = params(model)
    with pytest.raises(ValueError, match=rf"split '{split}'.*non-finite.*{len(rows)} of {len(y)} "
                                         rf"samples, dataset indices \[{', '.join(map(str, rows))}\]"):
        ee.unlearn(model, dataclasses.replace(small, **{split: TensorDataset(x, y)}), tiny_config(),
                   progress=False)
    assert torch.equal(params(model), before)


# ---------------------------------------------------------------- data in the forms users have
class DiskDigits(Dataset):
    """A disk-backed dataset (a .npy file memory-mapped in each worker), items (x, int label)."""

    def __init__(self, tds, path):
        x, y = tds.tensors
        np.save(path, x.numpy())
        self.path, self.y, self._x = str(path), y.tolist(), None

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        if self._x is None:
            self._x = np.load(self.path, mmap_mode="r")
        return torch.from_numpy(np.array(self._x[i])), self.y[i]


def test_dataloader_splits_with_workers_match_tensor_splits(small, tmp_path):
    loaders = {k: DataLoader(DiskDigits(v, tmp_path / f"{k}.npy"), batch_size=7, shuffle=True,
                             num_workers=2)
               for k, v in small.named().items()}
    a = ee.unlearn(mlp(), small, tiny_config(), progress=False)
    b = ee.unlearn(mlp(), ee.Splits(**loaders), tiny_config(), progress=False)
    assert torch.equal(params(a.model), params(b.model))
    assert a.report["evals"] == b.report["evals"]


@pytest.mark.parametrize("form", ["collate_fn", "dataloader"])
def test_variable_length_token_batches(form):
    parts = {"forget": Tokens(20, 1, 0), "adjacent": Tokens(40, 1, 1), "remote": Tokens(40, 0, 2)}
    if form == "collate_fn":
        splits = ee.Splits(**parts, collate_fn=pad_collate)
    else:
        splits = ee.Splits(**{k: DataLoader(v, batch_size=4, collate_fn=pad_collate)
                              for k, v in parts.items()})
    model = BagOfTokens()
    start = params(model)
    r = ee.unlearn(model, splits, tiny_config(), progress=False)
    assert r.report["steps"] == {"stage1": 3, "stage2": 2}
    assert (params(r.model) - start).abs().max() > 1e-4
    assert all(torch.isfinite(p).all() for p in r.model.parameters())


def test_hugging_face_label_column(small):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def forward(self, x):
            return self.net(x)
    a = ee.unlearn(Net(), ee.Splits(**{k: DictDS(v, "labels", "x") for k, v in small.named().items()}),
                   tiny_config(), progress=False)
    b = ee.unlearn(Net(), ee.Splits(**{k: DictDS(v, "label", "x") for k, v in small.named().items()}),
                   tiny_config(), progress=False)
    assert torch.equal(params(a.model), params(b.model))


def test_stage1_only_run_without_adjacent_split_and_max_steps(small):
    cfg = tiny_config(run_stage2=False)
    cfg.stage1.max_steps = 4
    s = ee.Splits(forget=small.forget, remote=small.remote, forget_test=small.forget_test)
    r = ee.unlearn(mlp(), s, cfg, progress=False)
    assert r.report["steps"] == {"stage1": 4, "stage2": 0}
    assert set(r.report["evals"]) == {"original", "stage1", "final"}
    assert set(r.report["evals"]["stage1"]) == {"forget", "remote", "forget_test"}
    with pytest.raises(ValueError, match="'adjacent' is required"):
        ee.unlearn(mlp(), s, tiny_config(), progress=False)
    with pytest.raises(ValueError, match="max_steps"):
        ee.Stage1Config(max_steps=0)


@pytest.mark.parametrize("method", ["two_stage", "ga"])
def test_model_and_splits_of_the_wrong_type_are_type_errors_up_front(small, method, tmp_path):
    kw = dict(method=method, setting="digits", out_dir=tmp_path, progress=False)
    for inplace in (True, False):
        with pytest.raises(TypeError, match="^unlearn: model must be a torch.nn.Module, got function$"):
            ee.unlearn(lambda x: x, small, inplace=inplace, **kw)
    with pytest.raises(TypeError, match="^unlearn: splits must be an entangle_ext.Splits, got dict$"):
        ee.unlearn(mlp(), small.named(), **kw)
    with pytest.raises(TypeError, match="got NoneType"):
        ee.unlearn(mlp(), None, **kw)
    assert not list(tmp_path.iterdir())                                   # nothing written


def test_model_without_trainable_parameters(small):
    model = mlp().requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        ee.unlearn(model, small, tiny_config(), progress=False)
    for stage, cfg in (("stage1", tiny_config().stage1), ("stage2", tiny_config().stage2)):
        with pytest.raises(ValueError, match="no trainable parameters"):
            getattr(ee, stage)(model, small, cfg, progress=False)


def test_inplace_false_leaves_the_model_untouched(small):
    model = mlp()
    before = params(model)
    r = ee.unlearn(model, small, tiny_config(), inplace=False, progress=False)
    assert r.model is not model and torch.equal(params(model), before)
    assert (params(r.model) - before).abs().max() > 1e-4
    r2 = ee.unlearn(model, small, tiny_config(), progress=False)   # default: in place
    assert r2.model is model and torch.equal(params(model), params(r.model))


class _Unlabelled(Dataset):
    """Items that are bare input tensors (no label)."""

    def __init__(self, x):
        self.x = x

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i]


def _split_forms(small):
    x, y = small.forget.tensors
    return [("forget", (x, y), r" is a tuple of 2 tensors / arrays \(e\.g\. \(X, y\)\)"),
            ("remote", np.concatenate([x.numpy(), y.numpy()[:, None]], 1), r" is a numpy\.ndarray"),
            ("adjacent", x, r" is a torch\.Tensor"),
            ("forget", TensorDataset(x), r" is a TensorDataset of 1 tensor"),
            ("adjacent", [x[i] for i in range(len(x))], r" is a list of \d+ tensors / arrays"),
            ("forget", _Unlabelled(x), r": its items give a Tensor batch"),
            # (x, sample_id, y): element 1 was taken as the label, the rest dropped, without a word
            ("forget", TensorDataset(x, torch.zeros_like(y), y), r": its items give a 3-element tuple batch")]


@pytest.mark.parametrize("k", range(7))
@pytest.mark.parametrize("entry", ["two_stage", "ga", "evaluate"])
def test_a_split_of_the_wrong_form_is_named_with_what_to_pass(small, k, entry):
    """A split that is not a Dataset of (x, y) items (arrays, an (X, y) tuple, a one-tensor
    TensorDataset, unlabelled items, items of 3 elements) is a ValueError naming the split and the fix (was: torch's
    "stack expects each tensor to be equal size" or a message without the split)."""
    name, bad, says = _split_forms(small)[k]
    s = dataclasses.replace(small, **{name: bad})
    with pytest.raises(ValueError, match=rf"split '{name}'{says}.*TensorDataset\(X, y\)"):
        if entry == "evaluate":
            ee.evaluate(mlp(), s)
        else:
            ee.unlearn(mlp(), s, method=entry, setting="digits", progress=False)


class _LongerThanItsData(Dataset):
    """A user's Dataset whose ``__len__`` claims 3 items more than it holds."""

    def __init__(self, tds):
        self.x, self.y = tds.tensors

    def __len__(self):
        return len(self.y) + 3

    def __getitem__(self, i):
        return self.x[i], self.y[i]


@pytest.mark.parametrize("workers", [0, 1])
def test_a_dataset_error_keeps_its_type_and_names_the_split(small, workers):
    """The user's own IndexError came out of the fingerprint pass without a word of which split
    (or that its len() was the problem). It keeps its type (the user's code raised it) and gets a
    note naming the split and its claimed length, by the direct fetch and by a DataLoader too."""
    splits = ee.Splits(forget=small.forget, adjacent=_LongerThanItsData(small.adjacent), remote=small.remote,
                       num_workers=workers)
    with pytest.raises(IndexError) as e:
        ee.unlearn(mlp(), splits, tiny_config(), progress=False)
    assert any("of split 'adjacent'" in n and "its len() is 83" in n for n in e.value.__notes__), e.value.__notes__
    from entangle_ext.unlearn.data import BatchStream
    stream = BatchStream(_LongerThanItsData(small.adjacent), 4, shuffle=False, seed=0, name="s2/adjacent", device="cpu")
    with pytest.raises(IndexError) as e:
        stream.fetch(torch.tensor([1, 81]))
    assert e.value.__notes__ == ["entangle_ext: raised while reading items [1, 81] of split 'adjacent' "
                                 "(stream 's2/adjacent'; its len() is 83)"]
    # the package's own checks of what was read get no such note (it is for the user's code)
    bad = TensorDataset(torch.randn(4, 64), torch.rand(4))   # float labels: prepare_batch's ValueError
    with pytest.raises(ValueError, match="labels must be integer") as e:
        BatchStream(bad, 2, shuffle=False, seed=0, name="s1/remote", device="cpu").fetch(torch.tensor([0, 1]))
    assert not getattr(e.value, "__notes__", None)
