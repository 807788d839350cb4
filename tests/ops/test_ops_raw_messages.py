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


def _meta(*shape, dtype=torch.float32):
    return torch.ones(shape, dtype=dtype, device="meta")


D = torch.float64
_OFF = torch.tensor([0, 3])
_MIXED = {   # a meta tensor among CPU tensors: the dispatcher runs the fake (meta) kernel
    "project_orthogonal": (ops.project_orthogonal, lambda: (torch.ones(3), _meta(1, 3), None, 0.0),
                           "project_orthogonal: g is on cpu but basis is on meta"),
    "project_orthogonal_/basis": (ops.project_orthogonal_, lambda: ([torch.ones(3)], [_meta(3)], None, 0.0),
                                  "project_orthogonal_: basis[0][0] is on meta but grads are on cpu"),
    "project_orthogonal_/grads": (ops.project_orthogonal_,
                                  lambda: ([torch.ones(3), _meta(2)], [torch.ones(3), torch.ones(2)], None, 0.0),
                                  "project_orthogonal_: grads[1] is on meta but grads[0] is on cpu"),
    "projection_gram": (ops.projection_gram, lambda: ([_meta(3)], [torch.ones(3)], None),
                        "projection_gram: basis[0][0] is on cpu but grads are on meta"),
    "projection_gram/scale": (ops.projection_gram, lambda: ([torch.ones(3)], [torch.ones(3)], _meta(2, dtype=D)),
                              "projection_gram: scale is on meta but the tensors are on cpu"),
    "projection_apply_": (ops.projection_apply_,
                          lambda: ([torch.ones(3)], [_meta(3)], torch.ones(1, dtype=D), None),
                          "projection_apply_: basis[0][0] is on meta but grads are on cpu"),
    "projection_apply_/coeffs": (ops.projection_apply_,
                                 lambda: ([torch.ones(3)], [torch.ones(3)], _meta(1, dtype=D), None),
                                 "projection_apply_: coeffs is on meta but the tensors are on cpu"),
    "projection_solve": (ops.projection_solve, lambda: (torch.eye(2, dtype=D), _meta(2, dtype=D), None, 0.0),
                         "projection_solve: vg is on meta but the tensors are on cpu"),
    "wasserstein2_1d": (ops.wasserstein2_1d,
                        lambda: (torch.ones(3), _meta(3), _OFF, _OFF, -1, False, False, True),
                        "wasserstein2_1d: u is on cpu but v is on meta"),
    "wasserstein2_1d/offsets": (ops.wasserstein2_1d,
                                lambda: (torch.ones(3), torch.ones(3), _OFF, _OFF.to("meta"), -1, False, False, True),
                                "wasserstein2_1d: u is on cpu but v_offsets is on meta"),
    "wasserstein2_1d_backward": (ops.wasserstein2_1d_backward,
                                 lambda: (torch.ones(1), _meta(3), torch.ones(3), _OFF, _OFF),
                                 "wasserstein2_1d_backward: grad is on cpu but a saved tensor is on meta"),
    "augmented_lagrangian": (ops.augmented_lagrangian, lambda: (torch.ones(3), _meta(3), torch.ones(()), "equality"),
                             "augmented_lagrangian: lam is on meta but g is on cpu"),
    "augmented_lagrangian_backward": (ops.augmented_lagrangian_backward,
                                      lambda: (torch.ones(()), torch.ones(3), torch.ones(3), _meta(), "equality"),
                                      "augmented_lagrangian_backward: lam is on cpu but mu is on meta"),
    "dual_update_": (ops.dual_update_,
                     lambda: (torch.zeros(3), _meta(3), torch.ones(()), "equality", None, None, 0.0, True),
                     "dual_update_: lam is on cpu but g is on meta"),
}


@pytest.mark.parametrize("case", sorted(_MIXED))
def test_a_meta_tensor_among_cpu_tensors_is_refused_by_the_fake_kernels(case):
    """The fake (meta) kernels check, as the C++ ones do, that every tensor is on one device: a
    meta tensor mixed with CPU tensors was a silent no-op (in-place operators) or garbage."""
    fn, make, text = _MIXED[case]
    args = make()
    before = [x.clone() for x in torch.utils._pytree.tree_leaves(args)
              if isinstance(x, torch.Tensor) and x.device.type == "cpu"]
    _raises(ValueError, text, fn, *args)
    after = [x for x in torch.utils._pytree.tree_leaves(args)
             if isinstance(x, torch.Tensor) and x.device.type == "cpu"]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
