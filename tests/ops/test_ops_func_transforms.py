"""torch.func transforms on the operators: project_orthogonal supports grad / jacrev / vjp /
functional_call + grad / vmap (checked against the float64 reference); wasserstein2_1d's C++
autograd and the registered autograd of augmented_lagrangian_term (AugmentedLagrangian.penalty) do
not, and raise (the documented workaround, torch.autograd.grad per sample, works)."""
import pytest
import torch

import entangle_ext as ee
from entangle_ext import reference as ref

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


def test_wasserstein_func_grad_is_refused_and_autograd_grad_works():
    u, v = torch.randn(6, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="functorch"):
        torch.func.grad(lambda x: ee.wasserstein2_1d(x, v))(u)
    x = u.clone().requires_grad_(True)   # the workaround: torch.autograd.grad per sample
    (gu,) = torch.autograd.grad(ee.wasserstein2_1d(x, v), x)
    (gr,) = torch.autograd.grad(ref.wasserstein2_1d(x, v), x)
    torch.testing.assert_close(gu, gr, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("transform", ["grad", "vjp", "jacrev"])
def test_al_term_func_reverse_transforms_are_refused_and_autograd_grad_works(transform):
    """As documented (augmented_lagrangian_term, README Operators): RuntimeError, never a wrong
    gradient; forward mode (jvp/jacfwd) works, tests/ops/test_fwad.py."""
    lam = torch.tensor([1.0, 2.0], dtype=torch.float64)
    g = torch.tensor([0.5, -1.0], dtype=torch.float64)
    al = ee.AugmentedLagrangian(torch.zeros(2, dtype=torch.float64), mu=3.0)
    al.lam.copy_(lam)
    for fn in (lambda x: ee.augmented_lagrangian_term(x, lam, 3.0), al.penalty):
        with pytest.raises(RuntimeError, match="functorch transforms"):
            if transform == "vjp":
                torch.func.vjp(fn, g)[1](torch.ones((), dtype=torch.float64))
            else:
                getattr(torch.func, transform)(fn)(g)
        x = g.clone().requires_grad_(True)
        (got,) = torch.autograd.grad(fn(x), x)
        torch.testing.assert_close(got, lam + 3.0 * g)
