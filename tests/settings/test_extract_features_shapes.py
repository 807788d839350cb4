"""`extract_features` refuses inputs without a batch dimension and features that are not one row
per sample, and says a feature function must return a tensor: a 1-D input gave (8, 1) "features"
(the hidden width as rows), a numpy result an AttributeError about ``.dim``."""
import numpy as np
import pytest
import torch

from entangle_ext.splits import extract_features

pytestmark = pytest.mark.usefixtures("one_thread")


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


@pytest.mark.parametrize("data", [torch.randn(4), np.random.randn(4), torch.tensor(1.0)], ids=["1-D", "np-1-D", "0-D"])
def test_inputs_without_a_batch_dimension_are_refused(data):
    with pytest.raises(ValueError, match=r"data must be a batch of samples, \(N, ...\) with N first, got shape"):
        extract_features(_mlp(), data)
    with pytest.raises(ValueError, match="x.unsqueeze"):
        extract_features(lambda x: x, data)


def test_one_sample_with_its_batch_dimension_works():
    x = torch.randn(4)
    got = extract_features(_mlp(), x.unsqueeze(0))
    assert got.shape == (1, 8)
    assert extract_features(_mlp(), x.numpy()[None]).shape == (1, 8)


def test_a_feature_function_must_return_a_tensor():
    with pytest.raises(TypeError, match=r"the feature function must return a \(B, D\) tensor, got ndarray "
                                        r"\(wrap it: torch.as_tensor"):
        extract_features(lambda x: x.numpy(), torch.randn(5, 4))
    with pytest.raises(TypeError, match="must return a .* tensor, got list"):
        extract_features(lambda x: x.tolist(), torch.randn(5, 4))


@pytest.mark.parametrize("fn", [lambda x: x.mean(0), lambda x: x.sum()], ids=["(D,) per batch", "scalar"])
def test_features_must_have_one_row_per_sample(fn):
    with pytest.raises(ValueError, match=r"the feature function's output has shape .* for a batch of 5 samples: "
                                         "its first dimension must be the batch"):
        extract_features(fn, torch.randn(5, 4))


def test_a_hooked_layer_fed_other_rows_is_refused():
    class Flat(torch.nn.Module):           # (B, T, D) flattened to (B*T, D) before the head
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.head(x.reshape(-1, 4))
    with pytest.raises(ValueError, match=r"the feature layer's input has shape \(15, 4\) for a batch of 5 samples"):
        extract_features(Flat(), torch.randn(5, 3, 4))
