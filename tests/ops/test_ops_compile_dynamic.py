"""torch.compile(dynamic=True, fullgraph=True): one graph serves every size (issue 24 item 9).

Each public operator wrapper is compiled once and run on 10 sizes; the values (and, for W2 and the
augmented-Lagrangian term, the gradients) equal eager and Dynamo compiles exactly one frame. With
``fullgraph=True`` a graph break is an error and the 9th size of a per-size specialisation hits
the recompile limit (FailOnRecompileLimitHit), so both show up as failures here. Sizes start at 2:
Dynamo always specialises sizes 0 and 1. Mostly the ``aot_eager`` backend (fast); one test runs
the default inductor backend.
"""
import shutil

import pytest
import torch

import entangle_ext as ee

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")

try:
    import torch._dynamo
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.utils import counters
    _COMPILE = torch.compiler is not None and hasattr(torch, "compile")
    _WHY = ""
except Exception as exc:  # pragma: no cover - depends on the platform
    _COMPILE, _WHY = False, f"torch.compile unavailable: {exc}"

needs_compile = pytest.mark.skipif(not _COMPILE, reason=_WHY or "torch.compile unavailable")
D = torch.float64


def compiled(fn, backend="aot_eager"):
    """fn compiled with dynamic=True, fullgraph=True after a Dynamo reset (and the counters
    cleared), and fn (whose code object holds Dynamo's cache entries, one per compiled graph)."""
    torch._dynamo.reset()
    counters.clear()
    return torch.compile(fn, backend=backend, dynamic=True, fullgraph=True), fn


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def assert_one_graph(fn):
    """One graph for every size: Dynamo holds one cache entry for fn and compiled one unique graph
    (not the backend's call count: Dynamo may restart an analysis, e.g. to tensorify Python
    scalars, and call the backend twice for the one graph)."""
    entries = len(_debug_get_cache_entry_list(fn.__code__))
    graphs = counters["stats"]["unique_graphs"]
    assert (entries, graphs) == (1, 1), (f"{entries} cache entries, {graphs} unique graphs: "
                                         "expected one graph for every size")


# ------------------------------------------------------------------------------ Wasserstein-2
W2_DENSE_SIZES = [(2, 3, 5), (3, 4, 4), (4, 7, 2), (5, 2, 9), (2, 11, 6),
                  (6, 5, 5), (3, 13, 3), (7, 6, 8), (4, 9, 12), (8, 3, 7)]


@needs_compile
@pytest.mark.parametrize("validate", [True, False])
def test_w2_dense_batched_one_graph_for_every_size(validate):
    def f(u, v):
        return ee.wasserstein2_1d(u, v, validate=validate)

    c, src = compiled(f)
    g = gen(1)
    for S, n, m in W2_DENSE_SIZES:
        u, v = torch.randn(S, n, dtype=D, generator=g), torch.randn(S, m, dtype=D, generator=g)
        torch.testing.assert_close(c(u, v), f(u, v))
    assert_one_graph(src)


@needs_compile
def test_w2_dense_1d_and_reductions_one_graph_for_every_size():
    def f(u, v, a, b):
        return (ee.wasserstein2_1d(u, v), ee.wasserstein2_1d(a, b, reduction="mean"),
                ee.wasserstein2_1d(a, b, reduction="sum"))

    c, src = compiled(f)
    g = gen(2)
    for S, n, m in W2_DENSE_SIZES:
        args = (torch.randn(n, dtype=D, generator=g), torch.randn(m, dtype=D, generator=g),
                torch.randn(S, n, dtype=D, generator=g), torch.randn(S, m, dtype=D, generator=g))
        got, want = c(*args), f(*args)
        assert got[0].shape == ()
        torch.testing.assert_close(got, want)
    assert_one_graph(src)


@needs_compile
def test_w2_dense_gradients_equal_eager():
    def f(u, v):
        return (ee.wasserstein2_1d(u, v) * torch.arange(1, u.shape[0] + 1, dtype=D)).sum()

    c, src = compiled(f)
    g = gen(3)
    for S, n, m in W2_DENSE_SIZES:
        u = torch.randn(S, n, dtype=D, generator=g, requires_grad=True)
        v = torch.randn(S, m, dtype=D, generator=g, requires_grad=True)
        got = c(u, v)
        gu, gv = torch.autograd.grad(got, (u, v))
        want = f(u, v)
        wu, wv = torch.autograd.grad(want, (u, v))
        torch.testing.assert_close(got, want)
        torch.testing.assert_close((gu, gv), (wu, wv))
    assert_one_graph(src)


def _offsets(lengths):
    return torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0)


RAGGED = [([2, 3], [4, 2]), ([5, 1, 2], [2, 2, 3]), ([3, 3, 3, 3], [1, 4, 2, 6]),
          ([7, 2], [3, 9]), ([1, 1, 4], [6, 2, 2]), ([4, 5, 6, 2, 3], [2, 2, 2, 2, 2]),
          ([9, 3], [2, 2]), ([2, 2, 2], [8, 1, 5]), ([6, 1, 1, 3], [3, 3, 7, 2]),
          ([10, 4, 2], [5, 5, 5])]


@needs_compile
@pytest.mark.parametrize("validate", [True, False])
def test_w2_ragged_one_graph_for_every_offsets(validate):
    def f(u, v, uo, vo):
        return ee.wasserstein2_1d(u, v, uo, vo, validate=validate)

    c, src = compiled(f)
    g = gen(4)
    for lu, lv in RAGGED:
        uo, vo = _offsets(lu), _offsets(lv)
        u = torch.randn(sum(lu), dtype=D, generator=g, requires_grad=True)
        v = torch.randn(sum(lv), dtype=D, generator=g, requires_grad=True)
        got, want = c(u, v, uo, vo), f(u, v, uo, vo)
        torch.testing.assert_close(got, want)
        w = torch.arange(1.0, len(lu) + 1, dtype=D)
        torch.testing.assert_close(torch.autograd.grad((got * w).sum(), (u, v)),
                                   torch.autograd.grad((want * w).sum(), (u, v)))
    assert_one_graph(src)


@needs_compile
def test_w2_dense_with_max_seqlen_hint_one_graph():
    """A constant max_seqlen hint (>= every length) is kept; it does not specialise the sizes."""
    def f(u, v):
        return ee.wasserstein2_1d(u, v, max_seqlen=64)

    c, src = compiled(f)
    g = gen(5)
    for S, n, m in W2_DENSE_SIZES:
        u, v = torch.randn(S, n, dtype=D, generator=g), torch.randn(S, m, dtype=D, generator=g)
        torch.testing.assert_close(c(u, v), f(u, v))
    assert_one_graph(src)


@needs_compile
@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                    reason="inductor on CPU needs a C++ compiler")
def test_w2_dense_inductor_one_graph_for_every_size():
    def f(u, v):
        return ee.wasserstein2_1d(u, v, reduction="mean") * 2.0

    c, src = compiled(f, backend="inductor")
    g = gen(6)
    for S, n, m in W2_DENSE_SIZES:
        u = torch.randn(S, n, dtype=D, generator=g, requires_grad=True)
        v = torch.randn(S, m, dtype=D, generator=g)
        got, want = c(u, v), f(u, v)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(torch.autograd.grad(got, u), torch.autograd.grad(want, u))
    assert_one_graph(src)


# ------------------------------------------------------------------------------ projection
PROJ_SIZES = [(5, 2), (7, 3), (16, 2), (9, 8), (33, 4), (12, 5), (4, 3), (20, 6), (6, 7), (50, 2)]


@needs_compile
@pytest.mark.parametrize("ridge", [0.0, 1e-3])
def test_project_orthogonal_one_graph_for_every_p_and_k(ridge):
    def f(g, basis, rcond=1e-10):   # ridge from the closure, rcond a default: symbolic floats
        return ee.project_orthogonal(g, basis, ridge=ridge, rcond=rcond)

    c, src = compiled(f)
    gg = gen(7)
    for P, k in PROJ_SIZES:
        g = torch.randn(P, dtype=D, generator=gg, requires_grad=True)
        basis = torch.randn(k, P, dtype=D, generator=gg)
        (out, co), (wout, wco) = c(g, basis), f(g, basis)
        torch.testing.assert_close((out, co), (wout, wco))
        w = torch.randn(P, dtype=D, generator=gg)
        torch.testing.assert_close(torch.autograd.grad((out * w).sum(), g),
                                   torch.autograd.grad((wout * w).sum(), g))
    assert_one_graph(src)


@needs_compile
def test_project_orthogonal_list_basis_one_graph_for_every_p():
    """A basis given as a list of k (P,) tensors: k is the list's length (structure, one graph per
    k); P varies within one graph."""
    def f(g, a, b):
        return ee.project_orthogonal(g, [a, b])

    c, src = compiled(f)
    gg = gen(8)
    for P, _ in PROJ_SIZES:
        args = [torch.randn(P, dtype=D, generator=gg) for _ in range(3)]
        torch.testing.assert_close(c(*args), f(*args))
    assert_one_graph(src)


@needs_compile
def test_project_orthogonal_inplace_one_graph_for_every_size():
    def f(g0, g1, a0, a1, b0, b1):
        return ee.project_orthogonal_([g0, g1], [[a0, a1], [b0, b1]], ridge=1e-6)

    c, src = compiled(f)
    gg = gen(9)
    for P, k in PROJ_SIZES:
        shapes = [(P,), (k, 3)]
        ts = [torch.randn(s, dtype=D, generator=gg) for s in shapes * 3]
        mine = [t.clone() for t in ts]
        co = c(*mine)
        wco = f(*ts)
        torch.testing.assert_close(co, wco)
        torch.testing.assert_close(mine[:2], ts[:2])
    assert_one_graph(src)


@needs_compile
def test_projection_split_ops_one_graph_for_every_size():
    def f(g0, g1, a0, a1, b0, b1):
        G, vg = ee.projection_gram([g0, g1], [[a0, a1], [b0, b1]])
        coeffs = ee.projection_solve(G, vg, shift=1e-9)
        ee.projection_apply_([g0, g1], [[a0, a1], [b0, b1]], coeffs)
        return G, vg, coeffs

    c, src = compiled(f)
    gg = gen(10)
    for P, k in PROJ_SIZES:
        shapes = [(P,), (3, k)]
        ts = [torch.randn(s, dtype=D, generator=gg) for s in shapes * 3]
        mine = [t.clone() for t in ts]
        torch.testing.assert_close(c(*mine), f(*ts))
        torch.testing.assert_close(mine[:2], ts[:2])
    assert_one_graph(src)


@needs_compile
def test_projection_solve_one_graph_for_every_k():
    def f(G, vg):
        return ee.projection_solve(G, vg, rcond=1e-9)

    c, src = compiled(f)
    gg = gen(11)
    for k in [2, 3, 4, 5, 6, 7, 8, 3, 5, 2]:
        A = torch.randn(k, k + 3, dtype=D, generator=gg)
        G, vg = A @ A.T, torch.randn(k, dtype=D, generator=gg)
        torch.testing.assert_close(c(G, vg), f(G, vg))
    assert_one_graph(src)


# ------------------------------------------------------------------------------ augmented Lagrangian
AL_SIZES = [2, 3, 5, 8, 13, 4, 21, 6, 34, 7]


@needs_compile
@pytest.mark.parametrize("kind", ["equality", "inequality"])
@pytest.mark.parametrize("mu_kind", ["float", "scalar_tensor", "vector"])
# a Python float mu is an argument that changes with the size: a symbolic float under dynamic=True
def test_augmented_lagrangian_term_one_graph_and_gradients(kind, mu_kind):
    def f(g, lam, mu):
        return ee.augmented_lagrangian_term(g, lam, mu, kind=kind)

    c, src = compiled(f)
    gg = gen(12)
    for m in AL_SIZES:
        g = torch.randn(m, dtype=D, generator=gg, requires_grad=True)
        lam = torch.randn(m, dtype=D, generator=gg).abs()
        mu = {"float": 0.5 + m / 10, "scalar_tensor": torch.tensor(1.5, dtype=D),
              "vector": torch.rand(m, dtype=D, generator=gg) + 0.5}[mu_kind]
        got, want = c(g, lam, mu), f(g, lam, mu)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(torch.autograd.grad(got, g), torch.autograd.grad(want, g))
    assert_one_graph(src)


@needs_compile
@pytest.mark.parametrize("kind", ["equality", "inequality"])
@pytest.mark.parametrize("mu_kind", ["vector", "float"])
def test_dual_update_one_graph_for_every_size(kind, mu_kind):
    def f(lam, g, mu, lo=-4.0, hi=4.0, damping=0.1):   # defaults and arguments: symbolic floats
        return ee.dual_update_(lam, g, mu, kind=kind, lam_min=lo, lam_max=hi, damping=damping)

    c, src = compiled(f)
    gg = gen(13)
    for m in AL_SIZES:
        lam, g = torch.randn(m, dtype=D, generator=gg), torch.randn(m, dtype=D, generator=gg)
        mu = torch.rand(m, dtype=D, generator=gg) + 0.5 if mu_kind == "vector" else 0.5 + m / 10
        mine, want = lam.clone(), lam.clone()
        c(mine, g, mu, -4.0, 4.0, 0.1)
        torch.testing.assert_close(mine, f(want, g, mu))
    assert_one_graph(src)


@needs_compile
def test_augmented_lagrangian_class_penalty_one_graph_for_every_size():
    def f(al, values):
        return al.penalty(al.constraint(values))

    c, src = compiled(f)
    gg = gen(14)
    for m in AL_SIZES:
        al = ee.AugmentedLagrangian(torch.rand(m, dtype=D, generator=gg), mu=3.0)
        al.lam.copy_(torch.randn(m, dtype=D, generator=gg))
        x = torch.rand(m, dtype=D, generator=gg, requires_grad=True)
        got, want = c(al, x), f(al, x)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(torch.autograd.grad(got, x), torch.autograd.grad(want, x))
    assert_one_graph(src)


# ------------------------------------------------------------------------------ eager checks stay
def test_eager_checks_still_raise():
    with pytest.raises(ValueError, match="ridge must be finite"):
        ee.project_orthogonal(torch.zeros(3, dtype=D), torch.ones(1, 3, dtype=D), ridge=float("nan"))
    with pytest.raises(ValueError, match="ridge must be finite"):
        ee.project_orthogonal(torch.zeros(3, dtype=D), torch.ones(1, 3, dtype=D), ridge=float("inf"))
    with pytest.raises(ValueError, match="max_seqlen=2"):
        ee.wasserstein2_1d(torch.zeros(2, 3, dtype=D), torch.zeros(2, 3, dtype=D), max_seqlen=2)
    with pytest.raises(ValueError, match="lam_min is NaN"):
        ee.dual_update_(torch.zeros(2, dtype=D), torch.zeros(2, dtype=D), 1.0, lam_min=float("nan"))
    with pytest.raises(ValueError, match="mu must be"):
        ee.augmented_lagrangian_term(torch.zeros(2, dtype=D), torch.zeros(2, dtype=D), float("inf"))


@needs_compile
def test_w2_and_al_compile_inside_an_open_dual_level():
    """The forward-AD dispatch (`_fwad.has_tangent`) is traced too: inside an open dual level,
    with inputs that carry no tangent, the compiled call takes the operator and one graph."""
    import torch.autograd.forward_ad as fwAD

    def f(u, v, g, lam):
        return ee.wasserstein2_1d(u, v), ee.augmented_lagrangian_term(g, lam, 2.0)

    c, src = compiled(f)
    gg = gen(15)
    with fwAD.dual_level():
        for S, n, m in W2_DENSE_SIZES:
            args = (torch.randn(S, n, dtype=D, generator=gg), torch.randn(S, m, dtype=D, generator=gg),
                    torch.randn(n, dtype=D, generator=gg), torch.randn(n, dtype=D, generator=gg))
            torch.testing.assert_close(c(*args), f(*args))
    assert_one_graph(src)
