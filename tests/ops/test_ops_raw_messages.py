"""The native operators spell dtypes and shapes in their errors as Python does ("torch.float32",
"(2, 51)"), so a raw ``torch.ops.entangle_ext`` call reads like the Python wrappers."""
import re

import pytest
import torch

import entangle_ext as ee

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")
ops = torch.ops.entangle_ext


def _raises(exc, text, fn, *args):
    with pytest.raises(exc, match=re.escape(text)) as info:
        fn(*args)
    # no c10 spellings: "Double", "[2, 51]", "got [4]" (indices such as basis[0][1] are fine)
    assert not re.search(r"\b(Float|Double|Half|BFloat16|Long)\b|\[\d+, \d+|(got|shape) \[", str(info.value)), \
        str(info.value)


def test_dtype_names():
    off = torch.tensor([0, 3])
    _raises(TypeError, "u is torch.float64 but v is torch.float32", ops.wasserstein2_1d,
            torch.randn(3, dtype=torch.float64), torch.randn(3), off, off, -1, False, False, True)
    lam = torch.zeros(3)
    _raises(TypeError, "g is torch.float64 but lam is torch.float32", ops.augmented_lagrangian,
            torch.zeros(3, dtype=torch.float64), lam, torch.ones(()), "eq")
    a = torch.randn(4)
    _raises(TypeError, "basis[0][0] is torch.float64 but grads are torch.float32",
            ops.project_orthogonal_, [a], [a.double() + 1], None)
    _raises(TypeError, "got torch.int64", ops.project_orthogonal_, [a.long()], [a.long() + 1], None)


def test_shapes():
    lam = torch.zeros(3)
    _raises(ValueError, "got (2, 51)", ops.augmented_lagrangian, torch.zeros(2, 51), lam,
            torch.ones(()), "eq")
    _raises(ValueError, "got (2,)", ops.augmented_lagrangian, torch.zeros(3), lam, torch.ones(2), "eq")
    a = torch.randn(4)
    _raises(ValueError, "basis[0][0] has shape (5,) but grads[0] has shape (4,)",
            ops.project_orthogonal_, [a], [torch.randn(5)], None)
