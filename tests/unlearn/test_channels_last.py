"""Channels-last inputs (`channels_last` of the run configs; entangle_ext/unlearn/memory_format.py):
what "auto" / True / False resolve to, the fallback and the errors for models that cannot take
channels-last inputs, that every forward pass of a run sees them, and that a run with them lands
where the contiguous run lands (only the convolutions' rounding differs)."""
import collections

import pytest
import torch
from torch.utils.data import TensorDataset

import entangle_ext as ee
from entangle_ext.methods import get_method
from entangle_ext.unlearn.memory_format import (channels_last_active, channels_last_scope, has_conv2d,
                                                resolve_channels_last, to_channels_last)

from _tiny import mlp


class ConvNet(torch.nn.Module):
    """3×8×8 images → conv → ReLU → linear, 4 classes; ``view=True`` flattens with ``.view`` (which
    a channels-last activation refuses); ``seen`` collects whether each input was channels-last."""

    def __init__(self, view=False, seen=None, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.conv, self.fc, self.view, self.seen = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Linear(256, 4), view, seen

    def forward(self, x):
        if self.seen is not None and torch.is_grad_enabled():
            self.seen.append(x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous())
        h = torch.relu(self.conv(x))
        return self.fc(h.view(h.shape[0], -1) if self.view else h.flatten(1))


class AssumesContiguous(ConvNet):
    """Reads its input's memory as if it were NCHW-contiguous (as a custom op without a check
    would): other values on channels-last inputs."""

    def forward(self, x):
        return super().forward(x.as_strided(x.shape, (x.shape[1] * x.shape[2] * x.shape[3], x.shape[2] * x.shape[3],
                                                      x.shape[3], 1)))


def images(n, seed):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 4, (n,), generator=g))


@pytest.fixture
def image_splits():
    return ee.Splits(forget=images(16, 1), adjacent=images(24, 2), remote=images(32, 3))


def short_config(**top):
    return ee.UnlearnConfig(stage1=ee.Stage1Config(max_steps=3, remote_batch_size=8, lr=1e-2),
                            stage2=ee.Stage2Config(epochs=1, lr=1e-2, adjacent_batch_size=8, forget_batch_size=8,
                                                   remote_batch_size=8, remote_batch_limit=2), **top)


class _OnImage(torch.nn.Module):
    """A convolution on ``feats.image`` of nested inputs (called as ``model(feats=...)``)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 2, 1)

    def forward(self, feats):
        return self.conv(feats.image).mean((2, 3))


def test_inputs_convert_inside_the_scope_only():
    x = torch.randn(2, 3, 4, 5)
    assert to_channels_last(x) is x and not channels_last_active()
    with channels_last_scope(True):
        assert channels_last_active()
        y = to_channels_last(x)
        assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
        assert torch.equal(y, x)
        labels, flat = torch.zeros(2, 3, 4, 5, dtype=torch.int64), torch.randn(2, 7)
        assert to_channels_last(labels) is labels and to_channels_last(flat) is flat
        d = to_channels_last({"pixel_values": x, "mask": flat})
        assert d["pixel_values"].stride() == y.stride() and d["mask"] is flat
        t = to_channels_last((x, flat))
        assert isinstance(t, tuple) and t[0].stride() == y.stride() and t[1] is flat
        # nested inputs, a namedtuple among them (its type(...)(generator) rebuild raised TypeError,
        # and a 4-D tensor one level down was left as it was)
        pair = collections.namedtuple("Pair", ["image", "mask"])
        n = to_channels_last({"feats": pair(x, flat), "more": [(x,)]})
        assert type(n["feats"]) is pair and n["feats"].image.stride() == y.stride() and n["feats"].mask is flat
        assert n["more"][0][0].stride() == y.stride()
        assert resolve_channels_last("auto", _OnImage(), {"feats": pair(x, flat)}, torch.device("cpu"))
        with channels_last_scope(False):
            assert to_channels_last(x) is x
    assert not channels_last_active()
    with pytest.raises(TypeError, match="bool"):
        with channels_last_scope("auto"):
            pass


def test_resolve_auto_true_false():
    x = torch.randn(2, 3, 8, 8)
    conv = ConvNet().eval()
    assert has_conv2d(conv) and not has_conv2d(mlp())
    assert resolve_channels_last("auto", conv, x, torch.device("cpu")) is True
    assert resolve_channels_last(True, conv, x, torch.device("cpu")) is True
    assert resolve_channels_last(False, conv, x, torch.device("cpu")) is False
    # not a CPU device, no Conv2d, no 4-D input: "auto" stays contiguous (True still applies to 4-D input)
    assert resolve_channels_last("auto", conv, x, torch.device("cuda")) is False
    assert resolve_channels_last("auto", mlp(), torch.randn(2, 64), torch.device("cpu")) is False
    assert resolve_channels_last(True, mlp(), torch.randn(2, 64), torch.device("cpu")) is False
    for bad in ("yes", 1, None, "True"):
        with pytest.raises(ValueError, match="channels_last must be one of"):
            resolve_channels_last(bad, conv, x, torch.device("cpu"))


def test_a_model_that_cannot_take_them_falls_back_or_raises():
    x = torch.randn(2, 3, 8, 8)
    for model, why in ((ConvNet(view=True), "fails on channels-last"), (AssumesContiguous(), "other logits")):
        model.eval()
        assert resolve_channels_last("auto", model, x, torch.device("cpu")) is False
        with pytest.raises(ValueError, match=why) as e:
            resolve_channels_last(True, model, x, torch.device("cpu"))
        assert "channels_last=False" in str(e.value)


def test_config_fields_take_auto_true_false_only():
    assert ee.UnlearnConfig().channels_last == "auto"
    assert get_method("ft").Config().channels_last == "auto"
    for ok in ("auto", True, False):
        assert ee.UnlearnConfig(channels_last=ok).channels_last is ok or ok == "auto"
    for bad in ("yes", 1, 0, None):
        with pytest.raises(ValueError, match="channels_last"):
            ee.UnlearnConfig(channels_last=bad)
        with pytest.raises(ValueError, match="channels_last"):
            get_method("ft").Config(channels_last=bad)


@pytest.mark.parametrize("method", ["two_stage", "ft"])
def test_every_training_forward_of_a_run_sees_channels_last_inputs(image_splits, method):
    for setting, want in (("auto", True), (False, False)):
        seen = []
        cfg = short_config(channels_last=setting) if method == "two_stage" else \
            get_method(method).Config(epochs=1, channels_last=setting)
        res = ee.unlearn(ConvNet(seen=seen), image_splits, method=method, config=cfg, progress=False)
        assert res.report["channels_last"] is want
        assert seen and all(s is want for s in seen), seen
        assert all(p.is_contiguous() for p in res.model.parameters())


def test_a_view_model_runs_contiguous_under_auto_and_is_refused_under_true(image_splits):
    res = ee.unlearn(ConvNet(view=True), image_splits, config=short_config(), progress=False)
    assert res.report["channels_last"] is False
    model = ConvNet(view=True)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="channels_last=True.*view"):
        ee.unlearn(model, image_splits, config=short_config(channels_last=True), progress=False)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))   # refused before any step


def test_the_run_lands_where_the_contiguous_run_lands(image_splits):
    out = {}
    for setting in (True, False):
        res = ee.unlearn(ConvNet(seed=3), image_splits, config=short_config(channels_last=setting), progress=False)
        out[setting] = (torch.cat([p.detach().reshape(-1) for p in res.model.parameters()]), res.report)
    a, b = out[True][0], out[False][0]
    start = torch.cat([p.detach().reshape(-1) for p in ConvNet(seed=3).parameters()])
    assert (a - start).abs().max() > 1e-3   # the run moved the model, so the comparison says something
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for split, ev in out[False][1]["evals"]["final"].items():
        assert out[True][1]["evals"]["final"][split]["acc"] == pytest.approx(ev["acc"], abs=1e-9)
