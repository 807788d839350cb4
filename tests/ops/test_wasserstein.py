"""Tests of entangle_ext.wasserstein2_1d against float64 references, POT and W2 invariants."""
import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

import entangle_ext as ee
from entangle_ext import reference as ref

from _support import DEVICES, ragged

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")


sizes = st.lists(st.integers(1, 40), min_size=1, max_size=5)


def ragged_pair(lu, data, seed, distinct=True):
    """(u, uo, v, vo, g): u ragged with segment lengths ``lu``, v with as many segments of lengths
    drawn from ``data``, both from the generator g seeded with ``seed`` (g is returned for more draws)."""
    lv = data.draw(st.lists(st.integers(1, 40), min_size=len(lu), max_size=len(lu)))
    g = torch.Generator().manual_seed(seed)
    u, uo = ragged(lu, g, distinct=distinct)
    v, vo = ragged(lv, g, distinct=distinct)
    return u, uo, v, vo, g


# ------------------------------------------------------------------------------ values vs oracles
@given(lu=sizes, data=st.data(), seed=st.integers(0, 2**31 - 1), ties=st.booleans())
def test_ragged_matches_float64_reference(lu, data, seed, ties):
    u, uo, v, vo, g = ragged_pair(lu, data, seed, distinct=not ties)
    for dev in DEVICES:
        got = ee.wasserstein2_1d(u.to(dev), v.to(dev), uo, vo)
        want = ref.wasserstein2_1d(u, v, uo, vo)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-12)


@given(n=st.integers(1, 60), m=st.integers(1, 60), seed=st.integers(0, 2**31 - 1))
def test_unequal_sizes_match_pot(n, m, seed):
    ot = pytest.importorskip("ot")
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=n), rng.normal(1.0, 2.0, size=m)
    want = ot.wasserstein_1d(a, b, p=2)  # POT returns W2^2 for p=2
    got = ee.wasserstein2_1d(torch.from_numpy(a), torch.from_numpy(b))
    assert got.shape == ()
    np.testing.assert_allclose(got.item(), want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("shape_u,shape_v", [((4, 33), (4, 33)), ((3, 17), (3, 5)), ((50,), (80,)),
                                             ((2, 1), (2, 1)), ((1, 3000), (1, 2500))])
def test_dense_matches_reference(device, dtype, tol, shape_u, shape_v):
    g = torch.Generator().manual_seed(0)
    u = torch.randn(shape_u, generator=g, dtype=torch.float64)
    v = torch.randn(shape_v, generator=g, dtype=torch.float64) * 1.5 + 0.3
    got = ee.wasserstein2_1d(u.to(device, dtype), v.to(device, dtype))
    want = ref.wasserstein2_1d(u, v)
    assert got.dtype == dtype and got.device.type == device.type
    assert got.shape == want.shape
    torch.testing.assert_close(got.cpu().double(), want, rtol=tol, atol=tol)


def test_known_values():
    # Two point masses at 0 and 3: W2^2 = 9. Uniform on {0,1} vs {0}: W2^2 = 1/2.
    assert ee.wasserstein2_1d(torch.tensor([0.0]), torch.tensor([3.0])).item() == pytest.approx(9.0)
    assert ee.wasserstein2_1d(torch.tensor([0.0, 1.0]), torch.tensor([0.0])).item() == pytest.approx(0.5)
    # {0,1,2} vs {0,3}: quantile pieces [0,1/3):0-0, [1/3,1/2):1-0, [1/2,2/3):1-3, [2/3,1):2-3
    want = (1 / 6) * 1 + (1 / 6) * 4 + (1 / 3) * 1
    got = ee.wasserstein2_1d(torch.tensor([2.0, 0.0, 1.0], dtype=torch.float64),
                             torch.tensor([3.0, 0.0], dtype=torch.float64))
    assert got.item() == pytest.approx(want, rel=1e-12)


# ------------------------------------------------------------------------------ invariants
@given(lu=sizes, data=st.data(), seed=st.integers(0, 2**31 - 1), s=st.floats(0.1, 10.0),
       c=st.floats(-5, 5))
def test_invariants(lu, data, seed, s, c):
    u, uo, v, vo, g = ragged_pair(lu, data, seed)
    w = ee.wasserstein2_1d(u, v, uo, vo)
    assert torch.all(w >= 0)
    torch.testing.assert_close(ee.wasserstein2_1d(u, u, uo, uo), torch.zeros_like(w), atol=0, rtol=0)
    torch.testing.assert_close(ee.wasserstein2_1d(v, u, vo, uo), w, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(ee.wasserstein2_1d(s * u, s * v, uo, vo), s * s * w, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(ee.wasserstein2_1d(u + c, v + c, uo, vo), w, rtol=1e-7, atol=1e-9)
    # permutation invariance within each segment
    perm = torch.cat([torch.randperm(n, generator=g) + int(o) for n, o in zip(lu, uo[:-1])])
    torch.testing.assert_close(ee.wasserstein2_1d(u[perm], v, uo, vo), w, rtol=1e-12, atol=1e-14)


@given(lu=sizes, data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_gradient_sums_to_zero_per_segment(lu, data, seed):
    u, uo, v, vo, g = ragged_pair(lu, data, seed)
    u.requires_grad_(True)
    v.requires_grad_(True)
    ee.wasserstein2_1d(u, v, uo, vo).sum().backward()
    su = torch.segment_reduce(u.grad, "sum", offsets=uo)
    sv = torch.segment_reduce(v.grad, "sum", offsets=vo)
    torch.testing.assert_close(su + sv, torch.zeros_like(su), atol=1e-10, rtol=0)


# ------------------------------------------------------------------------------ gradients
@pytest.mark.parametrize("lu,lv", [([5], [5]), ([4, 7, 1], [6, 2, 3]), ([12], [5]), ([1], [9])])
def test_gradcheck(device, lu, lv):
    g = torch.Generator().manual_seed(1)
    u, uo = ragged(lu, g)
    v, vo = ragged(lv, g)
    u = u.to(device).requires_grad_(True)
    v = v.to(device).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: ee.wasserstein2_1d(a, b, uo, vo), (u, v))


@given(lu=sizes, data=st.data(), seed=st.integers(0, 2**31 - 1), ties=st.booleans())
def test_gradient_matches_reference_autograd(lu, data, seed, ties):
    u, uo, v, vo, g = ragged_pair(lu, data, seed, distinct=not ties)
    w = torch.rand(len(lu), generator=g, dtype=torch.float64)
    for dev in DEVICES:
        a = u.to(dev).clone().requires_grad_(True)
        b = v.to(dev).clone().requires_grad_(True)
        (ee.wasserstein2_1d(a, b, uo, vo) * w.to(dev)).sum().backward()
        ra, rb = u.clone().requires_grad_(True), v.clone().requires_grad_(True)
        (ref.wasserstein2_1d(ra, rb, uo, vo) * w).sum().backward()
        # At ties the stable sort fixes the subgradient the same way in both implementations.
        torch.testing.assert_close(a.grad.cpu(), ra.grad, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(b.grad.cpu(), rb.grad, rtol=1e-10, atol=1e-12)


def test_double_backward_raises():
    u = torch.randn(6, dtype=torch.float64, requires_grad=True)
    v = torch.randn(6, dtype=torch.float64)
    (gu,) = torch.autograd.grad(ee.wasserstein2_1d(u, v), u, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        gu.sum().backward()


def test_opcheck():
    g = torch.Generator().manual_seed(2)
    u, uo = ragged([4, 9, 2], g)
    v, vo = ragged([3, 9, 5], g)
    samples = [
        (u, v, uo, vo, 9),
        (u.float(), v.float(), uo, vo, -1),
        (u.requires_grad_(True), v.requires_grad_(True), uo, vo, -1),
        (u, v, uo, vo, -1, True, True),
        (u.detach(), v.detach(), uo, vo, -1, True, False, True),
    ]
    for args in samples:
        torch.library.opcheck(torch.ops.entangle_ext.wasserstein2_1d.default, args)
    grad = torch.rand(3, dtype=torch.float64, generator=g)
    _, du, dv = torch.ops.entangle_ext.wasserstein2_1d(u.detach(), v.detach(), uo, vo, -1, True, True)
    torch.library.opcheck(torch.ops.entangle_ext.wasserstein2_1d_backward.default,
                          (grad, du, dv, uo, vo))


# ------------------------------------------------------------------------------ API forms
def test_reductions_and_forms():
    g = torch.Generator().manual_seed(3)
    u = torch.randn(5, 12, generator=g, dtype=torch.float64)
    v = torch.randn(5, 12, generator=g, dtype=torch.float64)
    per = ee.wasserstein2_1d(u, v)
    assert per.shape == (5,)
    torch.testing.assert_close(ee.wasserstein2_1d(u, v, reduction="mean"), per.mean())
    torch.testing.assert_close(ee.wasserstein2_1d(u, v, reduction="sum"), per.sum())
    off = list(range(0, 61, 12))
    torch.testing.assert_close(ee.wasserstein2_1d(u.reshape(-1), v.reshape(-1), off, off), per)
    off32 = torch.tensor(off, dtype=torch.int32)
    torch.testing.assert_close(ee.wasserstein2_1d(u.reshape(-1), v.reshape(-1), off32, off32), per)
    # non-contiguous inputs are supported (copied)
    torch.testing.assert_close(ee.wasserstein2_1d(u.t().contiguous().t(), v[:, :]), per)
    assert ee.wasserstein2_1d(u[:0], v[:0]).shape == (0,)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_accumulates_in_float32(dtype):
    g = torch.Generator().manual_seed(4)
    u = torch.randn(3, 64, generator=g).to(dtype)
    v = torch.randn(3, 64, generator=g).to(dtype)
    got = ee.wasserstein2_1d(u, v)
    assert got.dtype == dtype
    want = ref.wasserstein2_1d(u.double(), v.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=1e-3)


def test_validate_false_policies():
    u = torch.tensor([0.0, float("nan"), 1.0, 2.0])
    v = torch.tensor([0.0, 1.0, 3.0, 2.0])
    w = ee.wasserstein2_1d(u, v, [0, 2, 4], [0, 2, 4], validate=False)
    assert torch.isnan(w[0]) and w[1].item() == pytest.approx(1.0)
    a = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    w = ee.wasserstein2_1d(a, torch.tensor([1.0, 5.0]), [0, 0, 3], [0, 1, 2], validate=False)
    assert torch.isnan(w[0]) and torch.isfinite(w[1])
    w[1].backward()
    assert torch.isfinite(a.grad).all()


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_raises(bad):
    u = torch.tensor([0.0, bad, 1.0])
    with pytest.raises(ValueError, match="NaN or Inf"):
        ee.wasserstein2_1d(u, torch.zeros(3))
    with pytest.raises(ValueError, match="NaN or Inf"):
        ee.wasserstein2_1d(torch.zeros(3), u)


@pytest.mark.parametrize("uo,vo,match", [
    ([0, 2, 3], [0, 2, 4], "end at"),
    ([1, 2, 4], [0, 2, 4], "start at 0"),
    ([0, 3, 2, 4], [0, 1, 2, 4], "non-decreasing"),
    ([0, 0, 4], [0, 2, 4], "empty"),
    ([0, 4], [0, 2, 4], "S\\+1"),
])
def test_bad_offsets_raise(uo, vo, match):
    with pytest.raises(ValueError, match=match):
        ee.wasserstein2_1d(torch.arange(4.0), torch.arange(4.0), uo, vo)


def test_bad_arguments_raise():
    x = torch.randn(4)
    with pytest.raises(TypeError, match="same dtype"):
        ee.wasserstein2_1d(x, x.double())
    with pytest.raises(TypeError, match="floating"):
        ee.wasserstein2_1d(torch.arange(4), torch.arange(4))
    with pytest.raises(TypeError, match="torch.Tensor"):
        ee.wasserstein2_1d([1.0, 2.0], x)
    with pytest.raises(TypeError, match="int32 or int64"):
        ee.wasserstein2_1d(x, x, torch.tensor([0.0, 4.0]), torch.tensor([0.0, 4.0]))
    with pytest.raises(ValueError, match="empty distribution"):
        ee.wasserstein2_1d(torch.zeros(0), x)
    with pytest.raises(ValueError, match="rows"):
        ee.wasserstein2_1d(torch.zeros(2, 3), torch.zeros(3, 3))
    with pytest.raises(ValueError, match="both"):
        ee.wasserstein2_1d(x, x, [0, 4], None)
    with pytest.raises(ValueError, match="reduction"):
        ee.wasserstein2_1d(x, x, reduction="avg")
    with pytest.raises(ValueError, match="max_seqlen"):
        ee.wasserstein2_1d(x, x, [0, 4], [0, 4], max_seqlen=2)
    with pytest.raises(ValueError, match="flat"):
        ee.wasserstein2_1d(x.reshape(2, 2), x.reshape(2, 2), [0, 4], [0, 4])


@pytest.mark.parametrize("validate", [True, False])
def test_a_max_seqlen_below_the_longest_segment_is_refused_in_every_form(validate):
    """The bound is checked wherever that needs no device sync: dense rows (length known),
    host offsets (list or CPU tensor), with or without data validation; a true bound changes
    nothing."""
    u, v = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 7, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"max_seqlen=6 but the longest segment has 7 values"):
        ee.wasserstein2_1d(u, v, max_seqlen=6, validate=validate)
    torch.testing.assert_close(ee.wasserstein2_1d(u, v, max_seqlen=7, validate=validate),
                               ee.wasserstein2_1d(u, v))
    x, y = torch.randn(9, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    for uo, vo in (([0, 2, 9], [0, 3, 6]), (torch.tensor([0, 2, 9]), torch.tensor([0, 3, 6]))):
        with pytest.raises(ValueError, match=r"max_seqlen=4 but the longest segment has 7 values"):
            ee.wasserstein2_1d(x, y, uo, vo, max_seqlen=4, validate=validate)
        torch.testing.assert_close(ee.wasserstein2_1d(x, y, uo, vo, max_seqlen=7, validate=validate),
                                   ee.wasserstein2_1d(x, y, uo, vo))


@pytest.mark.parametrize("validate", [True, False])
def test_a_max_seqlen_beyond_int64_is_a_value_error_in_every_form(validate):
    """2**70 reached the operator's int64 argument in the offsets form and raised a confusing
    RuntimeError ("Expected a value of type 'int' ... found type 'int'") while the dense form
    accepted it; both now refuse it, and 2**63 - 1 works in both."""
    u, v = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 7, dtype=torch.float64)
    x, y = torch.randn(9, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    for args in ((u, v), (x, y, [0, 2, 9], [0, 3, 6]), (x, y, torch.tensor([0, 2, 9]), torch.tensor([0, 3, 6]))):
        with pytest.raises(ValueError, match=r"max_seqlen must be at most 2\*\*63 - 1"):
            ee.wasserstein2_1d(*args, max_seqlen=2**70, validate=validate)
        torch.testing.assert_close(ee.wasserstein2_1d(*args, max_seqlen=2**63 - 1, validate=validate),
                                   ee.wasserstein2_1d(*args))


def test_raw_op_rejects_malformed_inputs():
    op = torch.ops.entangle_ext.wasserstein2_1d
    x = torch.randn(8)
    off = torch.tensor([0, 8])
    with pytest.raises(ValueError, match="contiguous"):
        op(torch.randn(8, 2)[:, 0], x, off, off, -1)
    with pytest.raises(TypeError, match="int64"):
        op(x, x, off.int(), off, -1)
    with pytest.raises(TypeError, match="float32 or float64"):
        op(x.half(), x.half(), off, off, -1)
    with pytest.raises(ValueError, match="same number of segments"):
        op(x, x, off, torch.tensor([0, 4, 8]), -1)


def test_cpu_only_build_names_the_fix(monkeypatch):
    from types import SimpleNamespace
    from entangle_ext import _ext
    monkeypatch.setattr(_ext, "cuda_built", lambda: False)
    with pytest.raises(RuntimeError, match="FORCE_CUDA=1"):
        _ext.require("wasserstein2_1d", SimpleNamespace(device=torch.device("cuda", 0)))


def test_float_offsets_in_a_list_are_rejected():
    with pytest.raises(TypeError, match="int32 or int64"):
        ee.wasserstein2_1d(torch.arange(5.0), torch.arange(3.0), [0, 2.5, 5], [0, 1, 3])


@pytest.mark.parametrize("uo,exc", [
    (torch.tensor([0.0, 2.0, 4.0]), TypeError),       # float offsets
    (torch.tensor([[0, 2, 4]]), ValueError),           # 2-D offsets
    (torch.tensor([], dtype=torch.int64), ValueError),  # no entry at all
    (["a", "b"], TypeError),                           # not integers
])
def test_offset_errors_name_the_operator(uo, exc):
    """Every argument error of the W2 operator starts with its name, the offset ones too."""
    with pytest.raises(exc, match="^wasserstein2_1d: u_offsets"):
        ee.wasserstein2_1d(torch.arange(4.0), torch.arange(4.0), uo, [0, 2, 4])


@pytest.mark.parametrize("uo,exc,match", [
    ([], ValueError, r"u_offsets must be .*int32 or int64.* got an empty list"),
    ((), ValueError, r"u_offsets must be .*int32 or int64.* got an empty tuple"),
    ([0, 2.5, 4], TypeError, r"u_offsets must be a 1-D int32 or int64 tensor or a sequence of ints .*"
                             r"got a list with non-integer entries"),
    (__import__("numpy").array([0, 4], dtype="uint8"), TypeError,   # was "non-integer entries (torch.uint8)"
     r"u_offsets must be .*got a ndarray with integer entries of another width \(torch.uint8; int32 or int64 only\)"),
    (5, TypeError, r"u_offsets must be a 1-D int32 or int64 tensor or a sequence of ints .*got int"),
    # an int beyond int64 was "non-integer entries"; a bool entry was read as 1
    ([2**70, 2**70 + 4], TypeError, r"u_offsets must be .*got a list with an integer beyond int64 \(1180591620717411303424\)"),
    ([0, True, 4], TypeError, r"u_offsets must be .*got a list whose entry 1 is the bool True"),
    ((0, __import__("numpy").bool_(True), 4), TypeError, r"u_offsets must be .*got a tuple whose entry 1 is the bool True"),
    ([0, torch.tensor(True), 4], TypeError, r"u_offsets must be .*got a list whose entry 1 is the bool True"),
    ([__import__("numpy").uint64(2**64 - 5), __import__("numpy").uint64(2**64 - 1)], TypeError,
     r"u_offsets must be .*got a list with an integer beyond int64 \(18446744073709551611\)"),
    (torch.tensor([0, 4], device="meta"), ValueError, "u_offsets is on meta but u is on cpu"),
])
@pytest.mark.parametrize("max_seqlen", [None, 4])
def test_offsets_that_are_not_offsets_say_what_was_expected(uo, exc, match, max_seqlen):
    """An empty list is not read as float32 offsets ("got torch.float32"); a number is not
    iterated; meta offsets cannot be copied to the values' device."""
    with pytest.raises(exc, match=f"^wasserstein2_1d: {match}"):
        ee.wasserstein2_1d(torch.arange(4.0), torch.arange(4.0), uo, [0, 4], max_seqlen=max_seqlen)


@pytest.mark.parametrize("bad", ["4", 4.7, 4.0, True, torch.tensor(4), [4]])
def test_max_seqlen_must_be_an_int(bad):
    """A non-integer bound is a TypeError, not silently truncated by int() (4.7 -> 4, '4' -> 4,
    True -> 1)."""
    x = torch.arange(4.0)
    for args in ((x, x), (x, x, [0, 4], [0, 4])):
        with pytest.raises(TypeError, match=r"^wasserstein2_1d: max_seqlen must be an int or None, got "):
            ee.wasserstein2_1d(*args, max_seqlen=bad)
    np = pytest.importorskip("numpy")
    torch.testing.assert_close(ee.wasserstein2_1d(x, x + 1, [0, 4], [0, 4], max_seqlen=np.int64(4)),
                               torch.tensor([1.0]))


def test_a_call_under_inference_mode_does_not_break_later_training_calls():
    """The dense offsets are cached per (S, n): a first call under inference_mode must not leave
    an inference tensor there, which a later call that needs a gradient has to save."""
    from entangle_ext._wasserstein_args import _OFFSETS_CACHE
    _OFFSETS_CACHE.clear()
    with torch.inference_mode():
        ee.wasserstein2_1d(torch.randn(4, 7, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64))
    u = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    v = torch.randn(4, 3, dtype=torch.float64)
    ee.wasserstein2_1d(u, v).sum().backward()
    u_ref = u.detach().clone().requires_grad_()
    ref.wasserstein2_1d(u_ref, v).sum().backward()
    torch.testing.assert_close(u.grad, u_ref.grad)
