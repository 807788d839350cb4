"""CUDA tests of entangle_ext.wasserstein2_1d (skipped without a GPU): CUDA against the CPU kernel
(itself tested against float64 references), both forward paths, special values, determinism,
CUDA-graph capture, max_seqlen hints and unbalanced sizes."""
import numpy as np
import pytest
import torch

import entangle_ext as ee

from _support import ragged

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")]


def _run(u, v, uo, vo, dev, weights=None, **kw):
    """Value and gradients of sum_s w_s W2^2_s on `dev` (NaN segments weighted 0)."""
    a = u.to(dev).clone().requires_grad_(True)
    b = v.to(dev).clone().requires_grad_(True)
    out = ee.wasserstein2_1d(a, b, None if uo is None else uo.to(dev), None if vo is None else vo.to(dev), **kw)
    w = torch.ones_like(out) if weights is None else weights.to(dev)
    torch.where(out.isnan(), 0, out * w).sum().backward()
    return out.detach().cpu(), a.grad.cpu(), b.grad.cpu()


@pytest.mark.cuda
@pytest.mark.parametrize("S,n,m", [(1, 128, 128), (64, 512, 512), (1024, 256, 256), (7, 2048, 2000),
                                   (3, 5000, 4096), (2, 70000, 65536), (1, 1 << 20, 1 << 20)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_matches_cpu(S, n, m, dtype):
    g = torch.Generator().manual_seed(5)
    u = torch.randn(S, n, generator=g, dtype=dtype)
    v = torch.randn(S, m, generator=g, dtype=dtype) * 2
    uc, vc = u.cuda().requires_grad_(True), v.cuda().requires_grad_(True)
    ucpu, vcpu = u.clone().requires_grad_(True), v.clone().requires_grad_(True)
    wg = ee.wasserstein2_1d(uc, vc)
    wc = ee.wasserstein2_1d(ucpu, vcpu)
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(wg.cpu(), wc, rtol=tol, atol=tol)
    wg.sum().backward()
    wc.sum().backward()
    torch.testing.assert_close(uc.grad.cpu(), ucpu.grad, rtol=tol, atol=tol * 1e-2)
    torch.testing.assert_close(vc.grad.cpu(), vcpu.grad, rtol=tol, atol=tol * 1e-2)


@pytest.mark.cuda
@pytest.mark.parametrize("n", [100, 1500, 9000])
def test_cuda_ties_follow_the_stable_order(n):
    # Heavy ties: the gradient depends on the tie order, which must be the stable (input) order.
    g = torch.Generator().manual_seed(8)
    u = torch.randint(-4, 5, (3, n), generator=g).float()
    v = torch.randint(-4, 5, (3, n), generator=g).float() + 0.5
    grads = []
    for dev in ("cpu", "cuda"):
        a = u.to(dev).requires_grad_(True)
        (ee.wasserstein2_1d(a, v.to(dev)) * torch.tensor([1.0, 2.0, 3.0], device=dev)).sum().backward()
        grads.append(a.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)


@pytest.mark.cuda
def test_cuda_many_segments_device_path():
    g = torch.Generator().manual_seed(9)
    lengths = torch.randint(1, 9, (70000,), generator=g).tolist()
    u, uo = ragged(lengths, g, dtype=torch.float32)
    v, vo = ragged(lengths[::-1], g, dtype=torch.float32)
    got = ee.wasserstein2_1d(u.cuda(), v.cuda(), uo.cuda(), vo.cuda(), validate=False)
    torch.testing.assert_close(got.cpu(), ee.wasserstein2_1d(u, v, uo, vo), rtol=1e-4, atol=1e-6)


@pytest.mark.cuda
@pytest.mark.parametrize("max_seqlen", [None, 5000])
def test_cuda_ragged_device_path(max_seqlen):
    g = torch.Generator().manual_seed(6)
    lu, lv = [1, 300, 5000, 17, 4096], [2, 299, 4000, 17, 1]
    u, uo = ragged(lu, g, dtype=torch.float32)
    v, vo = ragged(lv, g, dtype=torch.float32)
    got = ee.wasserstein2_1d(u.cuda(), v.cuda(), uo.cuda(), vo.cuda(), validate=False,
                             max_seqlen=max_seqlen)
    torch.testing.assert_close(got.cpu(), ee.wasserstein2_1d(u, v, uo, vo), rtol=1e-4, atol=1e-6)


@pytest.mark.cuda
@pytest.mark.parametrize("max_seqlen", [8, 500, 1000, 2048, None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_empty_segments_and_large_grid_match_cpu(max_seqlen, dtype):
    # validate=False: empty segments (NaN value, zero gradient) on every path (block tiers with
    # more than 65535 blocks, and the device-wide sort), heavy ties, against the CPU kernel.
    g = torch.Generator().manual_seed(11)
    S = 70000
    lu = torch.randint(0, 9, (S,), generator=g)
    lv = torch.randint(0, 9, (S,), generator=g)
    lu[:3] = 0
    lv[3:6] = 0
    u, uo = ragged(lu.tolist(), g, dtype=dtype, distinct=False)
    v, vo = ragged(lv.tolist(), g, dtype=dtype, distinct=False)
    w = torch.rand(S, generator=g, dtype=dtype)
    res = []
    for dev in ("cpu", "cuda"):
        a, b = u.to(dev).requires_grad_(True), v.to(dev).requires_grad_(True)
        out = ee.wasserstein2_1d(a, b, uo.to(dev), vo.to(dev), validate=False, max_seqlen=max_seqlen)
        torch.where(out.isnan(), 0, out * w.to(dev)).sum().backward()
        res.append((out.detach().cpu(), a.grad.cpu(), b.grad.cpu()))
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for got, want in zip(res[1], res[0]):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)
    assert res[1][0][:6].isnan().all()


@pytest.mark.cuda
def test_cuda_one_long_segment_among_short_ones_float32():
    # One long segment among many short ones: the device path sums it over fixed tiles (in float64),
    # so its cost and accuracy do not depend on the mix of segment lengths.
    g = torch.Generator().manual_seed(12)
    lengths = [1] * 3000 + [12_000_000]
    u, uo = torch.randn(sum(lengths), generator=g), torch.tensor([0] + list(np.cumsum(lengths)))
    v = torch.randn(sum(lengths), generator=g) * 2
    want = ee.wasserstein2_1d(u, v, uo, uo, validate=False)
    got = ee.wasserstein2_1d(u.cuda(), v.cuda(), uo.cuda(), uo.cuda(), validate=False)
    torch.testing.assert_close(got.cpu(), want, rtol=2e-6, atol=1e-6)


@pytest.mark.cuda
def test_cuda_graph_capture_and_side_stream():
    g = torch.Generator().manual_seed(7)
    u = torch.randn(64, 256, generator=g).cuda().requires_grad_(True)
    v = torch.randn(64, 256, generator=g).cuda()
    lu = torch.randint(1, 3000, (8,), generator=g)
    ur, uo = ragged(lu.tolist(), g, dtype=torch.float32)
    vr, vo = ragged(lu.tolist(), g, dtype=torch.float32)
    ur, uo, vr, vo = ur.cuda(), uo.cuda(), vr.cuda(), vo.cuda()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream
        for _ in range(2):
            u.grad = None
            ee.wasserstein2_1d(u, v, validate=False).sum().backward()
            ee.wasserstein2_1d(ur, vr, uo, vo, validate=False)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    u.grad = None
    with torch.cuda.graph(graph):
        out = ee.wasserstein2_1d(u, v, validate=False)
        out.sum().backward()
        out_r = ee.wasserstein2_1d(ur, vr, uo, vo, validate=False)
    with torch.no_grad():
        u.mul_(2.0)
        v.mul_(2.0)
        ur.mul_(3.0)
        vr.mul_(3.0)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, ee.wasserstein2_1d(u.detach(), v), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out_r, ee.wasserstein2_1d(ur, vr, uo, vo), rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="capture"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            ee.wasserstein2_1d(u.detach(), v)


@pytest.mark.cuda
def test_cuda_cpu_offsets_and_device_mismatch():
    x = torch.randn(6)
    got = ee.wasserstein2_1d(x.cuda(), x.cuda() + 1, [0, 3, 6], [0, 2, 6])
    torch.testing.assert_close(got.cpu(), ee.wasserstein2_1d(x, x + 1, [0, 3, 6], [0, 2, 6]))
    with pytest.raises(ValueError, match="is on"):
        ee.wasserstein2_1d(x.cuda(), x)


# ------------------------------------------------------------------------------ special values
SPECIAL = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, -1e-45, 1.1754942e-38, 3.0e38]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("max_seqlen", [64, None])  # block path, device path
def test_cuda_special_values_match_cpu(dtype, max_seqlen):
    # +-0, NaN, +-Inf and subnormals with validate=False: same NaN/Inf pattern, values and gradients.
    g = torch.Generator().manual_seed(31)
    lengths = torch.randint(1, 40, (50,), generator=g).tolist()
    u, uo = ragged(lengths, g, dtype=dtype, distinct=False)
    v, vo = ragged(lengths[::-1], g, dtype=dtype, distinct=False)
    special = torch.tensor(SPECIAL, dtype=dtype)
    for x in (u, v):
        pos = torch.randperm(x.numel(), generator=g)[: x.numel() // 5]
        x[pos] = special[torch.randint(0, len(SPECIAL), (pos.numel(),), generator=g)]
    kw = dict(validate=False, max_seqlen=max_seqlen)
    got, want = _run(u, v, uo, vo, "cuda", **kw), _run(u, v, uo, vo, "cpu", **kw)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert got[0].isnan().any() and torch.isfinite(got[0]).any()


# ------------------------------------------------------------------------------ determinism
@pytest.mark.parametrize("max_seqlen", [2048, None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_bitwise_deterministic(max_seqlen, dtype):
    g = torch.Generator().manual_seed(32)
    lu = torch.randint(1, 2000, (300,), generator=g).tolist()
    lv = torch.randint(1, 2000, (300,), generator=g).tolist()
    if max_seqlen is None:
        lu[7], lv[9] = 300_000, 5  # long and unbalanced segments on the device path
    u, uo = ragged(lu, g, dtype=dtype, distinct=False)
    v, vo = ragged(lv, g, dtype=dtype)
    w = torch.rand(300, generator=g, dtype=dtype)
    first = _run(u, v, uo, vo, "cuda", w, validate=False, max_seqlen=max_seqlen)
    for _ in range(3):
        again = _run(u, v, uo, vo, "cuda", w, validate=False, max_seqlen=max_seqlen)
        for x, y in zip(first, again):
            assert torch.equal(x.view(torch.int64 if dtype == torch.float64 else torch.int32),
                               y.view(torch.int64 if dtype == torch.float64 else torch.int32))


# ------------------------------------------------------------------------------ graph capture
def test_cuda_graph_capture_of_device_path_backward():
    g = torch.Generator().manual_seed(33)
    lu = torch.randint(1, 9000, (16,), generator=g).tolist()
    lv = torch.randint(1, 9000, (16,), generator=g).tolist()
    u, uo = ragged(lu, g, dtype=torch.float32)
    v, vo = ragged(lv, g, dtype=torch.float32)
    u, v, uo, vo = u.cuda().requires_grad_(True), v.cuda().requires_grad_(True), uo.cuda(), vo.cuda()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up: device offsets, no hint -> device path
        for _ in range(2):
            u.grad = v.grad = None
            ee.wasserstein2_1d(u, v, uo, vo, validate=False).sum().backward()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    u.grad = v.grad = None
    with torch.cuda.graph(graph):
        out = ee.wasserstein2_1d(u, v, uo, vo, validate=False)
        out.sum().backward()
    with torch.no_grad():
        u.mul_(2.0)
        v.add_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    want = _run(u.detach().cpu(), v.detach().cpu(), uo.cpu(), vo.cpu(), "cpu")
    torch.testing.assert_close(out.detach().cpu(), want[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(u.grad.cpu(), want[1], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(v.grad.cpu(), want[2], rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------ max_seqlen hints
def test_cuda_max_seqlen_hint_too_small():
    g = torch.Generator().manual_seed(34)
    lengths = [5, 300, 40]
    u, uo = ragged(lengths, g, dtype=torch.float32)
    v, vo = ragged(lengths, g, dtype=torch.float32)
    uc, vc = u.cuda(), v.cuda()
    # Host offsets: checked on the host without a sync; validate=True: checked with the data.
    with pytest.raises(ValueError, match="max_seqlen"):
        ee.wasserstein2_1d(uc, vc, uo, vo, max_seqlen=64, validate=False)
    with pytest.raises(ValueError, match="max_seqlen"):
        ee.wasserstein2_1d(uc, vc, uo.cuda(), vo.cuda(), max_seqlen=64)
    # Device offsets without validation: the segments that fit are right, the longer one is NaN
    # with a zero gradient (never an out-of-range access).
    got = _run(u, v, uo, vo, "cuda", validate=False, max_seqlen=64)
    want = _run(u, v, uo, vo, "cpu")
    assert got[0][1].isnan() and not got[1][5:305].any() and not got[2][5:305].any()
    keep = torch.tensor([0, 2])
    torch.testing.assert_close(got[0][keep], want[0][keep], rtol=1e-5, atol=1e-6)
    for x, y in zip(got[1:], want[1:]):
        mask = torch.ones_like(x, dtype=torch.bool)
        mask[5:305] = False
        torch.testing.assert_close(x[mask], y[mask], rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------ unbalanced sizes
@pytest.mark.parametrize("nu,nv", [(1, 1_000_000), (1_000_000, 1), (3, 999_983)])
def test_cuda_unbalanced_sizes(nu, nv):
    g = torch.Generator().manual_seed(35)
    u = torch.randn(nu, generator=g, dtype=torch.float64)
    v = torch.randn(nv, generator=g, dtype=torch.float64) * 2 + 0.5
    uo, vo = torch.tensor([0, nu]), torch.tensor([0, nv])
    got = _run(u, v, uo, vo, "cuda", validate=False)
    want = _run(u, v, uo, vo, "cpu")
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-15)
