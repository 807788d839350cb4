"""Issue 24 item 1: no training batch of one sample (BatchNorm in train mode cannot take it), and a
Retrain that fails mid-run leaves the caller's weights as they were.

Splits of n ≡ 1 (mod batch size) on a Linear → BatchNorm1d → ReLU → Linear model: every method
and `train_original` finish (for a model with BatchNorm the 1-sample tail is folded into the batch
before it, see `BatchStream`); the fold is deterministic and resumable."""
import pytest
import torch
from torch.utils.data import TensorDataset

import entangle_ext as ee
from entangle_ext.methods import get_method
from entangle_ext.methods.retrain import RetrainConfig
from entangle_ext.train import TrainRecipe, train_original
from entangle_ext.unlearn.data import BatchLargerThanSplitWarning, BatchStream

from _tiny import mlp, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


def bn_model(seed=0):
    """64 → 16 → BatchNorm1d → ReLU → 2."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 2))


def tds(n, seed):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 64, generator=g), torch.randint(0, 2, (n,), generator=g))


def splits(forget, adjacent, remote):
    return ee.Splits(forget=tds(forget, 1), adjacent=tds(adjacent, 2), remote=tds(remote, 3))


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same_state(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------ every trainer finishes
def test_retrain_batch_of_one_folded():
    # retain = 64 + 65 = 2·64 + 1
    cfg = RetrainConfig(recipe=TrainRecipe(epochs=2, batch_size=64))
    r = ee.unlearn(bn_model(), splits(20, 64, 65), cfg, method="retrain", progress=False)
    assert all(torch.isfinite(p).all() for p in r.model.parameters())


def test_munba_batch_of_one_folded():
    # retain 129 = 2·64 + 1, forget 33 = 32 + 1; MUNBa steps in train mode
    cfg = get_method("munba").config_for("digits", epochs=1, batch_size=64, forget_batch_size=32)
    assert cfg.train_mode
    r = ee.unlearn(bn_model(), splits(33, 64, 65), cfg, method="munba", progress=False)
    assert r.report["steps"]["munba"] == 2


def test_ft_train_mode_batch_of_one_folded():
    cfg = get_method("ft").config_for("digits", epochs=1, batch_size=64, train_mode=True)
    r = ee.unlearn(bn_model(), splits(20, 64, 65), cfg, method="ft", progress=False)
    assert r.report["steps"]["ft"] == 2


def test_two_stage_batch_of_one_folded():
    # forget 33 (≡ 1 mod 16 and mod 8), adjacent 65 (mod 32), remote 65 (mod 16 and mod 32)
    r = ee.unlearn(bn_model(), splits(33, 65, 65), tiny_config(), progress=False)
    assert r.report["steps"]["stage1"] == 4 and r.report["steps"]["stage2"] == 2


@pytest.mark.parametrize("method, over", [("gdr", {}), ("munba", {}), ("delete", {}), ("ga", {"train_mode": True}),
                                          ("salun", {"train_mode": True}), ("scrub", {"train_mode": True})])
def test_a_one_sample_forget_split_trains_in_train_mode(method, over):
    """A split of one sample cannot be folded: its train-mode forward passes run the BatchNorm
    layers on their running statistics (was: torch's "Expected more than 1 value per channel
    when training" from gdr, munba and delete)."""
    cfg = get_method(method).config_for("digits", epochs=1, **over)
    assert cfg.train_mode
    model = bn_model()
    modes = [m.training for m in model.modules()]
    r = ee.unlearn(model, splits(1, 64, 65), cfg, method=method, progress=False)
    assert r.report["steps"][method] >= 1
    assert all(torch.isfinite(p).all() for p in r.model.parameters())
    assert [m.training for m in model.modules()] == modes   # the caller's modes are back


def test_forward_of_one_sample_in_train_mode_uses_running_statistics():
    from entangle_ext.unlearn.batch import forward_logits
    model = bn_model().train()
    x = torch.randn(1, 64)
    out = forward_logits(model, x)
    assert model.training and model[1].training           # restored after the pass
    assert torch.equal(out, model.eval()(x))              # the running statistics normalised it
    model.train()
    with pytest.raises(ValueError, match="Expected more than 1 value"):   # torch's own call is unchanged
        model(x)


def test_train_original_batch_of_one_folded():
    model = train_original(bn_model(), [tds(129, 4)], TrainRecipe(epochs=2, batch_size=64), progress=False)
    assert all(torch.isfinite(p).all() for p in model.parameters())


# ------------------------------------------------------------------ the stream's fold
def stream(n, training=True, **kw):
    return BatchStream(tds(n, 5), 64, shuffle=True, seed=3, name="t", device="cpu", training=training, **kw)


def test_stream_folds_one_sample_tail():
    s = stream(129)
    assert len(s) == 2 and s.fold
    for e in range(3):
        idx = s.global_batch_indices(e)
        assert [len(i) for i in idx] == [64, 65]
        assert sorted(torch.cat(idx).tolist()) == list(range(129))   # every sample once per epoch
    assert [s.shard_span(p) for p in range(2)] == [(0, 64, 64), (0, 65, 65)]
    assert [len(b[1]) for b in s.epoch_batches(0)] == [64, 65]
    assert [len(b[1]) for b in s.fetch_pass(1, 5)] == [64, 65]
    # an evaluation stream keeps the plain split; other sizes are not folded
    assert [len(i) for i in stream(129, training=False).global_batch_indices(0)] == [64, 64, 1]
    # the library folds for models with BatchNorm only (fold_tail=has_batchnorm(model))
    from entangle_ext.unlearn.data import has_batchnorm
    assert has_batchnorm(bn_model()) and not has_batchnorm(mlp())
    assert [len(i) for i in stream(129, fold_tail=False).global_batch_indices(0)] == [64, 64, 1]
    assert [len(i) for i in stream(130).global_batch_indices(0)] == [64, 64, 2]
    assert [len(i) for i in stream(65).global_batch_indices(0)] == [65]
    with pytest.warns(BatchLargerThanSplitWarning):
        one = stream(1)
    assert [len(i) for i in one.global_batch_indices(0)] == [1]   # nothing to fold into


def test_stream_fold_resumes():
    full = stream(129)
    want = [full.next()[1] for _ in range(7)]
    first = stream(129)
    got = [first.next()[1] for _ in range(3)]
    resumed = stream(129)
    resumed.load_state_dict(first.state_dict())
    got += [resumed.next()[1] for _ in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert [len(y) for y in got] == [64, 65] * 3 + [64]
    assert full.state_dict() == resumed.state_dict() == {"epoch": 3, "pos": 1}


# ------------------------------------------------------------------ a failed Retrain keeps the weights
class FailsOnSecondStep(torch.nn.Sequential):
    """`bn_model`'s layers; raises on the 2nd gradient-enabled forward in train mode."""

    def __init__(self):
        super().__init__(*bn_model())
        self.calls = 0

    def forward(self, x):
        if self.training and torch.is_grad_enabled():
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("boom on the 2nd training step")
        return super().forward(x)


def test_failed_retrain_keeps_callers_weights():
    model = FailsOnSecondStep()
    with torch.no_grad():   # non-default running statistics too
        model[1].running_mean.uniform_()
    before = state(model)
    cfg = RetrainConfig(recipe=TrainRecipe(epochs=2, batch_size=64))
    with pytest.raises(RuntimeError, match="boom"):
        ee.unlearn(model, splits(20, 64, 65), cfg, method="retrain", progress=False)
    assert model.calls == 2 and same_state(state(model), before)


def test_failed_retrain_with_model_fn_keeps_callers_weights():
    model = bn_model()
    before = state(model)
    cfg = RetrainConfig(recipe=TrainRecipe(epochs=2, batch_size=64))
    with pytest.raises(RuntimeError, match="boom"):
        ee.unlearn(model, splits(20, 64, 65), cfg, method="retrain", model_fn=FailsOnSecondStep, progress=False)
    assert same_state(state(model), before)
