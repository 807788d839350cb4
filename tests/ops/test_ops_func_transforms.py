"""torch.func transforms on the operators: project_orthogonal supports grad / jacrev / vjp /
functional_call + grad / vmap and second derivatives (checked against the float64 reference);
wasserstein2_1d and augmented_lagrangian_term (AugmentedLagrangian.penalty) support the
first-order ones (grad / vjp / jacrev / functional_call + grad / vmap of grad; they raised
RuntimeError before) and refuse every second derivative with NotImplementedError."""
import pytest
import torch

import entangle_ext as ee
from entangle_ext import reference as ref

D64 = torch.float64

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")


def _data(P=7, k=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(P, generator=gen, dtype=torch.float64),
            torch.randn(k, P, generator=gen, dtype=torch.float64),
            torch.randn(P, generator=gen, dtype=torch.float64))


def test_func_grad_of_projection_is_the_projection():
    g, V, w = _data()
    got = torch.func.grad(lambda x: ee.project_orthogonal(x, V)[0] @ w)(g)
    want, _ = ref.project_orthogonal(w, V)   # the map is symmetric: its VJP is the projection
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_func_jacrev_of_projection_is_the_projector():
    g, V, _ = _data()
    jac = torch.func.jacrev(lambda x: ee.project_orthogonal(x, V)[0])(g)
    eye = torch.eye(g.numel(), dtype=torch.float64)
    want = torch.stack([ref.project_orthogonal(e, V)[0] for e in eye], 1)
    torch.testing.assert_close(jac, want, rtol=1e-12, atol=1e-12)


def test_functional_call_grad_and_vmap_through_projection():
    lin = torch.nn.Linear(3, 2, dtype=torch.float64)
    params = {n: p.detach() for n, p in lin.named_parameters()}
    x = torch.randn(5, 3, dtype=torch.float64)
    V = torch.randn(2, 10, dtype=torch.float64)

    def loss(p, xi):
        out = torch.func.functional_call(lin, p, (xi,))
        return ee.project_orthogonal(out.reshape(-1), V)[0].square().sum()

    def loss_ref(p, xi):
        out = torch.func.functional_call(lin, p, (xi,))
        return ref.project_orthogonal(out.reshape(-1), V)[0].square().sum()

    xs = x.reshape(5, 1, 3).expand(5, 5, 3).contiguous()   # 5 samples of 5 rows each: P = 10
    got = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, xs)
    want = torch.func.vmap(torch.func.grad(loss_ref), in_dims=(None, 0))(params, xs)
    for n in params:
        torch.testing.assert_close(got[n], want[n], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("second", ["hessian", "jacfwd(jacrev)", "jacfwd(jacfwd)", "jacrev(jacfwd)",
                                    "jacrev(jacrev)"])
def test_second_derivatives_of_a_projected_square_are_twice_the_projector(second):
    """d²/dx² |P x|² = 2 PᵀP = 2 P, by every nesting of forward and reverse mode (forward over
    reverse failed inside torch with the generated vmap rule)."""
    g, V, _ = _data()
    f = lambda x: ee.project_orthogonal(x, V)[0].square().sum()
    F = torch.func
    fn = {"hessian": F.hessian(f), "jacfwd(jacrev)": F.jacfwd(F.jacrev(f)), "jacfwd(jacfwd)": F.jacfwd(F.jacfwd(f)),
          "jacrev(jacfwd)": F.jacrev(F.jacfwd(f)), "jacrev(jacrev)": F.jacrev(F.jacrev(f))}[second]
    eye = torch.eye(g.numel(), dtype=torch.float64)
    projector = torch.stack([ref.project_orthogonal(e, V)[0] for e in eye], 1)
    torch.testing.assert_close(fn(g), 2 * projector, rtol=1e-12, atol=1e-12)


def test_vmap_of_the_projection_over_batched_gradients_and_bases():
    """vmap over g, over the basis, or both: each entry projected with its own basis."""
    gen = torch.Generator().manual_seed(3)
    gs = torch.randn(4, 7, generator=gen, dtype=torch.float64)
    Vs = torch.randn(4, 2, 7, generator=gen, dtype=torch.float64)
    proj = lambda x, V: ee.project_orthogonal(x, V)
    for in_dims, args, pairs in (((0, None), (gs, Vs[0]), [(gs[i], Vs[0]) for i in range(4)]),
                                 ((None, 0), (gs[0], Vs), [(gs[0], Vs[i]) for i in range(4)]),
                                 ((0, 0), (gs, Vs), [(gs[i], Vs[i]) for i in range(4)])):
        out, coeffs = torch.func.vmap(proj, in_dims=in_dims)(*args)
        for i, (x, V) in enumerate(pairs):
            want, want_c = ref.project_orthogonal(x, V)
            torch.testing.assert_close(out[i], want, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(coeffs[i], want_c.to(coeffs.dtype), rtol=1e-10, atol=1e-12)


def test_projection_autograd_still_gradchecks():
    g, V, _ = _data(P=5)
    g.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: ee.project_orthogonal(x, V)[0], (g,))
    assert torch.autograd.gradgradcheck(lambda x: ee.project_orthogonal(x, V)[0], (g,))


def _w2_cases():
    gen = torch.Generator().manual_seed(3)
    u, v = torch.randn(7, generator=gen, dtype=D64), torch.randn(5, generator=gen, dtype=D64)
    uo, vo = torch.tensor([0, 3, 7]), torch.tensor([0, 2, 5])
    w = torch.tensor([0.7, -1.3], dtype=D64)   # a weighting of the two segments
    return u, v, (lambda x, y: ee.wasserstein2_1d(x, y, uo, vo) @ w,
                  lambda x, y: ref.wasserstein2_1d(x, y, uo, vo) @ w)


@pytest.mark.parametrize("transform", ["grad", "vjp", "jacrev", "functional_call"])
def test_wasserstein_reverse_transforms_match_the_reference(transform):
    """torch.func reverse mode through W2 (it raised RuntimeError: the C++ autograd cannot run
    under functorch), over u and v at once, against the float64 composite."""
    u, v, (f, f_ref) = _w2_cases()
    if transform == "functional_call":
        lin = torch.nn.Linear(7, 7, dtype=D64)
        params = {n: p.detach() for n, p in lin.named_parameters()}
        got = torch.func.grad(lambda p: f(torch.func.functional_call(lin, p, (u,)), v))(params)
        want = torch.func.grad(lambda p: f_ref(torch.func.functional_call(lin, p, (u,)), v))(params)
    elif transform == "vjp":
        one = torch.ones((), dtype=D64)
        got, want = torch.func.vjp(f, u, v)[1](one), torch.func.vjp(f_ref, u, v)[1](one)
    else:
        got = getattr(torch.func, transform)(f, argnums=(0, 1))(u, v)
        want = getattr(torch.func, transform)(f_ref, argnums=(0, 1))(u, v)
    for n in (got.keys() if isinstance(got, dict) else range(len(got))):
        torch.testing.assert_close(got[n], want[n], rtol=1e-10, atol=1e-12)


def test_wasserstein_per_sample_gradients_by_vmap_of_grad():
    gen = torch.Generator().manual_seed(4)
    U, V = torch.randn(4, 6, generator=gen, dtype=D64), torch.randn(4, 5, generator=gen, dtype=D64)
    got = torch.func.vmap(torch.func.grad(ee.wasserstein2_1d, argnums=(0, 1)))(U, V)
    for i in range(4):
        x, y = U[i].clone().requires_grad_(True), V[i].clone().requires_grad_(True)
        want = torch.autograd.grad(ref.wasserstein2_1d(x, y), (x, y))
        torch.testing.assert_close(got[0][i], want[0], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(got[1][i], want[1], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["equality", "inequality"])
@pytest.mark.parametrize("transform", ["grad", "vjp", "jacrev", "vmap(grad)"])
def test_al_term_reverse_transforms_give_the_closed_form_gradient(transform, kind):
    """torch.func reverse mode through augmented_lagrangian_term and AugmentedLagrangian.penalty
    (both raised RuntimeError): d/dg = lam + mu g (equality), max(0, lam + mu g) (inequality)."""
    lam = torch.tensor([1.0, 2.0, -0.5], dtype=D64)
    g = torch.tensor([0.5, -1.0, 0.1], dtype=D64)
    al = ee.AugmentedLagrangian(torch.zeros(3, dtype=D64), mu=3.0, kind=kind)
    al.lam.copy_(lam)

    def slope(x):
        s = lam + 3.0 * x
        return s.clamp(min=0) if kind == "inequality" else s

    for fn in (lambda x: ee.augmented_lagrangian_term(x, lam, 3.0, kind=kind), al.penalty):
        if transform == "vmap(grad)":
            G = torch.stack([g, -g, 2 * g])
            torch.testing.assert_close(torch.func.vmap(torch.func.grad(fn))(G), torch.stack([slope(x) for x in G]))
            continue
        if transform == "vjp":
            (got,) = torch.func.vjp(fn, g)[1](torch.ones((), dtype=D64))
        else:
            got = getattr(torch.func, transform)(fn)(g)
        torch.testing.assert_close(got, slope(g))


SECOND = ["jacfwd(jacfwd)", "jacrev(jacfwd)", "jacfwd(jacrev)", "jacrev(jacrev)", "hessian"]


@pytest.mark.parametrize("second", SECOND)
@pytest.mark.parametrize("op", ["wasserstein2_1d", "augmented_lagrangian_term"])
def test_second_derivatives_raise_by_every_nesting(op, second):
    """Second derivatives of W2 and the AL term are not implemented: every nesting of forward and
    reverse mode raises NotImplementedError (jacfwd(jacfwd) returned zeros: the tangent rule read
    its saved tensors without their outer tangent)."""
    v = torch.randn(5, dtype=D64)
    lam = torch.tensor([1.0, 2.0], dtype=D64)
    fn = {"wasserstein2_1d": lambda x: ee.wasserstein2_1d(x, v),
          "augmented_lagrangian_term": lambda x: ee.augmented_lagrangian_term(x[:2], lam, 3.0)}[op]
    x = torch.randn(6, dtype=D64)
    if second == "hessian":
        t = torch.func.hessian(fn)
    else:
        outer, inner = second[:-1].split("(")
        t = getattr(torch.func, outer)(getattr(torch.func, inner)(fn))
    with pytest.raises(NotImplementedError, match=f"entangle_ext.{op}: second derivatives"):
        t(x)


def test_reverse_mode_over_a_dual_tangent_raises():
    """autograd.grad of a forward-mode tangent (outside torch.func) is a second derivative too."""
    import torch.autograd.forward_ad as fwAD
    x = torch.randn(6, dtype=D64, requires_grad=True)
    v = torch.randn(5, dtype=D64)
    with fwAD.dual_level():
        t = fwAD.unpack_dual(ee.wasserstein2_1d(fwAD.make_dual(x, torch.ones(6, dtype=D64)), v)).tangent
        with pytest.raises(NotImplementedError, match="second derivatives"):
            torch.autograd.grad(t, x)


def test_a_refused_second_derivative_leaves_torch_func_usable():
    """The dense offsets cache once kept a tensor made under a transform (a wrapper of its level):
    after a refused second derivative, the next torch.func call failed inside functorch
    ("escaped?" internal assertion) instead of computing."""
    from entangle_ext import _wasserstein_args
    _wasserstein_args._OFFSETS_CACHE.clear()
    u, v = torch.randn(9, dtype=D64), torch.randn(8, dtype=D64)   # sizes no other test caches first
    f = lambda x: ee.wasserstein2_1d(x, v)
    with pytest.raises(NotImplementedError):
        torch.func.jacfwd(torch.func.jacfwd(f))(u)
    assert not any(torch._C._functorch.is_functorch_wrapped_tensor(t)
                   for t in _wasserstein_args._OFFSETS_CACHE.values())
    x = u.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(ref.wasserstein2_1d(x, v), x)
    torch.testing.assert_close(torch.func.grad(f)(u), want, rtol=1e-10, atol=1e-12)


def test_penalty_under_grad_records_a_plain_pre_step_g_and_under_vmap_none():
    """update() after penalty() under torch.func: the recorded g is the plain value under grad
    (it was the transform's wrapper, kept beyond its level); under vmap there is no single g and
    update() says so (it failed inside functorch: "your tensor may have escaped")."""
    g = torch.tensor([0.5, -1.0], dtype=D64)
    al = ee.AugmentedLagrangian(torch.zeros(2, dtype=D64), mu=3.0)
    torch.func.grad(al.penalty)(g)
    assert not torch._C._functorch.is_functorch_wrapped_tensor(al._last_g)
    torch.testing.assert_close(al.update(), 3.0 * g)
    torch.func.vmap(torch.func.grad(al.penalty))(torch.stack([g, 2 * g]))
    with pytest.raises(RuntimeError, match=r"penalty\(\) ran under torch.func.vmap"):
        al.update()
    torch.testing.assert_close(al.update(g), 6.0 * g)


def test_vmap_over_mu_and_over_a_float64_g_of_a_float32_state():
    """The host-side value checks (mu > 0 and finite; a float64 g beyond float32) read every batch
    entry's values; under vmap they raised vmap's 'data-dependent control flow' error."""
    gen = torch.Generator().manual_seed(7)
    g, lam = torch.randn(3, generator=gen, dtype=D64), torch.randn(3, generator=gen, dtype=D64)
    mus = torch.rand(4, 3, generator=gen, dtype=D64) + 0.5
    got = torch.func.vmap(lambda m: ee.augmented_lagrangian_term(g, lam, m))(mus)
    torch.testing.assert_close(got, torch.stack([ee.augmented_lagrangian_term(g, lam, m) for m in mus]))
    with pytest.raises(ValueError, match="the penalty mu must be > 0 and finite"):
        torch.func.vmap(lambda m: ee.augmented_lagrangian_term(g, lam, m))(torch.stack([mus[0], -mus[1]]))
    al = ee.AugmentedLagrangian(torch.zeros(3), mu=2.0)
    G = torch.randn(4, 3, generator=gen, dtype=D64)
    torch.testing.assert_close(torch.func.vmap(al.penalty)(G), torch.stack([al.penalty(x) for x in G]))
    with pytest.raises(ValueError, match="beyond the range of the state dtype torch.float32"):
        torch.func.vmap(al.penalty)(torch.stack([G[0], torch.full((3,), 1e300, dtype=D64)]))


def test_vmap_over_offsets_with_a_max_seqlen():
    """Batched offsets with max_seqlen: the host check of the longest segment called .item() on a
    BatchedTensor (vmap's RuntimeError); the kernel's validate pass checks them instead."""
    u, v = torch.randn(10, dtype=D64), torch.randn(8, dtype=D64)
    offs = torch.tensor([[0, 3, 10], [0, 6, 10]])
    got = torch.func.vmap(lambda o: ee.wasserstein2_1d(u, v, o, [0, 4, 8], max_seqlen=10))(offs)
    want = torch.stack([ref.wasserstein2_1d(u, v, o, torch.tensor([0, 4, 8])) for o in offs])
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("op", ["wasserstein2_1d", "augmented_lagrangian_term", "project_orthogonal",
                                "AugmentedLagrangian.penalty"])
def test_functionalize_runs_the_operators(op):
    """torch.func.functionalize has no rule for an autograd.Function ("NYI: Functionalize rule for
    custom_function_call"): the operators run as themselves under it; update() after a
    functionalized penalty uses the plain pre-step g (it failed on the functional wrapper)."""
    g, V = torch.randn(5, dtype=D64), torch.randn(2, 5, dtype=D64)
    al = ee.AugmentedLagrangian(torch.zeros(5, dtype=D64), mu=2.0)
    fn = {"wasserstein2_1d": lambda x: ee.wasserstein2_1d(x, V[0]),
          "augmented_lagrangian_term": lambda x: ee.augmented_lagrangian_term(x, V[0], 2.0),
          "project_orthogonal": lambda x: ee.project_orthogonal(x, V)[0], "AugmentedLagrangian.penalty": al.penalty}[op]
    torch.testing.assert_close(torch.func.functionalize(fn)(g), fn(g))
    if op == "AugmentedLagrangian.penalty":
        torch.func.functionalize(fn)(g)
        torch.testing.assert_close(al.update(), 2.0 * g)


@pytest.mark.parametrize("call", [
    lambda e: torch.func.jacrev(lambda a, b: ee.wasserstein2_1d(a, b, [0], [0]))(e, e),
    lambda e: torch.func.vmap(ee.wasserstein2_1d)(e.reshape(0, 3), e.reshape(0, 3)),
    lambda e: torch.func.vmap(lambda x: ee.augmented_lagrangian_term(x, torch.ones(3, dtype=D64), 2.0))(e.reshape(0, 3)),
    lambda e: torch.func.vmap(lambda x: ee.project_orthogonal(x, torch.ones(1, 3, dtype=D64))[0])(e.reshape(0, 3)),
], ids=["jacrev-of-empty", "vmap-w2", "vmap-al", "vmap-projection"])
def test_vmap_over_zero_entries_is_a_clear_error(call):
    """It was IndexError / 'not enough values to unpack' from inside the per-entry vmap rules."""
    with pytest.raises(ValueError, match=r"torch.func.vmap over a batch of size 0 is not supported"):
        call(torch.zeros(0, dtype=D64))
