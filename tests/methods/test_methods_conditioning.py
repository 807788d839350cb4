"""Every method is a well-conditioned function of the original weights in float64: a relative
perturbation of 1e-13 of θ0 moves the unlearned weights by at most 1e-8 (an amplification of
at most ~1e5). A method that amplifies round-off into O(1) changes gives results that follow
the CPU's vector ISA, the thread count or the split of a batch over ranks, and no "equals one
process" or "equals the uninterrupted run" test of it can hold at float64 round-off. (Seen:
SCRUB's first max step starts at its own stationary point θ = θ0, where the KL gradient was
pure round-off that Adam normalised into lr-sized steps: 1e-14 in → 3.6e-2 out.)"""
import copy

import pytest
import torch

import entangle_ext as ee
import dist_workers as W
from entangle_ext.methods import available_methods, get_method

pytestmark = [pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}"),
              pytest.mark.usefixtures("one_thread")]

EPS_IN, MAX_OUT = 1e-13, 1e-8


def _config(name):
    if name in W.BASELINES:
        return W.baseline_case(name)[1]
    if get_method(name).Config is ee.UnlearnConfig:
        return get_method(name).transform(W.config())
    return get_method(name).config_for("digits").replace(eval_batch_size=4)


def _final_params(name, eps):
    m = W.model()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(1 + eps)
    kw = {"model_fn": lambda: W.model()} if name == "retrain" else {}
    res = ee.unlearn(m, W.splits(), copy.deepcopy(_config(name)), method=name, progress=False, **kw)
    return W.params_of(res.model)


@pytest.mark.parametrize("name", available_methods())
def test_a_round_off_perturbation_of_the_original_weights_stays_round_off(name):
    moved = (_final_params(name, 0.0) - _final_params(name, EPS_IN)).abs().max().item()
    assert moved <= MAX_OUT, f"{name}: a {EPS_IN:g} relative change of θ0 moved the result by {moved:.3g}"
