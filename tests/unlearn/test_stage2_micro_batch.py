"""Stage 2's micro_batch="auto": bounded by the largest activation on CPU, one pass elsewhere, the
probe leaves the model as it was, and the gradients equal one pass's up to round-off."""
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
