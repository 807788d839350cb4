"""compare of a model built under ``torch.inference_mode``: every method trains its own copy
(`copy_model`, whose tensors are normal ones), so it runs as `unlearn(inplace=False)` does; the
no-trainable-parameters check that compare runs first (8d1a9c8) refused it as an inference tensor."""
import warnings

import pytest
import torch

import entangle_ext as ee

from _tiny import mlp, tiny_config

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")


def test_compare_runs_a_model_built_under_inference_mode_as_unlearn_does(small):
    with torch.inference_mode():
        model = mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ee.unlearn(model, small, tiny_config(run_stage2=False), inplace=False, progress=False)   # runs on a copy
        res = ee.compare(model, small, ["stage1_only"], seeds=[0], configs={"stage1_only": tiny_config()},
                         progress=False)
    assert "stage1_only" in res.summary
