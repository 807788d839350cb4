"""Tests of the augmented-Lagrangian operators (dual_update_, augmented_lagrangian_term) against
float64 formulas (entangle_ext.reference.augmented_lagrangian). The class entangle_ext.AugmentedLagrangian
is tested in test_lagrangian.py; cross-op CUDA contracts in test_cuda_contracts.py."""
import pytest
import torch
from hypothesis import given, strategies as st

import entangle_ext as ee
from entangle_ext import reference as ref

from _support import DEVICES

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")

KINDS = ["equality", "inequality"]


def draw_inputs(seed, m, dtype=torch.float64, vector_mu=False):
    gen = torch.Generator().manual_seed(seed)
    lam = torch.randn(m, generator=gen, dtype=torch.float64) * 2
    g = torch.randn(m, generator=gen, dtype=torch.float64)
    if vector_mu:
        mu = torch.rand(m, generator=gen, dtype=torch.float64) * 20 + 0.1
    else:
        mu = torch.rand((), generator=gen, dtype=torch.float64) * 20 + 0.1
    return lam.to(dtype), g.to(dtype), mu.to(dtype)


# ------------------------------------------------------------------------------ dual_update_
@given(seed=st.integers(0, 2**31 - 1), m=st.integers(1, 33), kind=st.sampled_from(KINDS),
       vector_mu=st.booleans(), damping=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
       lam_min=st.sampled_from([None, -1.0, 0.5]), lam_max=st.sampled_from([None, 1.0, 3.0]),
       dtype=st.sampled_from([torch.float32, torch.float64]))
def test_dual_update_matches_float64_formula(seed, m, kind, vector_mu, damping, lam_min, lam_max,
                                            dtype):
    lam, g, mu = draw_inputs(seed, m, dtype, vector_mu)
    want = ref.dual_update_(lam.double().clone(), g.double(), mu.double(), kind=kind,
                            lam_min=lam_min, lam_max=lam_max, damping=damping)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for dev in DEVICES:
        got = lam.to(dev).clone()
        out = ee.dual_update_(got, g.to(dev), mu.to(dev), kind=kind, lam_min=lam_min,
                              lam_max=lam_max, damping=damping)
        assert out is got and got.dtype == dtype
        torch.testing.assert_close(got.cpu().double(), want, rtol=tol, atol=tol)
    if kind == "inequality":
        assert (want >= (0.0 if lam_min is None else min(lam_min, 0.0))).all()


def test_dual_update_known_values():
    lam = torch.tensor([0.0, 1.0, -2.0], dtype=torch.float64)
    ee.dual_update_(lam, torch.tensor([0.5, -1.0, 0.1], dtype=torch.float64), 10.0)
    assert lam.tolist() == [5.0, -9.0, -1.0]
    lam = torch.tensor([0.0, 1.0, 3.0], dtype=torch.float64)
    ee.dual_update_(lam, torch.tensor([0.5, -1.0, -0.1], dtype=torch.float64), 10.0,
                    kind="inequality")
    assert lam.tolist() == [5.0, 0.0, 2.0]
    lam = torch.tensor([4.0], dtype=torch.float64)  # damping 0.5, clip to 2.5
    ee.dual_update_(lam, torch.tensor(0.2, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64),
                    damping=0.5, lam_max=2.5)
    assert lam.tolist() == [2.2]
    ee.dual_update_(lam, torch.tensor([1.0], dtype=torch.float64), 1.0, lam_max=2.5)
    assert lam.tolist() == [2.5]
    ee.dual_update_(lam, torch.tensor([-9.0], dtype=torch.float64), 1.0, lam_min=-3.0)
    assert lam.tolist() == [-3.0]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_g_raises_and_leaves_lam_unchanged(device, bad):
    lam = torch.tensor([1.0, 2.0, 3.0], device=device)
    before = lam.clone()
    g = torch.tensor([0.1, bad, 0.3], device=device)
    with pytest.raises(ValueError, match="non-finite"):
        ee.dual_update_(lam, g, 10.0)
    torch.testing.assert_close(lam, before, rtol=0, atol=0)
    with pytest.raises(ValueError, match="non-finite"):
        ee.dual_update_(lam, torch.zeros(3, device=device), torch.tensor(bad, device=device))
    torch.testing.assert_close(lam, before, rtol=0, atol=0)
    # check_finite=False: the bad entry keeps its multiplier, the others are updated.
    ee.dual_update_(lam, g, 10.0, check_finite=False)
    torch.testing.assert_close(lam.cpu(), torch.tensor([2.0, 2.0, 6.0]), rtol=0, atol=0)
    mu = torch.tensor([1.0, 1.0, bad], device=device)
    ee.dual_update_(lam, torch.ones(3, device=device), mu, check_finite=False)
    torch.testing.assert_close(lam.cpu(), torch.tensor([3.0, 3.0, 6.0]), rtol=0, atol=0)
    # the reference follows the same rule
    r = ref.dual_update_(torch.tensor([1.0, 2.0, 3.0]), g.cpu(), 10.0)
    torch.testing.assert_close(r, torch.tensor([2.0, 2.0, 6.0]))


def test_dual_update_errors():
    lam = torch.zeros(3)
    g = torch.zeros(3)
    with pytest.raises(ValueError, match="shape"):
        ee.dual_update_(lam, torch.zeros(4), 1.0)
    with pytest.raises(ValueError, match="shape"):
        ee.dual_update_(lam, g, torch.ones(2))
    with pytest.raises(ValueError, match="shape"):
        ee.dual_update_(lam, g, torch.ones(3, 1))
    with pytest.raises(ValueError, match="dimension"):
        ee.dual_update_(torch.zeros(3, 1), g, 1.0)
    with pytest.raises(TypeError, match="same dtype"):
        ee.dual_update_(lam, g.double(), 1.0)
    with pytest.raises(TypeError, match="same dtype"):
        ee.dual_update_(lam, g, torch.tensor(1.0, dtype=torch.float64))
    with pytest.raises(TypeError, match="float32 or float64"):
        ee.dual_update_(lam.half(), g.half(), 1.0)
    with pytest.raises(TypeError, match="torch.Tensor"):
        ee.dual_update_(lam, [0.0, 0.0, 0.0], 1.0)
    with pytest.raises(TypeError, match="mu"):
        ee.dual_update_(lam, g, "10")
    with pytest.raises(ValueError, match="kind"):
        ee.dual_update_(lam, g, 1.0, kind="eq")
    with pytest.raises(ValueError, match="kind"):
        torch.ops.entangle_ext.dual_update_(lam, g, torch.ones(()), "eq", None, None, 0.0, True)
    with pytest.raises(ValueError, match="damping"):
        ee.dual_update_(lam, g, 1.0, damping=1.5)
    with pytest.raises(ValueError, match="lam_min"):
        ee.dual_update_(lam, g, 1.0, lam_min=2.0, lam_max=1.0)
    with pytest.raises(ValueError, match="lam_max"):
        ee.dual_update_(lam, g, 1.0, kind="inequality", lam_max=-1.0)
    with pytest.raises(ValueError, match="contiguous"):
        ee.dual_update_(torch.zeros(3, 2)[:, 0], g, 1.0)
    with pytest.raises(RuntimeError, match="requires grad"):
        ee.dual_update_(torch.zeros(3, requires_grad=True), g, 1.0)
    with pytest.raises(ValueError, match="is on"):  # device mismatch (CUDA variant below)
        ee.dual_update_(lam, torch.zeros(3, device="meta"), 1.0)
    with pytest.raises(ValueError, match="is on"):
        ee.dual_update_(lam, g, torch.ones((), device="meta"))
    assert (lam == 0).all()


# ------------------------------------------------------------------------------ AL term
@given(seed=st.integers(0, 2**31 - 1), m=st.integers(1, 33), kind=st.sampled_from(KINDS),
       vector_mu=st.booleans(), scale=st.sampled_from([1e-3, 1.0, 5.0]))
def test_al_term_and_gradient_match_float64_formula(seed, m, kind, vector_mu, scale):
    lam, g, mu = draw_inputs(seed, m, torch.float64, vector_mu)
    g = g * scale
    rg = g.clone().requires_grad_(True)
    want = ref.augmented_lagrangian_term(rg, lam, mu, kind=kind)
    (want_grad,) = torch.autograd.grad(want, rg)
    closed = lam + mu * g if kind == "equality" else (lam + mu * g).clamp_min(0)
    torch.testing.assert_close(want_grad, closed, rtol=1e-12, atol=1e-12)
    # the reference evaluates the inequality term piecewise; here (mu >= 0.1) the textbook form
    # (max(0, lam + mu g)^2 - lam^2) / (2 mu) is accurate, and an independent check of it
    textbook = (lam * g + 0.5 * mu * g * g).sum() if kind == "equality" else \
        (((lam + mu * g).clamp_min(0) ** 2 - lam ** 2) / (2 * mu)).sum()
    torch.testing.assert_close(want.detach(), textbook, rtol=1e-9, atol=1e-9)
    for dev in DEVICES:
        a = g.to(dev).clone().requires_grad_(True)
        got = ee.augmented_lagrangian_term(a, lam.to(dev), mu.to(dev), kind=kind)
        assert got.shape == () and got.dtype == torch.float64
        torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-10, atol=1e-10)
        (gg,) = torch.autograd.grad(3.0 * got, a)
        torch.testing.assert_close(gg.cpu(), 3.0 * closed, rtol=1e-12, atol=1e-12)
        # float32 path
        a32 = g.float().to(dev).requires_grad_(True)
        got32 = ee.augmented_lagrangian_term(a32, lam.float().to(dev), mu.float().to(dev), kind=kind)
        got32.backward()
        torch.testing.assert_close(got32.cpu().double(), want.detach(), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(a32.grad.cpu().double(), closed, rtol=1e-4, atol=1e-4)


def test_al_term_known_values():
    lam = torch.tensor([1.0, 2.0], dtype=torch.float64)
    g = torch.tensor([0.5, -1.0], dtype=torch.float64)
    # equality: 1*0.5 + 2*(-1) + 10/2*(0.25 + 1) = -1.5 + 6.25
    assert ee.augmented_lagrangian_term(g, lam, 10.0).item() == pytest.approx(4.75, rel=1e-14)
    # inequality: entry 0 active (1 + 5 > 0): 0.5 + 1.25; entry 1 inactive (2 - 10 < 0): -4/20
    got = ee.augmented_lagrangian_term(g, lam, 10.0, kind="inequality").item()
    assert got == pytest.approx(1.75 - 0.2, rel=1e-14)
    # lam = 0, satisfied inequality: no penalty, no gradient
    z = torch.tensor([-1.0], dtype=torch.float64, requires_grad=True)
    t = ee.augmented_lagrangian_term(z, torch.zeros(1, dtype=torch.float64), 10.0, kind="inequality")
    t.backward()
    assert t.item() == 0.0 and z.grad.item() == 0.0
    # a 0-d g is accepted for m = 1
    s = ee.augmented_lagrangian_term(torch.tensor(0.5), torch.tensor([1.0]), torch.tensor(2.0))
    assert s.item() == pytest.approx(0.75)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_zero_constraints_keep_the_graph(device, kind, dtype):
    """m = 0 is valid for the operators: the term is 0 and stays connected to the graph (an empty
    gradient, like torch.sum of an empty tensor), and the dual update is a no-op."""
    lam = torch.zeros(0, dtype=dtype, device=device)
    for mu in (2.0, torch.tensor(2.0, dtype=dtype, device=device),
               torch.ones(0, dtype=dtype, device=device)):
        g = torch.zeros(0, dtype=dtype, device=device, requires_grad=True)
        x = torch.ones(2, dtype=dtype, device=device, requires_grad=True)
        term = ee.augmented_lagrangian_term(g, lam, mu, kind=kind)
        want = ref.augmented_lagrangian_term(g, lam, mu, kind=kind)
        assert term.shape == () and term.dtype == dtype and term.device == g.device
        assert term.item() == 0.0 == want.item()
        assert term.requires_grad and term.grad_fn is not None and want.requires_grad
        (x.sum() + 3.0 * term).backward()   # in a larger loss: the rest still gets its gradient
        assert g.grad is not None and g.grad.shape == (0,) and g.grad.dtype == dtype
        torch.testing.assert_close(x.grad, torch.ones_like(x))
        assert ee.dual_update_(lam, g.detach(), mu, kind=kind, lam_max=1.0) is lam
        assert lam.shape == (0,)
    no_grad = ee.augmented_lagrangian_term(torch.zeros(0, dtype=dtype, device=device), lam, 1.0)
    assert not no_grad.requires_grad and no_grad.item() == 0.0
    if device.type == "cpu":
        g0 = torch.zeros(0, dtype=dtype, requires_grad=True)
        torch.library.opcheck(torch.ops.entangle_ext.augmented_lagrangian.default,
                              (g0, lam, torch.ones((), dtype=dtype), kind))
        torch.library.opcheck(torch.ops.entangle_ext.dual_update_.default,
                              (lam, g0.detach(), torch.ones((), dtype=dtype), kind, None, None,
                               0.0, True))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("vector_mu", [False, True])
def test_gradcheck(device, kind, vector_mu):
    lam, g, mu = draw_inputs(11, 6, torch.float64, vector_mu)
    lam = lam.abs() if kind == "inequality" else lam
    # keep lam + mu g away from the inequality kink at 0 (finite differences straddle it)
    t = lam + mu * g
    g = torch.where(t.abs() < 0.05, g + 0.2 / mu, g)
    a = g.to(device).clone().requires_grad_(True)
    lam, mu = lam.to(device), mu.to(device)
    assert torch.autograd.gradcheck(
        lambda x: ee.augmented_lagrangian_term(x, lam, mu, kind=kind), (a,))


def test_lam_and_mu_get_no_gradient():
    lam = torch.ones(2, requires_grad=True)
    mu = torch.tensor(3.0, requires_grad=True)
    g = torch.ones(2, requires_grad=True)
    ee.augmented_lagrangian_term(g, lam, mu).backward()
    assert lam.grad is None and mu.grad is None
    torch.testing.assert_close(g.grad, torch.full((2,), 4.0))


def test_double_backward_raises():
    g = torch.ones(2, dtype=torch.float64, requires_grad=True)
    (gg,) = torch.autograd.grad(ee.augmented_lagrangian_term(g, torch.ones(2, dtype=torch.float64), 2.0),
                                g, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        gg.sum().backward()


def test_al_term_errors():
    g, lam = torch.zeros(3), torch.zeros(3)
    with pytest.raises(ValueError, match="shape"):
        ee.augmented_lagrangian_term(torch.zeros(2), lam, 1.0)
    with pytest.raises(ValueError, match="shape"):
        ee.augmented_lagrangian_term(g, lam, torch.ones(2))
    with pytest.raises(TypeError, match="same dtype"):
        ee.augmented_lagrangian_term(g.double(), lam, 1.0)
    with pytest.raises(TypeError, match="float32 or float64"):
        ee.augmented_lagrangian_term(g.half(), lam.half(), 1.0)
    with pytest.raises(ValueError, match="kind"):
        ee.augmented_lagrangian_term(g, lam, 1.0, kind="ineq")
    with pytest.raises(ValueError, match="is on"):
        ee.augmented_lagrangian_term(torch.zeros(3, device="meta"), lam, 1.0)
    with pytest.raises(ValueError, match="0-d"):
        torch.ops.entangle_ext.augmented_lagrangian_backward(torch.ones(3), g, lam, torch.ones(()),
                                                             "equality")


def test_opcheck():
    lam, g, mu = draw_inputs(3, 5, torch.float64, vector_mu=True)
    for kind in KINDS:
        for mu_ in (mu, mu[:1].reshape(()), mu.float()[0].double()):
            torch.library.opcheck(torch.ops.entangle_ext.augmented_lagrangian.default,
                                  (g.clone().requires_grad_(True), lam, mu_, kind))
            torch.library.opcheck(torch.ops.entangle_ext.augmented_lagrangian.default,
                                  (g.float(), lam.float(), mu_.float(), kind))
            torch.library.opcheck(torch.ops.entangle_ext.augmented_lagrangian_backward.default,
                                  (torch.tensor(1.5, dtype=torch.float64), g, lam, mu_, kind))
            torch.library.opcheck(torch.ops.entangle_ext.dual_update_.default,
                                  (lam.clone(), g, mu_, kind, None, 4.0, 0.1, True))
            torch.library.opcheck(torch.ops.entangle_ext.dual_update_.default,
                                  (lam.float().clone(), g.float(), mu_.float(), kind, -1.0, None,
                                   0.0, False))



@pytest.mark.parametrize("mu", [0.0, -1.0, torch.tensor(0.0, dtype=torch.float64),
                                torch.tensor([1.0, -2.0], dtype=torch.float64)])
def test_non_positive_mu_raises(mu):
    lam = torch.zeros(2, dtype=torch.float64)
    g = torch.tensor([1.0, 2.0], dtype=torch.float64)
    with pytest.raises(ValueError, match="mu must be > 0"):
        ee.dual_update_(lam, g, mu)
    with pytest.raises(ValueError, match="mu must be > 0"):
        ee.augmented_lagrangian_term(g, lam, mu, kind="inequality")
    assert torch.equal(lam, torch.zeros(2, dtype=torch.float64))


@pytest.mark.parametrize("mu", [float("nan"), float("inf"), torch.tensor(float("nan")),
                                torch.tensor([1.0, float("inf")])])
def test_non_finite_mu_is_refused_by_the_term(mu):
    """The term has no check_finite policy: a non-finite mu known on the host (a Python float or a
    CPU tensor) is a ValueError like mu = 0, not a silent NaN."""
    with pytest.raises(ValueError, match="mu must be > 0 and finite"):
        ee.augmented_lagrangian_term(torch.ones(2), torch.zeros(2), mu)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_precision_multipliers_are_refused_truthfully(half):
    """lam (hence the state) must be float32/float64; the message says so and claims no upcast."""
    for call in (lambda: ee.dual_update_(torch.zeros(3, dtype=half), torch.ones(3, dtype=half), 1.0),
                 lambda: ee.augmented_lagrangian_term(torch.ones(3, dtype=half),
                                                      torch.zeros(3, dtype=half), 1.0)):
        with pytest.raises(TypeError, match=r"lam must be float32 or float64 \(got torch\.") as e:
            call()
        assert "upcast" not in str(e.value) and "keep the multipliers in float32" in str(e.value)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
def test_half_precision_g_is_upcast_to_the_multipliers(half, kind):
    """A float16/bfloat16 g (the loss of a half-precision model) with float32 lam: computed in
    float32 (g.to(lam.dtype), autograd-connected), the gradient flows back to the half g."""
    lam, g32, mu = draw_inputs(3, 5, torch.float32, vector_mu=True)
    g = g32.to(half).requires_grad_(True)
    want_g = g.detach().float().requires_grad_(True)
    term = ee.augmented_lagrangian_term(g, lam.abs(), mu, kind=kind)
    want = ee.augmented_lagrangian_term(want_g, lam.abs(), mu, kind=kind)
    assert term.dtype == torch.float32
    torch.testing.assert_close(term, want, rtol=0, atol=0)
    term.backward()
    want.backward()
    assert g.grad.dtype == half
    torch.testing.assert_close(g.grad, want_g.grad.to(half), rtol=0, atol=0)
    got, ref_lam = lam.clone(), lam.clone()
    ee.dual_update_(got, g.detach(), mu, kind=kind)
    ee.dual_update_(ref_lam, g.detach().float(), mu, kind=kind)
    assert torch.equal(got, ref_lam)
    with pytest.raises(TypeError, match="g is torch.float64 but lam is torch.float32"):
        ee.dual_update_(lam.clone(), g32.double(), mu)   # only half precision is upcast


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("lam0", [0.0, 1.0])
def test_a_nan_constraint_gives_a_nan_term_and_gradient(device, kind, lam0):
    """The inequality form read a NaN g as a satisfied constraint (``lam + mu g > 0`` is false for
    NaN): a finite term (-lam^2 / (2 mu), or 0 at lam = 0) and a zero gradient, so the NaN left the
    loss and a NaN check of it saw nothing. Now NaN in, NaN out, in both forms, as the reference."""
    g = torch.tensor([float("nan"), -2.0], dtype=torch.float64, device=device, requires_grad=True)
    lam = torch.full((2,), lam0, dtype=torch.float64, device=device)
    term = ee.augmented_lagrangian_term(g, lam, 2.0, kind=kind)
    term.backward()
    assert torch.isnan(term) and torch.isnan(g.grad[0]) and torch.isfinite(g.grad[1])
    assert torch.isnan(ref.augmented_lagrangian_term(g.detach().cpu(), lam.cpu(), 2.0, kind=kind))
    al = ee.AugmentedLagrangian(torch.zeros(1, dtype=torch.float64, device=device), kind=kind)
    assert torch.isnan(al.penalty(torch.tensor([float("nan")], dtype=torch.float64, device=device) + 0))


@pytest.mark.parametrize("kind", KINDS)
def test_dual_update_keeps_a_nan_multiplier_nan(device, kind):
    """The inequality step's max(0, t) turned a NaN multiplier into 0 (``t > 0 ? t : 0``), hiding a
    corrupted state the reference (torch.clamp) keeps as NaN; the bounds already kept it."""
    lam = torch.tensor([float("nan"), 1.0], dtype=torch.float64, device=device)
    want = ref.dual_update_(lam.cpu().clone(), torch.ones(2, dtype=torch.float64), 1.0, kind=kind)
    ee.dual_update_(lam, torch.ones(2, dtype=torch.float64, device=device), 1.0, kind=kind, lam_max=5.0)
    assert torch.isnan(lam[0]) and torch.isnan(want[0]) and lam[1].item() == want[1].item() == 2.0


def test_the_reference_term_matches_the_operator_for_half_g_and_tiny_mu():
    """The reference computed in g's dtype (a float16 g of 300: 90300 overflowed to inf, the
    operator gives 90300 in lam's float32) and as a difference of squares over 2 mu, which cancels
    to 0 for mu = 1e-20 where the term is lam g = -1."""
    g16, lam = torch.tensor([300.0], dtype=torch.float16), torch.tensor([1.0])
    want = ref.augmented_lagrangian_term(g16, lam, 2.0)
    assert want.dtype == torch.float32 and want.item() == 90300.0
    assert ee.augmented_lagrangian_term(g16, lam, 2.0).item() == 90300.0
    g, lam64 = torch.tensor([-1.0], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    for f in (ref.augmented_lagrangian_term, ee.augmented_lagrangian_term):
        assert f(g, lam64, 1e-20, kind="inequality").item() == pytest.approx(-1.0, rel=1e-12)
    # a satisfied constraint at g = -inf: term -lam^2 / (2 mu), gradient 0 (not 0 * inf = NaN
    # through the unselected side of the piecewise form)
    for f in (ref.augmented_lagrangian_term, ee.augmented_lagrangian_term):
        gi = torch.tensor([-float("inf")], dtype=torch.float64, requires_grad=True)
        t = f(gi, lam64, 2.0, kind="inequality")
        t.backward()
        assert t.item() == -0.25 and gi.grad.item() == 0.0


def test_host_arguments_are_checked_before_the_kernel():
    """damping / bounds: TypeError for non-numbers, ValueError for NaN; lam untouched."""
    lam, g = torch.zeros(2), torch.ones(2)
    with pytest.raises(TypeError, match="damping must be a float"):
        ee.dual_update_(lam, g, 1.0, damping="0.1")
    with pytest.raises(ValueError, match="lam_max is NaN"):
        ee.dual_update_(lam, g, 1.0, lam_max=float("nan"))
    with pytest.raises(ValueError, match="damping must be in"):
        ee.dual_update_(lam, g, 1.0, damping=float("nan"))
    assert torch.equal(lam, torch.zeros(2))



@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bounds,match", [
    (dict(lam_min=float("inf")), r"lam_min is \+inf"),
    (dict(lam_max=-float("inf")), r"lam_max is -inf"),
    (dict(lam_min=float("inf"), lam_max=float("inf")), r"lam_min is \+inf"),
    (dict(lam_min=2.0, lam_max=1.0), r"lam_min \(2\) > lam_max \(1\)"),
])
def test_bounds_that_leave_no_multiplier_value_are_refused(kind, bounds, match):
    """lam_min = +inf or lam_max = -inf would set every multiplier to +-inf without an error."""
    lam = torch.ones(2, dtype=torch.float64)
    with pytest.raises(ValueError, match=f"^dual_update_: {match}"):
        ee.dual_update_(lam, torch.ones(2, dtype=torch.float64), 2.0, kind=kind, **bounds)
    assert torch.equal(lam, torch.ones(2, dtype=torch.float64))
    with pytest.raises(ValueError, match=f"^AugmentedLagrangian: {match}"):
        ee.AugmentedLagrangian(1.0, kind=kind, **bounds)


def test_infinite_bounds_that_are_no_bounds_still_work():
    lam = torch.zeros(2, dtype=torch.float64)
    ee.dual_update_(lam, torch.tensor([1.0, -1.0], dtype=torch.float64), 2.0, lam_min=-float("inf"),
                    lam_max=float("inf"))
    assert lam.tolist() == [2.0, -2.0]


@pytest.mark.parametrize("dtype,big", [(torch.float64, 1e300), (torch.float32, 1e30)])
def test_lam_overflow_is_inf_unless_bounded(dtype, big):
    """Finite g and mu whose product overflows the dtype of lam give lam = +-inf (documented: only
    g and mu are checked); lam_min / lam_max keep it finite."""
    g = torch.tensor([big, -big], dtype=dtype)
    lam = torch.zeros(2, dtype=dtype)
    ee.dual_update_(lam, g, big)
    assert lam.tolist() == [float("inf"), -float("inf")]
    lam = torch.zeros(2, dtype=dtype)
    ee.dual_update_(lam, g, big, lam_min=-5.0, lam_max=5.0)
    assert lam.tolist() == [5.0, -5.0]


def test_mu_of_shape_one_is_not_broadcast_to_m_constraints():
    """mu is () or (m,), as the messages say: a (1,) mu for m = 4 is refused, not broadcast."""
    lam, g = torch.zeros(4), torch.ones(4)
    with pytest.raises(ValueError, match=r"^dual_update_: mu must have shape \(\) or \(m,\) = \(4,\), got \(1,\)"):
        ee.dual_update_(lam, g, torch.ones(1))
    with pytest.raises(ValueError, match=r"^augmented_lagrangian_term: mu must have shape \(\) or \(m,\) = \(4,\), "
                                         r"got \(1,\)"):
        ee.augmented_lagrangian_term(g, lam, torch.ones(1))
    assert torch.equal(lam, torch.zeros(4))
    one = torch.zeros(1)
    ee.dual_update_(one, torch.ones(1), torch.full((1,), 2.0))   # m = 1: (1,) is (m,)
    assert one.item() == 2.0 and ee.augmented_lagrangian_term(torch.ones(1), one, torch.ones(1)).item() == 2.5


def test_shape_errors_name_the_public_function():
    """Not the internal operator ("augmented_lagrangian: ...")."""
    lam, term = torch.zeros(4), ee.augmented_lagrangian_term
    for call, match in (
            (lambda: term(torch.ones(3), lam, 1.0),
             r"augmented_lagrangian_term: g must have shape \(m,\) = \(4,\) like lam, got \(3,\)"),
            (lambda: term(torch.ones(4), lam, torch.ones(2)),
             r"augmented_lagrangian_term: mu must have shape \(\) or \(m,\) = \(4,\), got \(2,\)"),
            (lambda: term(torch.ones(4, 1), torch.zeros(4, 1), 1.0),
             r"augmented_lagrangian_term: lam must have 1 dimension \(m,\), got shape \(4, 1\)"),
            (lambda: ee.dual_update_(lam, torch.ones(3), 1.0),
             r"dual_update_: g must have shape \(m,\) = \(4,\) like lam, got \(3,\)")):
        with pytest.raises(ValueError, match=f"^{match}"):
            call()


# ------------------------------------------------------------------------------ CUDA
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m", [1, 7, 1000, 70000])
def test_cuda_matches_cpu(dtype, kind, m):
    for vector_mu in (False, True):
        lam, g, mu = draw_inputs(m, m, dtype, vector_mu)
        a, b = lam.clone(), lam.cuda()
        ee.dual_update_(a, g, mu, kind=kind, lam_min=-0.5, lam_max=3.0, damping=0.1)
        ee.dual_update_(b, g.cuda(), mu.cuda(), kind=kind, lam_min=-0.5, lam_max=3.0, damping=0.1)
        tol = 1e-5 if dtype == torch.float32 else 1e-12
        torch.testing.assert_close(b.cpu(), a, rtol=tol, atol=tol)
        gc, gg = g.clone().requires_grad_(True), g.cuda().requires_grad_(True)
        tc = ee.augmented_lagrangian_term(gc, lam, mu, kind=kind)
        tg = ee.augmented_lagrangian_term(gg, lam.cuda(), mu.cuda(), kind=kind)
        torch.testing.assert_close(tg.cpu(), tc, rtol=1e-4 if dtype == torch.float32 else 1e-10,
                                   atol=1e-3 if dtype == torch.float32 else 1e-10)
        tc.backward()
        tg.backward()
        torch.testing.assert_close(gg.grad.cpu(), gc.grad, rtol=tol, atol=tol)


@pytest.mark.cuda
def test_cuda_float32_accumulates_in_float64_like_cpu():
    # Large terms of both signs that cancel: a float32 accumulator on the device would lose the
    # small total that the CPU kernel (float64 accumulator) keeps.
    m = 70000
    lam = torch.ones(m, dtype=torch.float64)
    g = torch.full((m,), 1000.0, dtype=torch.float64)
    g[1::2] = -1000.0
    g[0] += 0.001
    lam, g = lam.float(), g.float()
    mu = torch.zeros((), dtype=torch.float32)
    want = ee.augmented_lagrangian_term(g, lam, mu)
    got = ee.augmented_lagrangian_term(g.cuda(), lam.cuda(), mu.cuda())
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=0)


@pytest.mark.cuda
def test_cuda_device_mismatch_and_capture_errors():
    lam = torch.zeros(3, device="cuda")
    with pytest.raises(ValueError, match="is on"):
        ee.dual_update_(lam, torch.zeros(3), 1.0)
    with pytest.raises(ValueError, match="is on"):
        ee.dual_update_(lam, torch.zeros(3, device="cuda"), torch.ones(()))
    with pytest.raises(ValueError, match="is on"):
        ee.augmented_lagrangian_term(torch.zeros(3, device="cuda"), torch.zeros(3), 1.0)
    with pytest.raises(ValueError, match="non-finite"):
        ee.dual_update_(lam, torch.tensor([0.0, float("nan"), 1.0], device="cuda"), 1.0)
    assert (lam == 0).all()
    g = torch.zeros(3, device="cuda")
    mu = torch.ones((), device="cuda")
    torch.cuda.synchronize()
    with pytest.raises(RuntimeError, match="capture"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            ee.dual_update_(lam, g, mu, check_finite=True)


@pytest.mark.cuda
def test_cuda_graph_non_finite_entries_keep_lam():
    lam = torch.zeros(4, device="cuda")
    g = torch.zeros(4, device="cuda")
    mu = torch.ones((), device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ee.dual_update_(lam, g, mu, check_finite=False)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ee.dual_update_(lam, g, mu, check_finite=False)
    g.copy_(torch.tensor([1.0, float("nan"), float("inf"), -2.0]))
    mu.fill_(3.0)  # a tensor mu is read at replay time, not frozen
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(lam.cpu(), torch.tensor([6.0, 0.0, 0.0, -12.0]))


@pytest.mark.parametrize("kw, match", [
    (dict(mu=1e300), r"the penalty mu=1e\+300 is beyond the range"),
    (dict(mu=1.0, lam_min=1e300), r"lam_min=1e\+300 is beyond the range .* clipped to \+inf"),
    (dict(mu=1.0, lam_max=-1e300), r"lam_max=-1e\+300 is beyond the range .* clipped to -inf"),
])
def test_host_floats_beyond_a_float32_multipliers_range_are_value_errors(kw, match):
    """A Python-float mu of 1e300 with float32 lam raised "RuntimeError: value cannot be converted
    to type float without overflow"; a lam_min of 1e300 set lam to inf silently. Both are
    ValueErrors now, lam untouched; the same values work with float64 lam, and a lam_min below
    (lam_max above) the range is no bound, as -inf (+inf) is."""
    lam = torch.zeros(1)
    with pytest.raises(ValueError, match=f"^dual_update_: {match}"):
        ee.dual_update_(lam, torch.ones(1), **kw)
    assert lam.item() == 0.0
    lam64 = torch.zeros(1, dtype=torch.float64)
    ee.dual_update_(lam64, torch.ones(1, dtype=torch.float64), **kw)
    assert torch.isfinite(lam64).all()
    lam = torch.zeros(1)
    ee.dual_update_(lam, torch.ones(1), 2.0, lam_min=-1e300, lam_max=1e300)
    assert lam.item() == 2.0
    if "lam_min" not in kw and "lam_max" not in kw:
        with pytest.raises(ValueError, match=match):
            ee.augmented_lagrangian_term(torch.ones(1), torch.zeros(1), kw["mu"])
