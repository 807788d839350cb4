"""Forward-mode AD (torch.func.jvp, torch.func.jacfwd, torch.autograd.forward_ad dual tensors) on
every public operator: each is in one of two states, and a silent zero / None tangent fails.

* forward implemented - wasserstein2_1d (dense, batched, ragged, reductions, both sides),
  augmented_lagrangian_term (equality, inequality), project_orthogonal: the tangent equals the
  float64 reference, the reverse-mode gradient (torch.autograd.grad) contracted with the tangent;
* raises NotImplementedError with the "forward-mode AD ... is not supported" message - the
  non-differentiable operators dual_update_, project_orthogonal_, projection_gram,
  projection_apply_, projection_solve (their result would otherwise carry no tangent).
"""
import re

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import entangle_ext as ee

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")

F64 = torch.float64
MODES = ["jvp", "jacfwd", "dual"]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _reverse_jacobian(fn, primals):
    """float64 reference: rows of the Jacobian of fn by reverse mode (torch.autograd.grad)."""
    xs = [p.detach().to(F64).requires_grad_() for p in primals]
    out = fn(*xs)
    flat = out.reshape(-1)
    rows = []
    for i in range(flat.numel()):
        gs = torch.autograd.grad(flat[i], xs, retain_graph=True, allow_unused=True)
        rows.append([torch.zeros_like(x) if g is None else g for g, x in zip(gs, xs)])
    return out.detach(), rows


def _reference_jvp(fn, primals, tangents):
    out, rows = _reverse_jacobian(fn, primals)
    t = [x.to(F64) for x in tangents]
    vals = [sum((g * ti).sum() for g, ti in zip(row, t)) for row in rows]
    return out, (torch.stack(vals).reshape(out.shape) if vals else torch.zeros_like(out))


def _forward_jvp(mode, fn, primals, tangents):
    """The tangent of fn(*primals) along tangents by the forward-mode route `mode`."""
    if mode == "jvp":
        _, t = torch.func.jvp(fn, tuple(primals), tuple(tangents))
        return t
    if mode == "dual":
        with fwAD.dual_level():
            out = fn(*[fwAD.make_dual(p, t) for p, t in zip(primals, tangents)])
            t = fwAD.unpack_dual(out).tangent
        assert t is not None, "silent None tangent"
        return t
    assert mode == "jacfwd"
    jac = torch.func.jacfwd(fn, argnums=tuple(range(len(primals))))(*primals)
    out_shape = fn(*primals).shape
    return sum((j.reshape(out_shape.numel(), -1) @ t.reshape(-1)).reshape(out_shape)
               for j, t in zip(jac, tangents))


def _check(mode, fn, primals, tangents, *, atol=1e-10, rtol=1e-9):
    _, expect = _reference_jvp(fn, primals, tangents)
    assert expect.abs().max() > 1e-3, "the reference tangent must be non-zero for the test to mean anything"
    got = _forward_jvp(mode, fn, primals, tangents)
    assert got is not None, "silent None tangent"
    assert got.shape == expect.shape
    torch.testing.assert_close(got.to(F64), expect, atol=atol, rtol=rtol)


# ----------------------------------------------------------------------------------------------
# wasserstein2_1d: forward implemented
# ----------------------------------------------------------------------------------------------
W2_CASES = {
    "dense_1d_unequal": dict(shapes=((5,), (7,))),
    "dense_1d_equal": dict(shapes=((6,), (6,))),
    "dense_batched": dict(shapes=((3, 4), (3, 6))),
    "ragged": dict(shapes=((9,), (7,)), u_offsets=[0, 2, 6, 9], v_offsets=[0, 3, 4, 7]),
    "sum": dict(shapes=((3, 4), (3, 5)), reduction="sum"),
    "mean": dict(shapes=((3, 4), (3, 5)), reduction="mean"),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(W2_CASES))
@pytest.mark.parametrize("side", ["u", "v", "both"])
def test_w2_forward_mode_matches_reverse(case, mode, side, device):
    c = W2_CASES[case]
    gen = _gen(len(case) + len(side))
    u = torch.randn(*c["shapes"][0], generator=gen, dtype=F64).to(device)
    v = torch.randn(*c["shapes"][1], generator=gen, dtype=F64).to(device)
    tu = torch.randn(u.shape, generator=gen, dtype=F64).to(device)
    tv = torch.randn(v.shape, generator=gen, dtype=F64).to(device)
    kw = {k: c[k] for k in ("u_offsets", "v_offsets", "reduction") if k in c}
    if side == "u":
        _check(mode, lambda a: ee.wasserstein2_1d(a, v, **kw), [u], [tu])
    elif side == "v":
        _check(mode, lambda b: ee.wasserstein2_1d(u, b, **kw), [v], [tv])
    else:
        _check(mode, lambda a, b: ee.wasserstein2_1d(a, b, **kw), [u, v], [tu, tv])


def test_w2_jvp_matches_float64_finite_difference():
    gen = _gen(3)
    u, v = torch.randn(8, generator=gen, dtype=F64), torch.randn(5, generator=gen, dtype=F64)
    tu, tv = torch.randn(8, generator=gen, dtype=F64), torch.randn(5, generator=gen, dtype=F64)
    _, t = torch.func.jvp(ee.wasserstein2_1d, (u, v), (tu, tv))
    h = 1e-6   # small enough that no two sorted values swap
    fd = (ee.wasserstein2_1d(u + h * tu, v + h * tv) - ee.wasserstein2_1d(u - h * tu, v - h * tv)) / (2 * h)
    torch.testing.assert_close(t, fd, atol=1e-7, rtol=1e-6)


def test_w2_float32_forward_mode_matches_float64_reference():
    gen = _gen(4)
    u, v = torch.randn(2, 6, generator=gen), torch.randn(2, 9, generator=gen)
    tu = torch.randn(2, 6, generator=gen)
    _check("jvp", lambda a: ee.wasserstein2_1d(a, v.to(a.dtype)), [u], [tu], atol=1e-5, rtol=1e-4)


def test_w2_forward_and_reverse_together():
    """A dual tensor that also requires grad: tangent and gradient both right."""
    gen = _gen(5)
    u, v, tu = (torch.randn(6, generator=gen, dtype=F64) for _ in range(3))
    ur = u.clone().requires_grad_()
    with fwAD.dual_level():
        out = ee.wasserstein2_1d(fwAD.make_dual(ur, tu), v)
        t = fwAD.unpack_dual(out).tangent
        (gu,) = torch.autograd.grad(out, ur)
    _, expect = _reference_jvp(lambda a: ee.wasserstein2_1d(a, v), [u], [tu])
    torch.testing.assert_close(t, expect)
    torch.testing.assert_close(gu @ tu, expect)


@pytest.mark.parametrize("op", ["w2", "al"])
def test_the_tangent_of_a_gradient_taken_at_a_dual_level_is_nan(op):
    """A gradient taken while a dual level is open gets a tangent eagerly; it would be a second
    derivative, which is not implemented: NaN, never the zero it used to be."""
    gen = _gen(6)
    u, v, tu = (torch.randn(6, generator=gen, dtype=F64) for _ in range(3))
    lam = torch.ones(6, dtype=F64)
    f = {"w2": lambda a: ee.wasserstein2_1d(a, v), "al": lambda a: ee.augmented_lagrangian_term(a, lam, 2.0)}[op]
    ur = u.clone().requires_grad_()
    with fwAD.dual_level():
        (gu,) = torch.autograd.grad(f(fwAD.make_dual(ur, tu)), ur)
        tangent = fwAD.unpack_dual(gu).tangent
    x = u.clone().requires_grad_()
    (want,) = torch.autograd.grad(f(x), x)
    torch.testing.assert_close(fwAD.unpack_dual(gu).primal, want)
    assert tangent is not None and tangent.isnan().all()


# ----------------------------------------------------------------------------------------------
# augmented_lagrangian_term: forward implemented
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_al_issue_example_is_1_5(mode):
    g = torch.tensor([0.5, -1.0], dtype=F64)
    lam = torch.tensor([1.0, 2.0], dtype=F64)
    t = _forward_jvp(mode, lambda x: ee.augmented_lagrangian_term(x, lam, 1.0), [g],
                     [torch.tensor([1.0, 0.0], dtype=F64)])
    torch.testing.assert_close(t, torch.tensor(1.5, dtype=F64))   # (lam + mu g) . t


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["equality", "inequality"])
@pytest.mark.parametrize("mu_kind", ["float", "vector"])
def test_al_forward_mode_matches_reverse(mode, kind, mu_kind, device):
    g = torch.tensor([0.5, -1.0, -3.0, 0.25], dtype=F64, device=device)   # inequality: 2 active, 2 not
    lam = torch.tensor([1.0, 2.0, 0.5, 0.0], dtype=F64, device=device)
    mu = 1.5 if mu_kind == "float" else torch.tensor([1.0, 0.5, 2.0, 3.0], dtype=F64, device=device)
    t = torch.tensor([0.3, -1.2, 2.0, 0.7], dtype=F64, device=device)
    _check(mode, lambda x: ee.augmented_lagrangian_term(x, lam, mu, kind=kind), [g], [t])


def test_al_penalty_of_the_class_has_a_tangent():
    al = ee.AugmentedLagrangian(torch.zeros(2, dtype=F64), mu=2.0)
    g = torch.tensor([0.5, -1.0], dtype=F64)
    _, t = torch.func.jvp(al.penalty, (g,), (torch.tensor([1.0, 1.0], dtype=F64),))
    _, expect = _reference_jvp(al.penalty, [g], [torch.tensor([1.0, 1.0], dtype=F64)])
    torch.testing.assert_close(t, expect)


# ----------------------------------------------------------------------------------------------
# project_orthogonal: forward implemented (linear in g)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_project_orthogonal_forward_mode_matches_reverse(mode, device):
    gen = _gen(7)
    g, t = (torch.randn(9, generator=gen, dtype=F64).to(device) for _ in range(2))
    basis = torch.randn(2, 9, generator=gen, dtype=F64).to(device)
    _check(mode, lambda x: ee.project_orthogonal(x, basis, ridge=1e-3)[0], [g], [t])


# ----------------------------------------------------------------------------------------------
# The non-differentiable operators: raise
# ----------------------------------------------------------------------------------------------
def _refusing_cases():
    gen = _gen(9)
    g = torch.randn(6, generator=gen, dtype=F64)
    b = torch.randn(6, generator=gen, dtype=F64)
    lam = torch.tensor([1.0, 2.0], dtype=F64)
    gram = torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=F64)
    vg = torch.tensor([1.0, -1.0], dtype=F64)
    coeffs = torch.tensor([0.5], dtype=F64)
    return {
        "dual_update_": (lambda x: ee.dual_update_(lam.clone(), x, 1.0),
                         torch.tensor([0.5, -1.0], dtype=F64)),
        "dual_update_/lam": (lambda x: ee.dual_update_(x, torch.tensor([0.5, -1.0], dtype=F64), 1.0), lam),
        "project_orthogonal_": (lambda x: ee.project_orthogonal_([x.clone()], [[b]]), g),
        "project_orthogonal_/basis": (lambda x: ee.project_orthogonal_([g.clone()], [[x]]), b),
        "projection_gram": (lambda x: ee.projection_gram([x], [[b]])[1], g),
        "projection_apply_": (lambda x: _apply(x, b, coeffs), g),
        "projection_solve": (lambda x: ee.projection_solve(x, vg), gram),
        "projection_solve/vg": (lambda x: ee.projection_solve(gram, x), vg),
    }


def _apply(x, b, coeffs):
    y = x.clone()
    ee.projection_apply_([y], [[b]], coeffs)
    return y


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(_refusing_cases()))
def test_non_differentiable_ops_raise_under_forward_mode(case, mode):
    fn, x = _refusing_cases()[case]
    op = case.split("/")[0]
    msg = re.escape(f"forward-mode AD (jvp/jacfwd/dual tensors) is not supported by entangle_ext.{op}: "
                    "it is not differentiable in reverse mode either")
    with pytest.raises(NotImplementedError, match=msg) as info:
        _forward_jvp(mode, fn, [x], [torch.ones_like(x)])
    assert "use reverse mode" not in str(info.value)   # the step has no reverse mode to offer


def test_no_false_refusal_inside_a_dual_level():
    """Plain tensors (no tangent) inside an open dual level run as usual."""
    lam = torch.tensor([1.0, 2.0], dtype=F64)
    g = torch.randn(4, dtype=F64)
    b = torch.randn(4, dtype=F64)
    with fwAD.dual_level():
        ee.dual_update_(lam, torch.tensor([0.5, -1.0], dtype=F64), 1.0)
        ee.project_orthogonal_([g], [[b]])
        G, vg = ee.projection_gram([g], [[b]])
        ee.projection_solve(G, vg)
    torch.testing.assert_close(lam, torch.tensor([1.5, 1.0], dtype=F64))
    assert abs(float(g @ b)) < 1e-10
