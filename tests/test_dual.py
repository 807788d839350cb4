"""Tests of the augmented-Lagrangian operators (dual_update_, augmented_lagrangian_term) and of
entangle_ext.AugmentedLagrangian, against float64 formulas (entangle_ext.reference.dual)."""
import io

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

import entangle_ext as ee
from entangle_ext import reference as ref

from conftest import DEVICES, HAS_CUDA

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


# ------------------------------------------------------------------------------ AugmentedLagrangian
def test_class_basics_and_reference():
    c0 = torch.tensor(2.0, dtype=torch.float64)
    al = ee.AugmentedLagrangian(c0, mu=10.0)
    assert al.lam.shape == (1,) and al.lam.dtype == torch.float64 and (al.lam == 0).all()
    assert al.mu.shape == () and al.mu.item() == 10.0 and al.num_constraints == 1
    v = torch.tensor(2.5, dtype=torch.float64, requires_grad=True)
    g = al.constraint(v)
    assert g.shape == (1,) and g.item() == pytest.approx(0.5)
    term = al.penalty(g)
    term.backward()
    assert term.item() == pytest.approx(5.0 * 0.25) and v.grad.item() == pytest.approx(5.0)
    al.update()  # pre: uses the g given to penalty
    assert al.lam.item() == pytest.approx(5.0)
    torch.testing.assert_close(al.violation(), torch.tensor([0.5], dtype=torch.float64))
    assert al.violation(sync=True) == pytest.approx(0.5)
    assert int(al.steps) == 1
    term = al.penalty(al.constraint(torch.tensor(1.5, dtype=torch.float64)))
    assert term.item() == pytest.approx(5.0 * -0.5 + 5.0 * 0.25)
    al.mu = 4.0
    assert al.mu.item() == 4.0
    al.update(torch.tensor([-0.25], dtype=torch.float64))
    assert al.lam.item() == pytest.approx(4.0)


def test_class_inequality_and_vector_constraints():
    c0 = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    mu = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    al = ee.AugmentedLagrangian(c0, mu=mu, kind="inequality", lam_max=5.0)
    for vals in ([2.0, 1.0, 3.5], [2.5, 4.0, 3.0], [0.0, 0.0, 10.0]):
        v = torch.tensor(vals, dtype=torch.float64)
        g = al.constraint(v)
        lam0 = al.lam.clone()
        torch.testing.assert_close(al.penalty(g), ref.augmented_lagrangian_term(g, lam0, mu, kind="inequality"))
        al.update()
        torch.testing.assert_close(al.lam, ref.dual_update_(lam0.clone(), g, mu, kind="inequality",
                                                            lam_max=5.0))
    assert (al.lam >= 0).all() and (al.lam <= 5.0).all()
    mu[0] = 100.0  # the instance owns a copy
    assert al.mu[0].item() == 1.0


def test_class_non_finite_leaves_state_unchanged():
    al = ee.AugmentedLagrangian(torch.tensor([1.0, 1.0]), mu=2.0, mu_growth=2.0)
    al.update(torch.tensor([0.5, -0.5]))
    sd = al.state_dict()
    with pytest.raises(ValueError, match="non-finite"):
        al.update(torch.tensor([float("nan"), 0.1]))
    for k in ("lam", "mu", "steps", "last_violation", "window_sum"):
        torch.testing.assert_close(al.state_dict()[k], sd[k], rtol=0, atol=0)
    al2 = ee.AugmentedLagrangian(torch.tensor([1.0, 1.0]), mu=2.0, check_finite=False)
    al2.update(torch.tensor([float("inf"), 0.5]))
    torch.testing.assert_close(al2.lam, torch.tensor([0.0, 1.0]))


def test_schedule_grows_mu_when_violation_does_not_shrink():
    # Constant violation: no shrink, so mu doubles at the end of every window after the first.
    al = ee.AugmentedLagrangian(0.0, mu=1.0, mu_growth=2.0, shrink_ratio=0.5, schedule_every=3,
                                mu_max=10.0, dtype=torch.float64)
    mus = []
    for _ in range(15):
        al.update(torch.tensor([0.1], dtype=torch.float64))
        mus.append(al.mu.item())
    assert mus == [1.0] * 5 + [2.0] * 3 + [4.0] * 3 + [8.0] * 3 + [10.0]
    # Shrinking violation (ratio 0.25 per window < 0.5): mu stays.
    al = ee.AugmentedLagrangian(0.0, mu=1.0, mu_growth=2.0, shrink_ratio=0.5, schedule_every=3,
                                dtype=torch.float64)
    for k in range(15):
        al.update(torch.tensor([0.25 ** (k // 3)], dtype=torch.float64))
    assert al.mu.item() == 1.0
    # Per-constraint mu: only the constraint that stalls grows.
    al = ee.AugmentedLagrangian(torch.zeros(2, dtype=torch.float64),
                                mu=torch.ones(2, dtype=torch.float64), mu_growth=3.0,
                                shrink_ratio=0.5)
    for k in range(4):
        al.update(torch.tensor([1.0, 0.1 ** k], dtype=torch.float64))
    assert al.mu.tolist() == [27.0, 1.0]
    # No schedule by default.
    al = ee.AugmentedLagrangian(0.0, mu=1.0)
    for _ in range(5):
        al.update(torch.tensor([1.0]))
    assert al.mu.item() == 1.0


def test_state_dict_round_trip():
    kw = dict(mu=2.0, kind="inequality", mu_growth=1.5, shrink_ratio=0.9, schedule_every=2,
              damping=0.05)
    c0 = torch.tensor([0.3, -0.2, 1.0], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    gs = [torch.randn(3, generator=gen, dtype=torch.float64) for _ in range(12)]
    a = ee.AugmentedLagrangian(c0, **kw)
    for g in gs[:5]:
        a.update(g)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = ee.AugmentedLagrangian(torch.zeros(3, dtype=torch.float64), **kw)
    b.load_state_dict(torch.load(buf))
    torch.testing.assert_close(b.c0, c0)
    for g in gs[5:]:
        a.update(g)
        b.update(g)
    sa, sb = a.state_dict(), b.state_dict()
    for k, v in sa.items():
        if isinstance(v, torch.Tensor):
            torch.testing.assert_close(sb[k], v, rtol=0, atol=0)
    assert a.mu.item() != 2.0  # the schedule did something that had to be restored
    with pytest.raises(ValueError, match="kind"):
        ee.AugmentedLagrangian(c0, mu=2.0).load_state_dict(sa)
    with pytest.raises(ValueError, match="multipliers"):
        ee.AugmentedLagrangian(0.0, mu=2.0, kind="inequality").load_state_dict(sa)


def test_to_moves_state():
    al = ee.AugmentedLagrangian(torch.tensor([1.0, 2.0]), mu=3.0)
    al.update(torch.tensor([1.0, -1.0]))
    al.to("cpu", dtype=torch.float64)
    assert al.lam.dtype == torch.float64 and al.mu.dtype == torch.float64
    assert al.lam.tolist() == [3.0, -3.0]
    al.update(torch.tensor([1.0, 1.0], dtype=torch.float64))
    assert al.lam.tolist() == [6.0, 0.0]


def test_class_argument_errors():
    with pytest.raises(ValueError, match="kind"):
        ee.AugmentedLagrangian(0.0, kind="eq")
    with pytest.raises(ValueError, match="update_with"):
        ee.AugmentedLagrangian(0.0, update_with="after")
    with pytest.raises(ValueError, match="mu"):
        ee.AugmentedLagrangian(0.0, mu=0.0)
    with pytest.raises(ValueError, match="shape"):
        ee.AugmentedLagrangian(torch.zeros(3), mu=torch.ones(2))
    with pytest.raises(ValueError, match="empty"):
        ee.AugmentedLagrangian(torch.zeros(0))
    with pytest.raises(TypeError, match="floating"):
        ee.AugmentedLagrangian(torch.zeros(2, dtype=torch.int64))
    al = ee.AugmentedLagrangian(torch.zeros(2))
    with pytest.raises(ValueError, match="shape"):
        al.constraint(torch.zeros(3))
    with pytest.raises(RuntimeError, match="penalty"):
        al.update()
    with pytest.raises(ValueError, match="closure"):
        al.update(closure=lambda: torch.zeros(2))
    with pytest.raises(ValueError, match="not both"):
        al.update(torch.zeros(2), closure=lambda: torch.zeros(2))
    post = ee.AugmentedLagrangian(torch.zeros(2), update_with="post")
    post.penalty(torch.zeros(2))
    with pytest.raises(ValueError, match="post"):
        post.update()


# ------------------------------------------------------------------------------ Stage-1 loop
def _problem(device, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    d, k = 6, 3
    Xr = torch.randn(48, d, generator=gen, dtype=dtype).to(device)
    yr = torch.randint(0, k, (48,), generator=gen).to(device)
    Xf = torch.randn(16, d, generator=gen, dtype=dtype).to(device)
    yf = torch.randint(0, k, (16,), generator=gen).to(device)
    model = torch.nn.Linear(d, k, dtype=dtype)
    with torch.no_grad():
        model.weight.copy_(torch.randn(k, d, generator=gen, dtype=dtype) * 0.3)
        model.bias.zero_()
    model = model.to(device)
    with torch.no_grad():
        c0 = F.cross_entropy(model(Xr), yr)
    return model, (Xr, yr, Xf, yf), c0


def _manual_stage1(update_with, steps, lr=0.1, mu=10.0):
    """The loop in plain float64 PyTorch (no entangle_ext operators): lam trajectory."""
    model, (Xr, yr, Xf, yf), c0 = _problem("cpu", torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    lam, lams = torch.zeros((), dtype=torch.float64), []
    for _ in range(steps):
        g = F.cross_entropy(model(Xr), yr) - c0
        loss = -F.cross_entropy(model(Xf), yf) + lam * g + mu / 2 * g * g
        opt.zero_grad()
        loss.backward()
        opt.step()
        if update_with == "post":
            with torch.no_grad():
                g = F.cross_entropy(model(Xr), yr) - c0
        lam = lam + mu * g.detach()
        lams.append(lam.item())
    return lams


@pytest.mark.parametrize("update_with", ["pre", "post"])
def test_stage1_loop_pre_vs_post(update_with):
    steps, lr, mu = 6, 0.1, 10.0
    model, (Xr, yr, Xf, yf), c0 = _problem("cpu", torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    al = ee.AugmentedLagrangian(c0, mu=mu, update_with=update_with)
    lams = []
    for _ in range(steps):
        g = al.constraint(F.cross_entropy(model(Xr), yr))
        loss = -F.cross_entropy(model(Xf), yf) + al.penalty(g)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if update_with == "pre":
            al.update()
        else:
            al.update(closure=lambda: F.cross_entropy(model(Xr), yr))
        lams.append(al.lam.item())
    want = _manual_stage1(update_with, steps, lr, mu)
    other = _manual_stage1("post" if update_with == "pre" else "pre", steps, lr, mu)
    assert lams == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert max(abs(a - b) for a, b in zip(want, other)) > 1e-4  # the two modes really differ


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


def _stage1_step(model, opt, al, data):
    Xr, yr, Xf, yf = data
    opt.zero_grad(set_to_none=True)
    g = al.constraint(F.cross_entropy(model(Xr), yr))
    loss = -F.cross_entropy(model(Xf), yf) + al.penalty(g)
    loss.backward()
    opt.step()
    al.update()


@pytest.mark.cuda
def test_cuda_graph_capture_of_stage1_step():
    """A whole Stage-1 step (forward, AL term, backward, SGD step, dual update with a mu schedule)
    captured once and replayed: no host sync (capture would fail), lam/mu/weights match eager."""
    warmup, replays = 3, 8
    kw = dict(mu=10.0, mu_growth=1.5, shrink_ratio=0.9, schedule_every=2)

    model_e, data, c0 = _problem("cuda")
    opt_e = torch.optim.SGD(model_e.parameters(), lr=0.05)
    al_e = ee.AugmentedLagrangian(c0, check_finite=False, **kw)
    lam_traj = []
    for _ in range(warmup + replays):
        _stage1_step(model_e, opt_e, al_e, data)
        lam_traj.append(al_e.lam.clone())

    model, data, c0 = _problem("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    al = ee.AugmentedLagrangian(c0, **kw)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            _stage1_step(model, opt, al, data)
    torch.cuda.current_stream().wait_stream(s)
    torch.testing.assert_close(al.lam, lam_traj[warmup - 1])
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        Xr, yr, Xf, yf = data
        g = al.constraint(F.cross_entropy(model(Xr), yr))
        loss = -F.cross_entropy(model(Xf), yf) + al.penalty(g)
        loss.backward()
        opt.step()
        al.update()
    for k in range(replays):
        graph.replay()
        torch.testing.assert_close(al.lam, lam_traj[warmup + k], rtol=1e-5, atol=1e-6)
    torch.cuda.synchronize()
    assert int(al.steps) == warmup + replays
    # The schedule grew mu at steps 4 and 6 (1.5x each), i.e. inside the replayed graph.
    assert al_e.mu.item() == pytest.approx(22.5)
    torch.testing.assert_close(al.mu, al_e.mu)
    assert al.lam.abs().item() > 0
    torch.testing.assert_close(model.weight, model_e.weight, rtol=1e-5, atol=1e-6)


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


def test_non_finite_c0_raises():
    with pytest.raises(ValueError, match="c0 must be finite"):
        ee.AugmentedLagrangian(torch.tensor([float("nan")]))
    with pytest.raises(ValueError, match="c0 must be finite"):
        ee.AugmentedLagrangian(float("inf"))
