"""Sparse tensors get a TypeError naming the argument and saying to pass ``.to_dense()``; they got
the dispatcher's "Cannot access data pointer of Tensor that doesn't have storage" or
"unsupported memory format option Contiguous"."""
import pytest
import torch

import entangle_ext as ee

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")


def _calls():
    d, B = torch.randn(6), torch.randn(2, 6)
    sp = torch.randn(6).to_sparse()
    return [
        ("u", lambda: ee.wasserstein2_1d(sp, d)),
        ("v", lambda: ee.wasserstein2_1d(d, sp)),
        ("g", lambda: ee.project_orthogonal(sp, B)),
        ("basis", lambda: ee.project_orthogonal(d, B.to_sparse())),
        (r"grads\[0\]", lambda: ee.project_orthogonal_([sp], [[torch.randn(6)]])),
        (r"grads\[0\]", lambda: ee.projection_gram([sp], [torch.randn(6)])),
        ("g", lambda: ee.dual_update_(torch.zeros(6), sp, 1.0)),
        ("lam", lambda: ee.dual_update_(torch.zeros(6).to_sparse(), d, 1.0)),
        ("g", lambda: ee.augmented_lagrangian_term(sp, torch.zeros(6), 1.0)),
    ]


@pytest.mark.parametrize("k", range(9))
def test_a_sparse_argument_is_named(k):
    name, call = _calls()[k]
    with pytest.raises(TypeError, match=rf"{name} is a sparse_coo tensor; .*dense \(strided\) tensors: pass "
                                        rf"{name}\.to_dense\(\)"):
        call()
