"""Issue 22 item 1: every baseline takes ``amp="bf16"`` (`MethodConfig.amp`): each forward pass of
the run (its steps, the teacher of SCRUB/DELETE, SSD's importances, the evaluations) runs under
bfloat16 autocast (Retrain's training from scratch follows its recipe's own amp), the parameters stay float32 and no loss is computed on
bfloat16 logits (`entangle_ext.unlearn.losses.loss_logits`)."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

import entangle_ext as ee
from entangle_ext.methods import get_method
from entangle_ext.unlearn.losses import loss_logits
from entangle_ext.unlearn.precision import amp_scope

from _tiny import AutocastProbe, mlp

pytestmark = [pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}"),
              pytest.mark.usefixtures("one_thread")]

BASELINES = ["retrain", "ft", "ga", "neggrad_plus", "rl", "l1_sparse", "salun", "scrub", "ssd", "gdr", "munba",
             "delete"]


def _short(cfg, recipe_amp=None):
    """The digits preset cut to a few steps (epochs / Retrain's recipe epochs = 1)."""
    if hasattr(cfg, "recipe"):
        return cfg.replace(recipe=cfg.recipe.replace(epochs=1, amp=recipe_amp))
    return cfg.replace(epochs=1) if any(f.name == "epochs" for f in dataclasses.fields(cfg)) else cfg


@pytest.fixture
def loss_dtypes(monkeypatch):
    """dtypes of the first argument of every loss / softmax call made through ``F``."""
    seen = []
    for name in ("cross_entropy", "kl_div", "log_softmax", "softmax", "nll_loss"):
        orig = getattr(F, name)

        def wrapped(x, *a, _orig=orig, **k):
            seen.append(x.dtype)
            return _orig(x, *a, **k)
        monkeypatch.setattr(F, name, wrapped)
    return seen


@pytest.mark.parametrize("name", BASELINES)
def test_baseline_runs_every_forward_under_bf16_autocast(small, name, loss_dtypes):
    seen = []
    cfg = _short(get_method(name).config_for("digits", "paper_code", amp="bf16"), recipe_amp="bf16")
    r = ee.unlearn(AutocastProbe(seen), small, cfg, method=name, progress=False)
    assert r.report["config"]["amp"] == r.report["amp"] == "bf16"
    assert seen and all(s == (True, torch.bfloat16) for s in seen), set(seen)
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in r.model.parameters())
    assert torch.bfloat16 not in loss_dtypes and (loss_dtypes or name == "ssd"), set(loss_dtypes)
    assert not torch.is_autocast_enabled("cpu")
    assert 0.0 <= r.report["evals"]["final"]["forget"]["acc"] <= 1.0


@pytest.mark.parametrize("name", ["ft", "retrain"])
def test_baseline_without_amp_runs_in_float32(small, name):
    seen = []
    cfg = _short(get_method(name).config_for("digits", "paper_code"))
    assert cfg.amp is None
    ee.unlearn(AutocastProbe(seen), small, cfg, method=name, progress=False)
    assert seen and all(s == (False, torch.float32) for s in seen)


def test_retrain_trains_with_its_recipes_amp_and_evaluates_with_the_configs(small):
    seen = []
    cfg = _short(get_method("retrain").config_for("digits", "paper_code", amp="bf16"))
    assert cfg.recipe.amp is None
    net = AutocastProbe(seen)
    net.register_forward_hook(lambda m, i, o: seen.append(("train" if m.training else "eval",)))
    ee.unlearn(net, small, cfg, method="retrain", progress=False)
    modes = [seen[i + 1][0] for i in range(0, len(seen), 2)]
    pairs = set(zip(modes, seen[0::2]))
    assert pairs == {("train", (False, torch.float32)), ("eval", (True, torch.bfloat16))}, pairs
    with pytest.raises(ValueError, match="amp"):
        get_method("ft").Config(amp="fp8")


def test_loss_logits_upcasts_low_precision_logits_only():
    net = mlp()
    x = torch.randn(4, 64)
    with amp_scope("bf16"):
        z = loss_logits(net, x)
    assert z.dtype == torch.float32 and z.requires_grad
    z.sum().backward()                       # the cast is differentiable
    assert net[0].weight.grad is not None
    assert loss_logits(net.double(), x.double()).dtype == torch.float64
    assert loss_logits(mlp().to(torch.float16), x.half()).dtype == torch.float32
