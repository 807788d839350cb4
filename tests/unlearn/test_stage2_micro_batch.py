"""Stage 2's micro_batch="auto": bounded by the largest activation on CPU, one pass elsewhere, the
probe leaves the model as it was, and the gradients equal one pass's up to round-off."""
import collections
import copy

import pytest
import torch

import entangle_ext as ee
from entangle_ext.unlearn import losses, stages
from entangle_ext.unlearn.checkpoint import check_resume
from entangle_ext.unlearn.config import Stage2Config
from entangle_ext.unlearn.losses import CPU_CHUNK_BYTES, auto_micro_batch, forget_grad, remote_grad


def _cnn(channels=8):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, channels, 3, padding=1),
                               torch.nn.BatchNorm2d(channels), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                               torch.nn.Linear(channels, 4))


def _batch(n=6, hw=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, hw, hw, generator=g, dtype=dtype), torch.randint(0, 4, (n,), generator=g)


def test_default_is_auto_and_values_are_checked():
    assert Stage2Config().micro_batch == "auto"
    assert Stage2Config(micro_batch=None).micro_batch is None and Stage2Config(micro_batch=3).micro_batch == 3
    with pytest.raises(ValueError, match="micro_batch"):
        Stage2Config(micro_batch=0)
    for bad in ("big", 2.5, True):
        with pytest.raises(TypeError, match="int or 'auto' or None"):
            Stage2Config(micro_batch=bad)


@pytest.mark.parametrize("channels,hw,dtype", [(8, 16, torch.float32), (32, 32, torch.float32),
                                               (8, 16, torch.float64)])
def test_auto_is_the_budget_over_the_largest_activation(channels, hw, dtype):
    model = _cnn(channels).to(dtype)
    largest = channels * hw * hw * dtype.itemsize     # conv / BN / ReLU output of one sample
    assert auto_micro_batch(model, _batch(hw=hw, dtype=dtype)) == CPU_CHUNK_BYTES // largest


def test_auto_at_least_one_and_one_pass_off_cpu(monkeypatch):
    monkeypatch.setattr(losses, "CPU_CHUNK_BYTES", 10)
    assert auto_micro_batch(_cnn(), _batch()) == 1
    x, y = _batch()
    assert auto_micro_batch(_cnn(), (x.to("meta"), y.to("meta"))) is None   # not CPU: no probe
    if torch.cuda.is_available():
        assert auto_micro_batch(_cnn().cuda(), (x.cuda(), y.cuda())) is None


def test_probe_leaves_modes_statistics_and_grads_alone():
    model = _cnn()
    model.train()
    model[2].eval()                                    # mixed modes are restored one by one
    state = copy.deepcopy(model.state_dict())
    auto_micro_batch(model, _batch())
    assert [m.training for m in model] == [True, True, False, True, True, True]
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k                 # BatchNorm statistics unchanged
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("budget_samples", [1, 4, 100])
def test_auto_chunks_give_the_one_pass_gradients(monkeypatch, budget_samples):
    model = _cnn().double().eval()
    params = list(model.parameters())
    batches = [_batch(6, dtype=torch.float64), _batch(5, dtype=torch.float64)]
    sizes = [6, 5]
    monkeypatch.setattr(losses, "CPU_CHUNK_BYTES", budget_samples * 8 * 16 * 16 * 8)
    assert auto_micro_batch(model, batches[0]) == budget_samples
    b_ref = -torch.rand(11, dtype=torch.float64)
    one = Stage2Config(micro_batch=None)
    g_one, obj_one, *_ = forget_grad(model, params, batches, b_ref, sizes, one)
    g_auto, obj_auto, *_ = forget_grad(model, params, batches, b_ref, sizes, Stage2Config())
    torch.testing.assert_close(obj_auto, obj_one)
    for a, b in zip(g_auto, g_one):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    (r_one, ce_one), (r_auto, ce_auto) = (remote_grad(model, params, batches, sizes, mb)
                                          for mb in (None, "auto"))
    torch.testing.assert_close(ce_auto, ce_one)
    for a, b in zip(r_auto, r_one):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_stage2_probes_once_per_run(monkeypatch):
    calls = []

    def counting(model, batch):
        calls.append(len(batch[1]))
        return 2
    monkeypatch.setattr(stages, "auto_micro_batch", counting)
    g = torch.Generator().manual_seed(0)

    def ds(n):
        return torch.utils.data.TensorDataset(torch.randn(n, 3, 8, 8, generator=g),
                                              torch.randint(0, 4, (n,), generator=g))
    splits = ee.Splits(forget=ds(8), adjacent=ds(12), remote=ds(10))
    cfg = Stage2Config(epochs=1, adjacent_batch_size=4, forget_batch_size=4, forget_batch_limit=2,
                       remote_batch_size=5, remote_batch_limit=2)
    r = ee.stage2(_cnn().eval(), splits, cfg, progress=False)
    assert r.steps == 3 and calls == [4]


def test_resume_may_change_micro_batch():
    from entangle_ext.unlearn.checkpoint import FINGERPRINT_VERSION
    ckpt = {"config": {"stage2": {"micro_batch": None, "lr": 0.1}},
            "fingerprint": {"version": FINGERPRINT_VERSION, "splits": {}}}
    assert check_resume(ckpt, {}, {"stage2": {"micro_batch": "auto", "lr": 0.1}}) == {}
    with pytest.raises(ValueError, match="stage2.lr"):
        check_resume(ckpt, {}, {"stage2": {"micro_batch": "auto", "lr": 0.2}})


# ------------------------------------------------------------------ nested inputs
_Halves = collections.namedtuple("_Halves", ["a", "b"])


class _Nested(torch.utils.data.Dataset):
    """(X[i], y[i]) of a TensorDataset as nested items: "dict" ({"a": x[:32], "b": x[32:]}, y),
    "tuple" ((x[:32], x[32:]), y), "named" (Halves(a, b), y) or "deep" {"feats": {"a": ..., "b": ...},
    "labels": y}."""

    def __init__(self, tds, form):
        (self.x, self.y), self.form = tds.tensors, form

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        a, b = self.x[i, :32], self.x[i, 32:]
        if self.form == "dict":
            return {"a": a, "b": b}, self.y[i]
        if self.form == "tuple":
            return (a, b), self.y[i]
        if self.form == "named":
            return _Halves(a, b), self.y[i]
        if self.form == "tagged":   # default_collate: [[A, B], ("tag", ...)]-like, a tuple of str inside
            return (a, b, f"tag{i}"), self.y[i]
        if self.form == "ragged":   # with _ragged_collate: a list of per-sample tensors
            return torch.cat([a, b]), self.y[i]
        return {"feats": {"a": a, "b": b}, "labels": self.y[i]}


class _TwoHalves(torch.nn.Module):
    """`_tiny.mlp` on the two halves of a digit image, however they are nested."""

    def __init__(self):
        super().__init__()
        from _tiny import mlp
        self.net = mlp()

    def forward(self, *args, **kw):
        pair = args[0] if args else kw.get("feats", kw)
        if isinstance(pair, list) and all(t.dim() == 1 for t in pair):   # "ragged": one tensor per sample
            return self.net(torch.stack(pair))
        a, b = (pair["a"], pair["b"]) if isinstance(pair, dict) else pair[:2]
        return self.net(torch.cat([a, b], 1))


def _ragged_collate(items):
    """(list of per-sample input tensors, labels): what a collate function for ragged inputs makes."""
    return [x for x, _ in items], torch.stack([torch.as_tensor(y) for _, y in items])


@pytest.mark.parametrize("form", ["dict", "tuple", "named", "deep", "tagged", "ragged"])
@pytest.mark.parametrize("micro_batch", ["auto", 3])
def test_nested_inputs_run_stage2_micro_batches_like_flat_ones(small, form, micro_batch, monkeypatch):
    """Micro-batching sliced and concatenated one level only: nested inputs passed every check and
    Stage 1, then Stage 2 died (dict: "unhashable type: 'slice'"; tuple: the inputs were not sliced
    while the labels were) after Stage 1 had changed the model in place; a namedtuple of inputs
    could not even be moved to the device. Now the nest is sliced at every depth, and the run
    equals the same run on flat inputs. Inputs that are not all per-sample tensors ("tagged": a
    tuple of str inside; "ragged": a list of per-sample tensors) are never cut or joined (a first
    nest rule cut the outer list of the one and zipped the samples of the other): each batch is one
    pass, the same math."""
    from _tiny import mlp, params, tiny_config
    monkeypatch.setattr(losses, "CPU_CHUNK_BYTES", 64 * 4 * 5)   # "auto": 5 samples per pass here
    cfg = tiny_config(stage2={"micro_batch": micro_batch})
    flat = ee.unlearn(mlp(), small, cfg, progress=False)
    nested = ee.Splits(**{k: _Nested(v, form) for k, v in vars(small).items()
                          if isinstance(v, torch.utils.data.TensorDataset)},
                       collate_fn=_ragged_collate if form == "ragged" else None)
    res = ee.unlearn(_TwoHalves(), nested, cfg, progress=False)
    torch.testing.assert_close(params(res.model), params(flat.model), rtol=1e-5, atol=1e-6)
    got, want = res.report["evals"]["final"], flat.report["evals"]["final"]
    assert {k: v["acc"] for k, v in got.items()} == {k: v["acc"] for k, v in want.items()}
