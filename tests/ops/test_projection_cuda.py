"""GPU tests of the projection operators (skipped without CUDA): CUDA against the CPU kernels, CUDA
graphs, bitwise determinism, the current-stream contract, more than 2^31 elements, and the split
passes (docs/algorithm.md §5)."""
import pytest
import torch

import entangle_ext as ee

from _tiny import flat_of, make_lists, rand

pytestmark = [pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}"),
              pytest.mark.cuda]

D = torch.float64


# ------------------------------------------------------------------------------ against the CPU
@pytest.mark.cuda
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-11),
                                       (torch.bfloat16, 2e-2), (torch.float16, 2e-3)])
@pytest.mark.parametrize("k", [1, 2, 4, 7, 8])
def test_cuda_matches_cpu(dtype, tol, k):
    gen = torch.Generator().manual_seed(20 + k)
    shapes = [(1,), (0,), (64, 3, 3, 3), (16385,), (300000,), (5,)] + [(17,)] * 60  # > one launch
    grads, basis = make_lists(shapes, k, gen, dtype=dtype)
    gc = [x.cuda() for x in grads]
    bc = [[v.cuda() for v in r] for r in basis]
    c_cpu = ee.project_orthogonal_(grads, basis)
    c_gpu = ee.project_orthogonal_(gc, bc)
    gn = flat_of(grads).double().norm().item()
    torch.testing.assert_close(c_gpu.cpu(), c_cpu, rtol=1e-6 if dtype != D else 1e-10, atol=1e-9)
    got, want = flat_of(gc).double().cpu(), flat_of(grads).double()
    assert (got - want).abs().max() <= tol * gn
    g, V = torch.randn(1 << 20, generator=gen, dtype=D), torch.randn(k, 1 << 20, generator=gen, dtype=D)
    out_gpu, cf_gpu = ee.project_orthogonal(g.cuda().to(dtype), V.cuda().to(dtype))
    out_cpu, cf_cpu = ee.project_orthogonal(g.to(dtype), V.to(dtype))
    assert (out_gpu.cpu().double() - out_cpu.double()).abs().max() <= tol * g.norm()


@pytest.mark.cuda
@pytest.mark.parametrize("k", [2, 8])
def test_cuda_tensor_spanning_several_launches(k):
    # A tensor of more than 320 chunks of 16K elements among full argument structs of small tensors
    # (several launches, grid-stride over the chunks; projection.h proj_plan_groups).
    gen = torch.Generator().manual_seed(40 + k)
    shapes = [(17,)] * 23 + [(321 * 16384 + 5,), (0,), (3,)] + [(16384,)] * 30
    grads, basis = make_lists(shapes, k, gen, dtype=torch.float32)
    gc = [x.cuda() for x in grads]
    bc = [[v.cuda() for v in r] for r in basis]
    c_cpu = ee.project_orthogonal_(grads, basis)
    c_gpu = ee.project_orthogonal_(gc, bc)
    torch.testing.assert_close(c_gpu.cpu(), c_cpu, rtol=1e-6, atol=1e-9)
    gn = flat_of(grads).double().norm().item()
    assert (flat_of(gc).double().cpu() - flat_of(grads).double()).abs().max() <= 1e-5 * gn


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_degenerate_bases_match_cpu(dtype):
    gen = torch.Generator().manual_seed(32)
    P = 50000
    g, a, b, w = (rand(P, gen) for _ in range(4))
    bases = [torch.stack([a, a]), torch.stack([a, torch.zeros(P, dtype=D), -3 * a, b]),
             torch.stack([a, a + 1e-9 * w]), torch.stack([a, a + 1e-3 * w, b]), torch.zeros(2, P, dtype=D)]
    for V in bases:
        out_c, c_c = ee.project_orthogonal(g.to(dtype), V.to(dtype))
        out_g, c_g = ee.project_orthogonal(g.to(dtype).cuda(), V.to(dtype).cuda())
        assert torch.isfinite(out_g).all() and torch.isfinite(c_g).all()
        tol = 1e-5 if dtype == torch.float32 else 1e-10
        assert (out_g.cpu().double() - out_c.double()).abs().max() <= tol * g.norm()
        assert out_g.double().norm().cpu() <= g.norm() * (1 + tol)


@pytest.mark.cuda
def test_cuda_graph_capture_inplace():
    gen = torch.Generator().manual_seed(30)
    shapes = [(128, 64), (0,), (70000,), (3,)]
    grads, basis = make_lists(shapes, 2, gen, dtype=torch.float32, device="cuda")
    want = [x.clone() for x in grads]
    c_want = ee.project_orthogonal_(want, basis)
    work = [x.clone() for x in grads]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside capture
        ee.project_orthogonal_([x.clone() for x in grads], basis)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = ee.project_orthogonal_(work, basis)
    for x, y in zip(work, grads):
        x.copy_(y)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(c, c_want, rtol=0, atol=0)
    for a, b in zip(work, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.cuda
def test_cuda_gradcheck_and_opcheck():
    gen = torch.Generator().manual_seed(31)
    g = rand(20, gen).cuda().requires_grad_(True)
    V = rand((2, 20), gen).cuda()
    assert torch.autograd.gradcheck(lambda x: ee.project_orthogonal(x, V)[0], (g,))
    torch.library.opcheck(torch.ops.entangle_ext.project_orthogonal.default, (g.detach(), V, 1e-7))
    grads = [rand((4, 5), gen).cuda(), rand((9,), gen).cuda()]
    basis = [rand((4, 5), gen).cuda(), rand((9,), gen).cuda()]
    torch.library.opcheck(torch.ops.entangle_ext.project_orthogonal_.default, (grads, basis, 1e-7))


# ------------------------------------------------------------------------------ split passes, rescue
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_cuda_split_ops_match_cpu(dtype, k):
    gen = torch.Generator().manual_seed(50 + k)
    shapes = [(1,), (0,), (300000,), (64, 3, 3)] + [(17,)] * 90  # several launches
    grads, basis = make_lists(shapes, k, gen, dtype)
    gc, bc = [x.cuda() for x in grads], [[v.cuda() for v in r] for r in basis]
    G, b = ee.projection_gram(grads, basis)
    Gc, bcv = ee.projection_gram(gc, bc)
    torch.testing.assert_close(Gc.cpu(), G, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(bcv.cpu(), b, rtol=1e-10, atol=1e-10)
    c, cc = ee.projection_solve(G, b, shift=0.1), ee.projection_solve(Gc, bcv, shift=0.1)
    torch.testing.assert_close(cc.cpu(), c, rtol=1e-9, atol=1e-12)
    ee.projection_apply_(grads, basis, c)
    ee.projection_apply_(gc, bc, c.cuda())
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-6
    assert (flat_of(gc).double().cpu() - flat_of(grads).double()).abs().max() <= tol * flat_of(grads).double().norm()


@pytest.mark.parametrize("scale", [1e160, 1e-160, 1e300])
def test_cuda_extreme_scales_match_cpu(scale):
    gen = torch.Generator().manual_seed(60)
    grads, basis = make_lists([(70001,), (5, 5), (16384,)], 3, gen)
    basis[1] = [v * scale for v in basis[1]]
    orig = flat_of(grads).clone()
    gc, bc = [x.cuda() for x in grads], [[v.cuda() for v in r] for r in basis]
    c_cpu, c_gpu = ee.project_orthogonal_(grads, basis), ee.project_orthogonal_(gc, bc)
    torch.testing.assert_close(c_gpu.cpu(), c_cpu, rtol=1e-9, atol=0)
    gn = flat_of(grads).norm()
    assert (flat_of(gc).cpu() - flat_of(grads)).abs().max() <= 1e-10 * gn
    assert (flat_of(grads) - orig).norm() > 1e-3 * orig.norm()  # the rows were projected out


# ------------------------------------------------------------------------------ graphs, determinism
def _capture(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside capture
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_graph_capture_flat_and_multi_launch_list(dtype):
    gen = torch.Generator().manual_seed(70)
    g, V = rand(100003, gen, dtype).cuda(), rand((3, 100003), gen, dtype).cuda()
    if dtype == D:
        V[1] *= 1e200  # the gated rescue launches run inside the graph
    out_want, c_want = ee.project_orthogonal(g, V)
    graph, (out, c) = _capture(lambda: ee.project_orthogonal(g, V))
    graph.replay()  # same inputs: the replay reproduces the eager result bit for bit
    torch.cuda.synchronize()
    assert torch.equal(out, out_want) and torch.equal(c, c_want)
    shapes = [(17,)] * 100 + [(70000,), (0,), (128, 64)]  # more tensors than one launch holds
    grads, basis = make_lists(shapes, 8, gen, dtype, "cuda")
    want = [x.clone() for x in grads]
    c_list_want = ee.project_orthogonal_(want, basis)
    work = [x.clone() for x in grads]
    graph, c_list = _capture(lambda: ee.project_orthogonal_(work, basis))
    for x, y in zip(work, grads):
        x.copy_(y)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(c_list, c_list_want) and all(torch.equal(a, b) for a, b in zip(work, want))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_cuda_bitwise_deterministic(dtype):
    gen = torch.Generator().manual_seed(80)
    grads, basis = make_lists([(1 << 22,), (33,), (0,), (5000, 7)] + [(9,)] * 50, 5, gen, dtype, "cuda")
    runs = []
    for _ in range(3):
        work = [x.clone() for x in grads]
        c = ee.project_orthogonal_(work, basis)
        G, b = ee.projection_gram(grads, basis)
        runs.append((c, work, G, b))
    for c, work, G, b in runs[1:]:
        assert torch.equal(c, runs[0][0]) and torch.equal(G, runs[0][2]) and torch.equal(b, runs[0][3])
        assert all(torch.equal(x, y) for x, y in zip(work, runs[0][1]))


def test_cuda_current_stream_contract():
    """Work queued on a side stream (a delayed producer write) is seen by the op on that stream."""
    gen = torch.Generator().manual_seed(90)
    grads, basis = make_lists([(1 << 20,), (77,)], 2, gen, torch.float32, "cuda")
    src = [x.clone() for x in grads]
    want = [x.clone() for x in src]
    c_want = ee.project_orthogonal_(want, basis)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        for x, y in zip(grads, src):
            x.zero_().add_(y)  # producer write, after the delay
        c = ee.project_orthogonal_(grads, basis)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(c, c_want) and all(torch.equal(a, b) for a, b in zip(grads, want))


def test_cuda_more_than_2_pow_31_elements():
    n_big = (1 << 31) + 4099
    need = 2 * 2 * (n_big + (1 << 20)) + (2 << 30)  # g and v in float16, plus headroom
    free, _ = torch.cuda.mem_get_info()
    if free < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free GPU memory")
    # g = 1 everywhere; v = +1 on the first third of each tensor, -1 elsewhere: c = (v.g)/(v.v).
    sizes = [n_big, (1 << 20) + 5]
    grads = [torch.ones(n, dtype=torch.float16, device="cuda") for n in sizes]
    basis = [[torch.ones(n, dtype=torch.float16, device="cuda") for n in sizes]]
    for v in basis[0]:
        v[v.numel() // 3:] = -1
    plus = sum(n // 3 for n in sizes)
    total = sum(sizes)
    c_want = (plus - (total - plus)) / total
    c = ee.project_orthogonal_(grads, basis)
    torch.testing.assert_close(c.cpu(), torch.tensor([c_want], dtype=D), rtol=1e-12, atol=0)
    for x, n in zip(grads, sizes):
        lo, hi = torch.tensor(1 - c_want, dtype=torch.float16), torch.tensor(1 + c_want, dtype=torch.float16)
        assert bool((x[: n // 3] == lo.cuda()).all()) and bool((x[n // 3:] == hi.cuda()).all())
