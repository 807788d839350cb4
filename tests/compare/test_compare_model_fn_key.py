"""The comparison cache knows Retrain's ``model_fn`` by the model it builds, not by its name alone:
every ``functools.partial`` is named "functools.partial" and every lambda of a script
"__main__.<lambda>", so another builder under such a name silently reused the old Retrain rows
(and every gap to them)."""
import functools
import warnings

import pytest
import torch

import entangle_ext as ee
from entangle_ext.compare_specs import model_fn_key
from entangle_ext.data.digits import digits_splits
from entangle_ext.train import TrainRecipe

pytestmark = [pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}"),
              pytest.mark.usefixtures("one_thread")]

RECIPE = TrainRecipe("adam", lr=1e-2, epochs=3, batch_size=64, schedule="constant")


def build(act="ReLU", init=None):
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), getattr(torch.nn, act)(), torch.nn.Linear(32, 2))
    if init is not None:
        torch.nn.init.constant_(net[0].weight, init)
    return net


def test_the_key_tells_builders_apart_that_share_a_name():
    relu, sigmoid = functools.partial(build, "ReLU"), functools.partial(build, "Sigmoid")
    assert model_fn_key(relu)["name"] == model_fn_key(sigmoid)["name"] == "functools.partial"
    assert model_fn_key(relu) != model_fn_key(sigmoid)                                # another module tree
    assert model_fn_key(lambda: build(init=0.1)) != model_fn_key(lambda: build(init=0.2))   # another init
    assert model_fn_key(relu) == model_fn_key(functools.partial(build, "ReLU"))      # the same builder: a hit
    assert model_fn_key(None) is None


def test_the_key_leaves_the_global_generator_alone_and_refuses_a_non_module():
    torch.manual_seed(5)
    want = torch.rand(3)
    torch.manual_seed(5)
    model_fn_key(build)
    assert torch.equal(torch.rand(3), want)
    with pytest.raises(TypeError, match="model_fn must return a torch.nn.Module, got int"):
        model_fn_key(lambda: 3)


def test_compare_recomputes_retrain_for_another_partial(tmp_path):
    s, _ = digits_splits(max_train_per_digit=10)
    net = build()
    kw = dict(seeds=[0], setting="digits", out_dir=tmp_path, relearn=False, progress=False, retrain_recipe=RECIPE)
    with warnings.catch_warnings():   # (the MIA warning of a tiny forget split)
        warnings.simplefilter("ignore")
        a = ee.compare(net, s, ["retrain"], model_fn=functools.partial(build, "ReLU"), **kw)
        b = ee.compare(net, s, ["retrain"], model_fn=functools.partial(build, "Sigmoid"), **kw)
        c = ee.compare(net, s, ["retrain"], model_fn=functools.partial(build, "Sigmoid"), **kw)
    assert "cached: retrain" not in b.table and "cached: retrain" in c.table
    assert b.runs["retrain"][0] != a.runs["retrain"][0]
    assert c.runs["retrain"][0] == b.runs["retrain"][0]
