"""Kernel-level tests of entangle_ext.wasserstein2_1d: fixed-order tiles, thread counts, special
values, zero-size inputs and the local-gradient forward. They run the host-and-device helpers of
csrc/wasserstein.h that the CUDA kernels share (keys, segment bounds, overlap terms, tile pieces)."""
import os
import sys

import numpy as np
import pytest
import torch

import entangle_ext as ee
from entangle_ext import reference as ref

from _support import DEVICES
from _support import ragged

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")

TILE = 4096          # kTile of csrc/wasserstein.h


def _value_and_grads(u, v, uo, vo, weights=None, **kw):
    a, b = u.clone().requires_grad_(True), v.clone().requires_grad_(True)
    out = ee.wasserstein2_1d(a, b, uo, vo, **kw)
    w = torch.ones_like(out) if weights is None else weights
    torch.where(out.isnan(), 0, out * w).sum().backward()
    return out.detach(), a.grad, b.grad


def _bits(t):
    return t.view(torch.int64 if t.dtype == torch.float64 else torch.int32)


# ------------------------------------------------------------------------------ tiles
@pytest.mark.parametrize("lu,lv", [
    ([TILE - 3, 2 * TILE + 5, 17], [TILE - 3, 2 * TILE + 5, 17]),   # equal sizes across tiles
    ([5000, 3, 9000], [3, 5000, 9001]),                               # unequal, both drive
    ([1, 10000], [12000, 2]),                                         # one value against many
    ([4097, 300], [4096, 299]),                                       # runs straddling tile ends
])
def test_segments_across_tiles_match_reference(lu, lv):
    g = torch.Generator().manual_seed(21)
    u, uo = ragged(lu, g)
    v, vo = ragged(lv, g)
    w = torch.rand(len(lu), generator=g, dtype=torch.float64)
    got = _value_and_grads(u, v, uo, vo, w)
    ra, rb = u.clone().requires_grad_(True), v.clone().requires_grad_(True)
    want = ref.wasserstein2_1d(ra, rb, uo, vo)
    (want * w).sum().backward()
    torch.testing.assert_close(got[0], want.detach(), rtol=1e-11, atol=1e-13)
    torch.testing.assert_close(got[1], ra.grad, rtol=1e-9, atol=1e-13)
    torch.testing.assert_close(got[2], rb.grad, rtol=1e-9, atol=1e-13)


# ------------------------------------------------------------------------------ threads
def _mixed_ragged(dtype, g):
    # Two segments long enough for the all-threads path with 2 threads (equal sizes, and 300000
    # against 7), a 1-vs-many one, mid-size and short ones.
    lu = [200_000, 3, 70_000, 1, 300_000] + torch.randint(1, 300, (400,), generator=g).tolist()
    lv = [200_000, 5, 70_000, 90_000, 7] + torch.randint(1, 300, (400,), generator=g).tolist()
    u, uo = ragged(lu, g, dtype=dtype, distinct=False)
    v, vo = ragged(lv, g, dtype=dtype)
    return u, v, uo, vo


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bitwise_identical_for_one_and_two_threads(dtype):
    g = torch.Generator().manual_seed(22)
    u, v, uo, vo = _mixed_ragged(dtype, g)
    w = torch.rand(uo.numel() - 1, generator=g, dtype=dtype)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _value_and_grads(u, v, uo, vo, w)
        torch.set_num_threads(2)
        two = _value_and_grads(u, v, uo, vo, w)
    finally:
        torch.set_num_threads(old)
    for x, y in zip(one, two):
        assert torch.equal(_bits(x), _bits(y))
    want = ref.wasserstein2_1d(u.double(), v.double(), uo, vo)
    torch.testing.assert_close(one[0].double(), want, rtol=1e-5 if dtype == torch.float32 else 1e-10, atol=0)


def _thread_cpu_seconds():
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[tid] = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
        except OSError:
            pass
    return out


@pytest.mark.skipif((os.cpu_count() or 1) < 2 or not sys.platform.startswith("linux"),
                    reason="needs 2 CPUs and /proc")
def test_kernels_use_two_threads_on_a_large_ragged_input():
    # Not a speed assertion: the per-thread CPU time of the OS threads shows that the work of one
    # call is shared (each of two threads does at least a fifth of it), whatever the machine load.
    g = torch.Generator().manual_seed(23)
    lengths = [1 << 19] + torch.randint(1, 2000, (3000,), generator=g).tolist()
    u, uo = ragged(lengths, g, dtype=torch.float32)
    v, vo = ragged(lengths[::-1], g, dtype=torch.float32)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        ee.wasserstein2_1d(u, v, uo, vo, validate=False)  # warm up the thread pool
        before = _thread_cpu_seconds()
        for _ in range(8):
            ee.wasserstein2_1d(u.requires_grad_(True), v, uo, vo, validate=False).sum().backward()
        after = _thread_cpu_seconds()
    finally:
        torch.set_num_threads(old)
    spent = sorted((after[t] - before.get(t, 0.0) for t in after), reverse=True)
    total = sum(spent)
    assert total > 0.2, f"too little CPU time measured ({total:.2f} s)"
    assert spent[1] >= 0.2 * total, f"one thread did the work: per-thread CPU seconds {spent[:4]}"


# ------------------------------------------------------------------------------ special values
def test_signed_zeros_and_subnormals_follow_the_stable_order():
    # -0.0 and +0.0 tie (input order kept), subnormals sort by value: the gradient at ties must
    # match the reference (torch.sort stable) exactly.
    tiny = float(np.finfo(np.float64).smallest_subnormal)
    u = torch.tensor([0.0, -0.0, tiny, -tiny, 0.0, -0.0, 1.0, -1.0], dtype=torch.float64)
    v = torch.tensor([-0.0, 2 * tiny, 0.0, 0.5, -tiny, 0.0], dtype=torch.float64)
    uo, vo = torch.tensor([0, 8]), torch.tensor([0, 6])
    got = _value_and_grads(u, v, uo, vo)
    ra, rb = u.clone().requires_grad_(True), v.clone().requires_grad_(True)
    want = ref.wasserstein2_1d(ra, rb, uo, vo)
    want.sum().backward()
    torch.testing.assert_close(got[0], want.detach(), rtol=1e-15, atol=0)
    torch.testing.assert_close(got[1], ra.grad, rtol=1e-15, atol=0)
    torch.testing.assert_close(got[2], rb.grad, rtol=1e-15, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_non_finite_values_without_validation_match_the_reference(dtype):
    inf, nan = float("inf"), float("nan")
    u = torch.tensor([1.0, nan, 2.0, -inf, 0.5, 3.0, inf, -nan, 1.0, 2.0], dtype=dtype)
    v = torch.tensor([0.0, 1.0, 2.0, 5.0, inf, 1.0, 1.0, 1.0], dtype=dtype)
    uo, vo = torch.tensor([0, 3, 6, 8, 10]), torch.tensor([0, 2, 4, 6, 8])
    got = ee.wasserstein2_1d(u, v, uo, vo, validate=False)
    want = ref.wasserstein2_1d(u, v, uo, vo)
    torch.testing.assert_close(got, want, equal_nan=True)
    assert got[0].isnan() and got[1].item() == inf and got[2].isnan() and got[3].item() == 0.5


# ------------------------------------------------------------------------------ zero-size inputs
ZERO_SIZE_FORMS = [
    ("dense (0, 4) vs (0, 4)", lambda dt: (torch.zeros(0, 4, dtype=dt), torch.zeros(0, 4, dtype=dt), None, None)),
    ("dense (0, 3) vs (0, 5)", lambda dt: (torch.zeros(0, 3, dtype=dt), torch.zeros(0, 5, dtype=dt), None, None)),
    ("dense (0, 0) vs (0, 0)", lambda dt: (torch.zeros(0, 0, dtype=dt), torch.zeros(0, 0, dtype=dt), None, None)),
    ("ragged, no segment", lambda dt: (torch.zeros(0, dtype=dt), torch.zeros(0, dtype=dt), [0], [0])),
    ("ragged int32, no segment", lambda dt: (torch.zeros(0, dtype=dt), torch.zeros(0, dtype=dt),
                                             torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))),
]


@pytest.mark.parametrize("form", ZERO_SIZE_FORMS, ids=[f[0] for f in ZERO_SIZE_FORMS])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("which", ["u", "v", "both"])
def test_zero_segments_keep_the_autograd_graph(device, form, reduction, dtype, which):
    u, v, uo, vo = form[1](dtype)
    u = u.to(device).requires_grad_(which in ("u", "both"))
    v = v.to(device).requires_grad_(which in ("v", "both"))
    for validate in (True, False):
        out = ee.wasserstein2_1d(u, v, uo, vo, reduction=reduction, validate=validate)
        want = ref.wasserstein2_1d(u, v, uo, vo, reduction=reduction)
        assert out.requires_grad and out.grad_fn is not None
        assert out.shape == want.shape and out.dtype == want.dtype
        torch.testing.assert_close(out.detach(), want.detach(), equal_nan=True)
        grads = torch.autograd.grad(out.sum(), [t for t in (u, v) if t.requires_grad])
        for gr, t in zip(grads, [t for t in (u, v) if t.requires_grad]):
            assert gr.shape == t.shape and gr.dtype == t.dtype and not gr.any()


def test_zero_segments_under_no_grad_and_detached():
    u = torch.zeros(0, 4, requires_grad=True)
    with torch.no_grad():
        assert not ee.wasserstein2_1d(u, u.detach()).requires_grad
    assert not ee.wasserstein2_1d(u.detach(), u.detach(), reduction="sum").requires_grad


# ------------------------------------------------------------------------------ local gradients
def test_forward_returns_local_gradients_only_when_asked():
    g = torch.Generator().manual_seed(24)
    u, uo = ragged([3, 8, 1], g)
    v, vo = ragged([5, 8, 4], g)
    op = torch.ops.entangle_ext.wasserstein2_1d
    w, du, dv = op(u, v, uo, vo, -1)
    assert du.shape == (0,) and dv.shape == (0,)
    w2, du, dv = op(u, v, uo, vo, -1, True, False)
    assert torch.equal(w, w2) and du.shape == u.shape and dv.shape == (0,)
    ra = u.clone().requires_grad_(True)
    ref.wasserstein2_1d(ra, v, uo, vo).sum().backward()
    torch.testing.assert_close(du, ra.grad, rtol=1e-12, atol=1e-14)
    # Called raw without the flag, the backward recomputes what it needs.
    a = u.clone().requires_grad_(True)
    op(a, v, uo, vo, -1)[0].sum().backward()
    torch.testing.assert_close(a.grad, ra.grad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dev", DEVICES)
def test_malformed_offsets_give_zero_gradient_outside_segments(dev):
    # validate=False with offsets that do not cover every value: memory-safe, and the positions in
    # no segment get a zero (not uninitialised) gradient.
    u = torch.arange(8.0, dtype=torch.float64, device=dev).requires_grad_(True)
    v = torch.arange(6.0, dtype=torch.float64, device=dev).requires_grad_(True)
    out = ee.wasserstein2_1d(u, v, [2, 4, 6], [0, 3, 5], validate=False)
    out.sum().backward()
    assert torch.isfinite(out).all()
    assert not u.grad[[0, 1, 6, 7]].any() and not v.grad[5].any()
