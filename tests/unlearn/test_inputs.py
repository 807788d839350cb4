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
