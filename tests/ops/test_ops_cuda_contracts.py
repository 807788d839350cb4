"""Contracts every CUDA operator keeps (skipped without a GPU).

* Bitwise determinism: repeated runs on the same inputs give the same bits (forward and backward).
* The current stream: an operator enqueues its work on the caller's current stream, so it sees a
  producer's write made earlier on that stream (even when that stream is delayed), and it neither
  runs on nor waits for the default stream, nor synchronises the host. Gradients are taken with
  torch.autograd.grad (backward ops run on their forward op's stream), not .backward(), whose
  accumulation into a leaf's .grad follows autograd's own stream rules.
* CUDA-graph capture of the augmented-Lagrangian operators: a captured dual step + term + gradient
  replays with new data and matches eager execution bit for bit.

Tests marked ``sanitize`` are the small subset that scripts/gpu_check.sh runs under
compute-sanitizer (memcheck, racecheck, synccheck, initcheck).
"""
import pytest
import torch

import entangle_ext as ee

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")]

SLEEP_CYCLES = 200_000_000   # torch.cuda._sleep: ~0.1 s at H200 clocks, far longer than any op here


def _gen(seed):
    return torch.Generator(device="cuda").manual_seed(seed)


def _w2_dense(seed=0, S=64, n=512, m=384):
    g = _gen(seed)
    u = torch.randn(S, n, device="cuda", generator=g).requires_grad_(True)
    v = torch.randn(S, m, device="cuda", generator=g).requires_grad_(True)

    def run():
        w2 = ee.wasserstein2_1d(u, v, validate=False)
        return [w2.detach(), *torch.autograd.grad((w2 * torch.arange(1, S + 1, device="cuda")).sum(),
                                                  (u, v))]
    return run, [u, v]


def _w2_ragged(seed=1):
    g = _gen(seed)
    lu = torch.tensor([1, 70_000, 3, 1 << 20, 17], device="cuda")
    lv = torch.tensor([5, 1, 40_000, 1000, 17], device="cuda")
    uo = torch.cat([lu.new_zeros(1), lu.cumsum(0)])
    vo = torch.cat([lv.new_zeros(1), lv.cumsum(0)])
    u = torch.randn(int(uo[-1]), device="cuda", generator=g).requires_grad_(True)
    v = torch.randn(int(vo[-1]), device="cuda", generator=g).requires_grad_(True)

    def run():
        w2 = ee.wasserstein2_1d(u, v, uo, vo, max_seqlen=1 << 20, validate=False)
        return [w2.detach(), *torch.autograd.grad(w2.sum(), (u, v))]
    return run, [u, v]


def _projection_flat(seed=2, P=(1 << 22) + 3, k=4):
    g = _gen(seed)
    x = torch.randn(P, device="cuda", generator=g).requires_grad_(True)
    basis = torch.randn(k, P, device="cuda", generator=g)

    def run():
        out, coeffs = ee.project_orthogonal(x, basis)
        return [out.detach(), coeffs, *torch.autograd.grad((out * out).sum(), x)]
    return run, [x]


def _projection_list(seed=3, k=3):
    g = _gen(seed)
    shapes = [(64, 3, 3, 3), (5,), (1000, 1001), (0,), (7, 7), (1 << 20,)]
    grads0 = [torch.randn(s, device="cuda", generator=g) for s in shapes]
    basis = [[torch.randn(s, device="cuda", generator=g) for s in shapes] for _ in range(k)]
    work = [t.clone() for t in grads0]

    def run():
        for w, t in zip(work, grads0):
            w.copy_(t)
        coeffs = ee.project_orthogonal_(work, basis)
        return [coeffs] + [w.clone() for w in work]
    return run, grads0


def _dual_update(seed=4, m=70_000):
    g_ = _gen(seed)
    lam0 = torch.randn(m, device="cuda", generator=g_)
    g = torch.randn(m, device="cuda", generator=g_)
    mu = torch.rand(m, device="cuda", generator=g_) + 0.5
    lam = lam0.clone()

    def run():
        lam.copy_(lam0)
        ee.dual_update_(lam, g, mu, kind="inequality", lam_max=2.0, damping=0.1, check_finite=False)
        return [lam.clone()]
    return run, [lam0, g, mu]


def _al_term(seed=5, m=70_000, kind="inequality"):
    g_ = _gen(seed)
    lam = torch.rand(m, device="cuda", generator=g_)
    g = torch.randn(m, device="cuda", generator=g_).requires_grad_(True)
    mu = torch.tensor(3.0, device="cuda")

    def run():
        term = ee.augmented_lagrangian_term(g, lam, mu, kind=kind)
        return [term.detach(), *torch.autograd.grad(term, g)]
    return run, [lam, g]


OPS = {"w2_dense": _w2_dense, "w2_ragged": _w2_ragged, "project_orthogonal": _projection_flat,
       "project_orthogonal_": _projection_list, "dual_update_": _dual_update,
       "augmented_lagrangian_term": _al_term}


def _bits(t):
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def _assert_bitwise_equal(got, want, what):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape and a.dtype == b.dtype, (what, i)
        assert torch.equal(_bits(a), _bits(b)), f"{what}: output {i} differs bitwise"


@pytest.mark.parametrize("op", list(OPS))
def test_bitwise_deterministic(op):
    run, _ = OPS[op]()
    first = [t.clone() for t in run()]
    for rep in range(4):
        _assert_bitwise_equal(run(), first, f"{op} repeat {rep + 1}")


def _stream_case(op):
    """(run, inputs, expected): expected is computed on synchronised data before the test. This
    first run also loads every kernel involved (lazy module loading may synchronise the device,
    which must not happen while a stream sleeps)."""
    run, inputs = OPS[op]()
    expected = [t.clone() for t in run()]
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    return run, inputs, expected


@pytest.mark.parametrize("op", list(OPS))
def test_sees_a_producer_write_on_a_delayed_current_stream(op):
    run, inputs, expected = _stream_case(op)
    saved = [t.detach().clone() for t in inputs]
    with torch.no_grad():
        for t in inputs:
            t.zero_()           # what the op would read if it ran ahead of the producer
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        with torch.no_grad():
            for t, s in zip(inputs, saved):
                t.copy_(s)      # the producer's write, queued behind the sleep
        got = run()
        host_waited = side.query()   # True only if the op synchronised with the device
    side.synchronize()
    torch.cuda.synchronize()
    assert not host_waited, f"{op} synchronised the host (the side stream had finished)"
    _assert_bitwise_equal(got, expected, f"{op} on a delayed side stream")


@pytest.mark.parametrize("op", list(OPS))
def test_does_not_use_the_default_stream(op):
    run, _, expected = _stream_case(op)
    side = torch.cuda.Stream()
    torch.cuda._sleep(SLEEP_CYCLES)      # the default stream is busy for a while
    with torch.cuda.stream(side):
        got = run()
        got = [t.clone() for t in got]   # on the side stream as well
        side.synchronize()
        default_busy = not torch.cuda.default_stream().query()
        got_host = [t.cpu() for t in got]
    torch.cuda.synchronize()
    assert default_busy, (f"{op}: the default stream was idle when the op's stream finished: the "
                          "op waited for the default stream (or the sleep was too short)")
    _assert_bitwise_equal(got_host, [t.cpu() for t in expected], f"{op} with a busy default stream")


# ------------------------------------------------------------------------------ CUDA graphs
def _al_step(lam, g_in, mu, kind):
    """One captured unit: the term and its gradient at g_in, then the dual step with g_in."""
    g = g_in.detach().requires_grad_(True)
    term = ee.augmented_lagrangian_term(g, lam, mu, kind=kind)
    (grad,) = torch.autograd.grad(term, g)
    ee.dual_update_(lam, g_in, mu, kind=kind, lam_min=-4.0, lam_max=4.0, damping=0.05,
                    check_finite=False)
    return term, grad


@pytest.mark.parametrize("kind", ["equality", "inequality"])
@pytest.mark.parametrize("vector_mu", [False, True])
def test_graph_capture_of_augmented_lagrangian_ops(kind, vector_mu):
    m = 1000
    gen = _gen(6)
    data = [torch.randn(m, device="cuda", generator=gen) for _ in range(4)]
    data[2][::7] = float("nan")          # non-finite entries keep lam inside the graph too
    mus = [torch.rand(m if vector_mu else (), device="cuda", generator=gen) + 0.5 for _ in data]

    lam_e = torch.zeros(m, device="cuda")
    mu_e = mus[0].clone()
    eager = []
    for g, mu in zip(data, mus):
        mu_e.copy_(mu)
        term, grad = _al_step(lam_e, g, mu_e, kind)
        eager.append([term.clone(), grad.clone(), lam_e.clone()])

    lam = torch.zeros(m, device="cuda")
    g_static, mu_static = data[0].clone(), mus[0].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                 # warm-up outside the graph, then reset
        _al_step(lam.clone(), g_static, mu_static, kind)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        term_s, grad_s = _al_step(lam, g_static, mu_static, kind)
    lam.zero_()                                   # capture does not execute the kernels
    for k, (g, mu) in enumerate(zip(data, mus)):
        g_static.copy_(g)
        mu_static.copy_(mu)
        graph.replay()
        _assert_bitwise_equal([term_s, grad_s, lam], eager[k], f"replay {k}")
    torch.cuda.synchronize()


# ------------------------------------------------------------------------------ sanitizer subset
def _small_cases():
    g = _gen(7)
    lu, lv = torch.tensor([1, 33, 2, 300]), torch.tensor([4, 1, 130, 257])
    uo = torch.cat([lu.new_zeros(1), lu.cumsum(0)]).cuda()
    vo = torch.cat([lv.new_zeros(1), lv.cumsum(0)]).cuda()
    return g, uo, vo


@pytest.mark.sanitize
def test_sanitize_w2():
    g, uo, vo = _small_cases()
    for dtype in (torch.float32, torch.float64):
        u = torch.randn(int(uo[-1]), device="cuda", generator=g, dtype=dtype).requires_grad_(True)
        v = torch.randn(int(vo[-1]), device="cuda", generator=g, dtype=dtype).requires_grad_(True)
        for ml in (None, 300):
            ee.wasserstein2_1d(u, v, uo, vo, max_seqlen=ml).sum().backward()
        a = torch.randn(3, 50, device="cuda", generator=g, dtype=dtype).requires_grad_(True)
        b = torch.randn(3, 7, device="cuda", generator=g, dtype=dtype)
        ee.wasserstein2_1d(a, b, reduction="mean").backward()
    torch.cuda.synchronize()


@pytest.mark.sanitize
def test_sanitize_projection():
    g = _gen(8)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        for k in (1, 8):
            P = 4099                      # not a multiple of any vector width: tails
            x = torch.randn(P, device="cuda", generator=g).to(dtype).requires_grad_(True)
            basis = torch.randn(k, P, device="cuda", generator=g).to(dtype)
            out, _ = ee.project_orthogonal(x, basis)
            out.sum().backward()
            shapes = [(3, 5), (0,), (1,), (1031,)]
            grads = [torch.randn(s, device="cuda", generator=g).to(dtype) for s in shapes]
            bas = [[torch.randn(s, device="cuda", generator=g).to(dtype) for s in shapes]
                   for _ in range(k)]
            ee.project_orthogonal_(grads, bas)
    torch.cuda.synchronize()


@pytest.mark.sanitize
def test_sanitize_augmented_lagrangian():
    g = _gen(9)
    for dtype in (torch.float32, torch.float64):
        for m in (0, 1, 257):
            lam = torch.randn(m, device="cuda", generator=g, dtype=dtype)
            x = torch.randn(m, device="cuda", generator=g, dtype=dtype).requires_grad_(True)
            for mu in (torch.tensor(2.0, device="cuda", dtype=dtype),
                       torch.rand(m, device="cuda", generator=g, dtype=dtype) + 0.5):
                for kind in ("equality", "inequality"):
                    ee.augmented_lagrangian_term(x, lam, mu, kind=kind).backward()
                    ee.dual_update_(lam, x.detach(), mu, kind=kind, check_finite=False)
                    ee.dual_update_(lam, x.detach(), mu, kind=kind, lam_min=-1.0, lam_max=1.0)
    torch.cuda.synchronize()
