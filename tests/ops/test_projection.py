"""Tests of entangle_ext.project_orthogonal / project_orthogonal_ against float64 oracles and the
defining properties of an orthogonal projection (docs/algorithm.md §5, Prop. 4.1)."""
import pytest
import torch
from hypothesis import given, strategies as st

import entangle_ext as ee
from entangle_ext import reference as ref

from _support import DEVICES

from _tiny import flat_of, make_lists, rand

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")

D = torch.float64


def lstsq_oracle(g, V):
    """out = g - V^T c with c the minimum-norm least-squares solution of V^T c ~ g (float64)."""
    g, V = g.double(), V.double()
    c = torch.linalg.lstsq(V.T, g[:, None], driver="gelsd").solution[:, 0]
    return g - V.T @ c


# ------------------------------------------------------------------------------ flat op: properties
@given(k=st.integers(1, 8), P=st.integers(9, 300), seed=st.integers(0, 2**31 - 1))
def test_flat_matches_oracles(k, P, seed):
    gen = torch.Generator().manual_seed(seed)
    g, V = rand(P, gen), rand((k, P), gen)
    for dev in DEVICES:
        out, c = ee.project_orthogonal(g.to(dev), V.to(dev))
        assert out.dtype == D and c.dtype == D and c.shape == (k,) and out.shape == (P,)
        out, c = out.cpu(), c.cpu()
        torch.testing.assert_close(out, lstsq_oracle(g, V), rtol=1e-9, atol=1e-9 * g.norm().item())
        want_out, want_c = ref.project_orthogonal(g, V)
        torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-10 * g.norm().item())
        torch.testing.assert_close(c, want_c, rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(out, g - V.T @ c, rtol=0, atol=1e-12 * g.norm().item())


@given(k=st.integers(1, 8), P=st.integers(16, 400), seed=st.integers(0, 2**31 - 1),
       dtype=st.sampled_from([torch.float32, torch.float64]))
def test_projection_properties(k, P, seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    g, V = rand(P, gen, dtype), rand((k, P), gen) * 10.0 ** torch.randint(-3, 4, (k, 1), generator=gen).double()
    V = V.to(dtype)
    eps = 1e-12 if dtype == D else 1e-5
    out, _ = ee.project_orthogonal(g, V)
    gn = g.double().norm()
    Vn = V.double() / V.double().norm(dim=1, keepdim=True)
    # V out ~ 0 relative to ||g|| (rows normalised)
    assert (Vn @ out.double()).abs().max() <= eps * gn
    # ||out|| <= ||g||
    assert out.double().norm() <= gn * (1 + eps)
    # idempotence
    out2, c2 = ee.project_orthogonal(out, V)
    assert (out2.double() - out.double()).abs().max() <= eps * gn
    # out = g when g is orthogonal to V
    if k < P - 1:
        out3, c3 = ee.project_orthogonal(out, V)
        torch.testing.assert_close(out3, out, rtol=0, atol=eps * gn.item())
        assert c3.abs().max() <= eps * gn / V.double().norm(dim=1).min()


def test_known_values():
    g = torch.tensor([3.0, 4.0, 5.0], dtype=D)
    out, c = ee.project_orthogonal(g, torch.tensor([[2.0, 0.0, 0.0]], dtype=D))
    torch.testing.assert_close(out, torch.tensor([0.0, 4.0, 5.0], dtype=D))
    torch.testing.assert_close(c, torch.tensor([1.5], dtype=D))
    out, c = ee.project_orthogonal(g, [torch.tensor([1.0, 1.0, 0.0], dtype=D),
                                       torch.tensor([1.0, -1.0, 0.0], dtype=D)])
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, 5.0], dtype=D))
    torch.testing.assert_close(c, torch.tensor([3.5, -0.5], dtype=D))


# ------------------------------------------------------------------------------ degenerate bases
@given(P=st.integers(8, 200), seed=st.integers(0, 2**31 - 1), k=st.integers(1, 4),
       dup=st.integers(1, 3), zeros=st.integers(0, 2))
def test_duplicate_and_zero_rows_invariance(P, seed, k, dup, zeros):
    gen = torch.Generator().manual_seed(seed)
    g, V = rand(P, gen), rand((k, P), gen)
    base, cb = ee.project_orthogonal(g, V)
    scale = torch.tensor([(-2.0) ** j for j in range(dup)], dtype=D)
    rows = [V] + [V[:1] * s for s in scale] + [torch.zeros(1, P, dtype=D)] * zeros
    W = torch.cat(rows)[:8]
    out, c = ee.project_orthogonal(g, W)
    assert torch.isfinite(out).all() and torch.isfinite(c).all()
    torch.testing.assert_close(out, base, rtol=0, atol=1e-10 * g.norm().item())
    assert (c[k + dup:] == 0).all()  # zero rows get zero coefficients


def test_all_zero_basis_is_identity():
    g = torch.randn(50, dtype=D)
    out, c = ee.project_orthogonal(g, torch.zeros(3, 50, dtype=D))
    assert torch.equal(out, g) and torch.equal(c, torch.zeros(3, dtype=D))


@pytest.mark.parametrize("delta", [0.0, 1e-15, 1e-12, 1e-9, 1e-6, 1e-3])
def test_near_collinear_rows_never_blow_up(delta):
    gen = torch.Generator().manual_seed(11)
    P = 1000
    g, a, w = rand(P, gen), rand(P, gen), rand(P, gen)
    V = torch.stack([a, a + delta * a.norm() / w.norm() * w])
    for dtype in (torch.float32, torch.float64):
        out, c = ee.project_orthogonal(g.to(dtype), V.to(dtype))
        assert torch.isfinite(out).all() and torch.isfinite(c).all()
        od = out.double()
        assert od.norm() <= g.norm() * (1 + 1e-5)  # never an amplified update
        # out is orthogonal to a (the common direction) in every case
        assert (a @ od).abs() <= 1e-5 * a.norm() * g.norm()
        # the remaining component is orthogonal to span(V) when it is kept, or to a when dropped
        want_out, _ = ref.project_orthogonal(g, V.to(dtype).double())
        torch.testing.assert_close(od, want_out, rtol=0, atol=(1e-4 if dtype == torch.float32 else 1e-9) * g.norm().item())


def test_scale_invariance_of_rows():
    gen = torch.Generator().manual_seed(3)
    g, V = rand(300, gen), rand((3, 300), gen)
    out, c = ee.project_orthogonal(g, V)
    s = torch.tensor([1e-30, 1.0, 1e30], dtype=D)
    out2, c2 = ee.project_orthogonal(g, V * s[:, None])
    torch.testing.assert_close(out2, out, rtol=0, atol=1e-12 * g.norm().item())
    torch.testing.assert_close(c2 * s, c)


# ------------------------------------------------------------------------------ multi-tensor op
SHAPES = [(3, 4), (0,), (1,), (40000,), (7, 11, 2), (70000,), (2, 0, 3), (5,)]


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_multi_tensor_equals_flat_on_concatenation(device, k):
    gen = torch.Generator().manual_seed(k)
    grads, basis = make_lists(SHAPES, k, gen, device=device)  # includes > one 16K/32K chunk
    g = flat_of(grads)
    V = torch.stack([flat_of(r) for r in basis])
    want_out, want_c = ee.project_orthogonal(g, V)
    c = ee.project_orthogonal_(grads, basis)
    assert c.shape == (k,) and c.dtype == D and c.device == g.device
    torch.testing.assert_close(c, want_c, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(flat_of(grads), want_out, rtol=0, atol=1e-10 * g.norm().item())
    for x, s in zip(grads, SHAPES):
        assert x.shape == s
    ref_out, ref_c = ref.project_orthogonal(g.cpu(), V.cpu())
    torch.testing.assert_close(flat_of(grads).cpu(), ref_out, rtol=0, atol=1e-10 * g.norm().item())


@given(sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=6), k=st.integers(1, 8),
       seed=st.integers(0, 2**31 - 1))
def test_multi_tensor_matches_reference_inplace(sizes, k, seed):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(n,) for n in sizes]
    grads, basis = make_lists(shapes, k, gen)
    g2 = [x.clone() for x in grads]
    c = ee.project_orthogonal_(grads, basis)
    c2 = ref.project_orthogonal_(g2, basis)
    tol = 1e-10 * max(flat_of(g2).norm().item(), 1.0)
    for a, b in zip(grads, g2):
        torch.testing.assert_close(a, b, rtol=0, atol=tol)
    if sum(sizes) > 0:
        torch.testing.assert_close(c, c2, rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_low_precision_dtypes(device, dtype, tol):
    gen = torch.Generator().manual_seed(7)
    grads, basis = make_lists([(300,), (20, 30), (0,)], 3, gen, dtype=dtype, device=device)
    g = flat_of(grads).double().cpu()
    V = torch.stack([flat_of(r) for r in basis]).double().cpu()
    want, _ = ref.project_orthogonal(g, V)  # float64 on the rounded inputs
    c = ee.project_orthogonal_(grads, basis)
    assert all(x.dtype == dtype for x in grads)
    got = flat_of(grads).double().cpu()
    assert (got - want).abs().max() <= tol * g.norm()
    Vn = V / V.norm(dim=1, keepdim=True)
    assert (Vn @ got).abs().max() <= 4 * tol * g.norm()


def test_projection_is_deterministic(device):
    gen = torch.Generator().manual_seed(8)
    grads, basis = make_lists([(100000,), (33,)], 4, gen, dtype=torch.float32, device=device)
    a = [x.clone() for x in grads]
    b = [x.clone() for x in grads]
    ca = ee.project_orthogonal_(a, basis)
    cb = ee.project_orthogonal_(b, basis)
    assert torch.equal(ca, cb) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_cpu_result_independent_of_thread_count():
    gen = torch.Generator().manual_seed(14)
    grads, basis = make_lists([(200000,), (7, 9), (65537,)], 3, gen, dtype=torch.float32)
    old = torch.get_num_threads()
    res = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            work = [x.clone() for x in grads]
            res.append((ee.project_orthogonal_(work, basis), work))
    finally:
        torch.set_num_threads(old)
    assert torch.equal(res[0][0], res[1][0])
    assert all(torch.equal(a, b) for a, b in zip(res[0][1], res[1][1]))


# ------------------------------------------------------------------------------ autograd / opcheck
@pytest.mark.parametrize("k", [1, 3])
def test_gradcheck(device, k):
    gen = torch.Generator().manual_seed(9)
    g = rand(12, gen).to(device).requires_grad_(True)
    V = rand((k, 12), gen).to(device)
    assert torch.autograd.gradcheck(lambda x: ee.project_orthogonal(x, V)[0], (g,))
    assert torch.autograd.gradgradcheck(lambda x: ee.project_orthogonal(x, V)[0], (g,))


def test_backward_is_projection_and_basis_gets_no_grad():
    gen = torch.Generator().manual_seed(10)
    g = rand(40, gen).requires_grad_(True)
    V = rand((2, 40), gen).requires_grad_(True)
    out, c = ee.project_orthogonal(g, V)
    assert not c.requires_grad
    w = rand(40, gen)
    (out * w).sum().backward()
    torch.testing.assert_close(g.grad, ee.project_orthogonal(w, V.detach())[0])
    assert V.grad is None


def test_opcheck():
    gen = torch.Generator().manual_seed(12)
    g, V = rand(37, gen), rand((3, 37), gen)
    op = torch.ops.entangle_ext.project_orthogonal.default
    for args in [(g, V, 1e-7), (g.float(), V.float(), 1e-6), (g.clone().requires_grad_(True), V, 1e-7)]:
        torch.library.opcheck(op, args)
    grads = [rand((4, 5), gen), rand((0,), gen), rand((9,), gen)]
    basis = [rand((4, 5), gen), rand((0,), gen), rand((9,), gen),
             rand((4, 5), gen), rand((0,), gen), rand((9,), gen)]
    torch.library.opcheck(torch.ops.entangle_ext.project_orthogonal_.default, (grads, basis, 1e-7))


# ------------------------------------------------------------------------------ errors
def test_flat_errors():
    g, V = torch.randn(10), torch.randn(2, 10)
    with pytest.raises(ValueError, match="1-D"):
        ee.project_orthogonal(g.reshape(2, 5), V)
    with pytest.raises(ValueError, match="k must be in"):
        ee.project_orthogonal(g, torch.randn(9, 10))
    with pytest.raises(ValueError, match="k must be in"):
        ee.project_orthogonal(g, torch.randn(0, 10))
    with pytest.raises(ValueError, match="k must be in"):
        ee.project_orthogonal(g, [])
    with pytest.raises(ValueError, match="expected"):
        ee.project_orthogonal(g, torch.randn(2, 11))
    with pytest.raises(ValueError, match="shape"):
        ee.project_orthogonal(g, [torch.randn(10), torch.randn(9)])
    with pytest.raises(TypeError, match="basis is"):
        ee.project_orthogonal(g, V.double())
    with pytest.raises(TypeError, match="float32, float64"):
        ee.project_orthogonal(torch.arange(10), torch.arange(20).reshape(2, 10))
    with pytest.raises(ValueError, match="contiguous"):
        ee.project_orthogonal(torch.randn(20)[::2], V)
    with pytest.raises(ValueError, match="contiguous"):
        ee.project_orthogonal(g, torch.randn(10, 2).T)
    with pytest.raises(ValueError, match="rcond"):
        ee.project_orthogonal(g, V, rcond=0.0)
    with pytest.raises(ValueError, match="rcond"):
        ee.project_orthogonal(g, V, rcond=float("nan"))
    with pytest.raises(TypeError, match="torch.Tensor"):
        ee.project_orthogonal([1.0, 2.0], V)
    with pytest.raises(TypeError, match="basis"):
        ee.project_orthogonal(g, "V")


def test_inplace_errors():
    op = ee.project_orthogonal_
    a, b = torch.randn(3, 4), torch.randn(5)
    a0, b0 = a.clone(), b.clone()    # basis entries must not alias the gradients
    with pytest.raises(ValueError, match="non-empty"):
        op([], [[]])
    with pytest.raises(ValueError, match="k must be in"):
        op([a, b], [])
    with pytest.raises(ValueError, match="k must be in"):
        op([a, b], [[a, b]] * 9)
    with pytest.raises(ValueError, match="has 1 tensors"):
        op([a, b], [[a]])
    with pytest.raises(ValueError, match="shape"):
        op([a, b], [[b0, a0]])
    with pytest.raises(TypeError, match=r"is torch.float64 but grads are torch.float32"):
        op([a, b], [[a.double(), b0]])
    with pytest.raises(TypeError, match="one dtype"):
        op([a, b.double()], [[a0, b.double()]])
    with pytest.raises(ValueError, match="contiguous"):
        op([a.T, b], [[a.T.contiguous(), b0]])
    with pytest.raises(ValueError, match="contiguous"):
        op([a, b], [[a.T.contiguous().T, b0]])
    with pytest.raises(TypeError, match="float32, float64"):
        op([a.long()], [[a.long()]])
    with pytest.raises(ValueError, match="require grad"):
        op([a.clone().requires_grad_(True)], [[a]])
    with pytest.raises(TypeError, match="list or tuple"):
        op(a, [[a]])
    with pytest.raises(TypeError, match="list of 2 tensors"):
        op([a, b], [a])
    with pytest.raises(ValueError, match="rcond"):
        op([a], [[a]], rcond=1.5)
    # the raw op validates too (no Python wrapper)
    raw = torch.ops.entangle_ext.project_orthogonal_
    with pytest.raises(ValueError, match="k \\* 2 tensors"):
        raw([a, b], [a, b, a], 1e-7)
    with pytest.raises(ValueError, match="non-empty"):
        raw([], [a], 1e-7)
    with pytest.raises(ValueError, match="k must be in"):
        raw([b], [b] * 9, 1e-7)
    # nothing was modified by the failed calls
    assert torch.equal(a, a0) and torch.equal(b, b0)


def test_inplace_under_no_grad_with_params():
    p = torch.nn.Parameter(torch.randn(6, dtype=D))
    v = torch.randn(6, dtype=D)
    with torch.no_grad():
        want, _ = ref.project_orthogonal(p.detach().clone(), v[None])
        ee.project_orthogonal_([p], [[v]])
    torch.testing.assert_close(p.detach(), want)


def test_cpu_only_build_names_the_fix(monkeypatch):
    from types import SimpleNamespace
    from entangle_ext import _ext
    monkeypatch.setattr(_ext, "cuda_built", lambda: False)
    with pytest.raises(RuntimeError, match="FORCE_CUDA=1"):
        _ext.require("project_orthogonal_", SimpleNamespace(device=torch.device("cuda", 0)))


def test_baselines_agree_with_reference():
    gen = torch.Generator().manual_seed(13)
    shapes = [(30, 3), (0,), (200,)]
    grads, basis = make_lists(shapes, 3, gen)
    want = [x.clone() for x in grads]
    ref.project_orthogonal_(want, basis)
    for fn in (ref.project_orthogonal_flat_composite, ref.project_orthogonal_loop):
        got = [x.clone() for x in grads]
        fn(got, basis)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_kernels_registered_for_every_built_backend():
    for op in ("entangle_ext::project_orthogonal", "entangle_ext::project_orthogonal_",
               "entangle_ext::projection_gram", "entangle_ext::projection_apply_",
               "entangle_ext::projection_solve"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CPU")
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA") == ee.cuda_built()
