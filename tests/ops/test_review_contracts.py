"""Input contracts found by review: dtypes and overflow of AugmentedLagrangian's g, torch.func
transforms around the in-place operators, forward mode around vmap, the raw in-place operators'
leaf / aliasing checks, reverse mode through the split projection passes, scalar and flag
arguments."""
import numpy as np
import pytest
import torch

import entangle_ext as E

pytestmark = pytest.mark.skipif(not E.available(), reason="native extension not built")

D = torch.float64
ops = torch.ops.entangle_ext


# ------------------------------------------------------------------ 1. AugmentedLagrangian g
@pytest.mark.parametrize("bad", [torch.tensor([3 + 4j]), torch.tensor([3]), torch.tensor([True])])
@pytest.mark.parametrize("method", ["penalty", "update", "constraint"])
def test_al_refuses_non_floating_g(bad, method):
    al = E.AugmentedLagrangian(0.0, mu=2.0)
    with pytest.raises(TypeError, match="floating tensor"):
        getattr(al, method)(bad)
    assert al.lam.tolist() == [0.0]


@pytest.mark.parametrize("method", ["penalty", "update", "constraint"])
def test_al_refuses_g_that_overflows_the_state_dtype(method):
    al = E.AugmentedLagrangian(0.0)   # float32 state
    with pytest.raises(ValueError, match="beyond the range"):
        getattr(al, method)(torch.tensor([1e39], dtype=D))
    assert al.lam.tolist() == [0.0]
    # a float64 g within range (and a non-finite one, left to check_finite) is still cast
    assert float(al.penalty(torch.tensor([1.0], dtype=D))) == pytest.approx(5.0)


def test_al_update_python_number_is_type_error():
    al = E.AugmentedLagrangian(0.0, mu=2.0)
    with pytest.raises(TypeError, match="floating tensor, got float"):
        al.update(2.0)


def test_al_meta_state_refused():
    with pytest.raises(ValueError, match="meta"):
        E.AugmentedLagrangian(torch.ones(2, device="meta"))
    with pytest.raises(ValueError, match="meta"):
        E.AugmentedLagrangian(1.0, device="meta")
    with pytest.raises(ValueError, match="meta"):
        E.AugmentedLagrangian(torch.ones(2)).to("meta")


def test_al_load_state_refuses_negative_last_violation():
    al = E.AugmentedLagrangian(0.0, mu=2.0)
    st = al.state_dict()
    st["last_violation"] = torch.tensor([-1.0])
    with pytest.raises(ValueError, match="last_violation"):
        al.load_state_dict(st)
    st["last_violation"] = torch.tensor([float("nan")])   # a non-finite g leaves NaN: loadable
    al.load_state_dict(st)


@pytest.mark.parametrize("kw", [dict(mu=10**400), dict(mu_max=10**400), dict(lam_max=10**400)])
def test_al_huge_integer_settings_are_value_errors(kw):
    """The message gives the integer's size (its first 40 digits alone read as 1e39, in range)."""
    with pytest.raises(ValueError, match=r"is beyond the float range, got an integer of 401 digits \(100000000000\.\.\.\)"):
        E.AugmentedLagrangian(0.0, **kw)
    with pytest.raises(ValueError):
        E.AugmentedLagrangian(10**400)


# ------------------------------------------------------------------ 2. torch.func around in-place ops
def _inplace_calls():
    c = torch.ones(1, dtype=D)
    return {
        "project_orthogonal_": lambda x, v: (E.project_orthogonal_([x], [[v]]), x)[1],
        "projection_apply_": lambda x, v: (E.projection_apply_([x], [[v]], c), x)[1],
        "dual_update_": lambda x, v: (E.dual_update_(x, v, 1.0), x)[1],
    }


@pytest.mark.parametrize("name", ["project_orthogonal_", "projection_apply_", "dual_update_"])
def test_inplace_ops_under_functionalize_raise_clearly(name):
    f = _inplace_calls()[name]
    with pytest.raises(RuntimeError, match="not supported under torch.func.functionalize"):
        torch.func.functionalize(f)(torch.randn(3, dtype=D), torch.randn(3, dtype=D))


@pytest.mark.parametrize("name", ["project_orthogonal_", "projection_apply_", "dual_update_"])
def test_inplace_ops_under_vmap_and_grad_raise_clearly(name):
    f = _inplace_calls()[name]
    v = torch.randn(3, dtype=D)
    with pytest.raises(RuntimeError, match="not supported under torch.func.vmap"):
        torch.func.vmap(lambda x: f(x, v))(torch.randn(2, 3, dtype=D))
    with pytest.raises(RuntimeError, match="not supported under torch.func.grad"):
        torch.func.grad(lambda x: f(x.detach().clone(), x).sum())(torch.randn(3, dtype=D))


# ------------------------------------------------------------------ 3. jvp around vmap
def test_jvp_of_vmap_matches_vmap_of_jvp():
    torch.manual_seed(0)
    X, T = torch.randn(3, 5, dtype=D), torch.randn(3, 5, dtype=D)
    v, lam = torch.randn(3, dtype=D), torch.randn(5, dtype=D)
    for f in (lambda b: E.wasserstein2_1d(b, v), lambda b: E.augmented_lagrangian_term(b, lam, 2.0)):
        out = torch.func.jvp(lambda a: torch.func.vmap(f)(a), (X,), (T,))
        ref = torch.func.vmap(lambda a, t: torch.func.jvp(f, (a,), (t,)))(X, T)
        torch.testing.assert_close(out, ref)
        loop = torch.stack([torch.func.jvp(f, (X[i],), (T[i],))[1] for i in range(3)])
        torch.testing.assert_close(out[1], loop)


def test_jvp_of_vmap_refuses_inplace_with_tangent():
    X = torch.randn(2, 3, dtype=D)
    v = torch.randn(3, dtype=D)
    with pytest.raises(NotImplementedError, match="forward-mode"):
        torch.func.jvp(lambda a: torch.func.vmap(
            lambda b: E.projection_gram([b], [[v]])[1])(a), (X,), (torch.ones_like(X),))


# ------------------------------------------------------------------ 4. raw in-place operators
def _raw_calls(w, other):
    c = torch.ones(1, dtype=D)
    return {
        "project_orthogonal_": lambda: ops.project_orthogonal_([w], [other], None, 0.0),
        "projection_apply_": lambda: ops.projection_apply_([w], [other], c),
        "dual_update_": lambda: ops.dual_update_(w, other, torch.tensor(1.0, dtype=D), "equality",
                                                 None, None, 0.0, True),
    }


@pytest.mark.parametrize("name", ["project_orthogonal_", "projection_apply_", "dual_update_"])
def test_raw_inplace_refuses_leaf_requiring_grad(name):
    w = torch.randn(3, dtype=D, requires_grad=True)
    before = w.detach().clone()
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        _raw_calls(w, torch.randn(3, dtype=D))[name]()
    base = torch.randn(6, dtype=D, requires_grad=True)
    with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad"):
        _raw_calls(base[:3], torch.randn(3, dtype=D))[name]()
    nonleaf = torch.randn(3, dtype=D, requires_grad=True) * 2
    with pytest.raises(RuntimeError, match="requires grad"):
        _raw_calls(nonleaf, torch.randn(3, dtype=D))[name]()
    assert torch.equal(w.detach(), before)
    with torch.no_grad():   # as ATen: allowed without grad mode
        _raw_calls(w, torch.randn(3, dtype=D))[name]()


@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference_mode"])
@pytest.mark.parametrize("name", ["project_orthogonal_", "projection_apply_", "dual_update_"])
def test_raw_inplace_refuses_aliasing(name, mode):
    """In every mode: torch.inference_mode() skips the Autograd kernel, so the check lives in the
    backend kernels (csrc/overlap.h)."""
    with {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[mode]():
        z = torch.randn(3, dtype=D)
        with pytest.raises(ValueError, match="shares memory"):
            _raw_calls(z, z)[name]()
        buf = torch.randn(6, dtype=D)
        before = buf.clone()
        with pytest.raises(ValueError, match="shares memory"):
            _raw_calls(buf[:3], buf[2:5])[name]()
        assert torch.equal(buf, before)     # refused before anything was written
        _raw_calls(buf[:3], buf[3:])[name]()   # adjacent, disjoint: fine


def test_raw_inplace_refuses_overlapping_written_tensors():
    z = torch.randn(3, dtype=D)
    v = torch.randn(3, dtype=D)
    with pytest.raises(ValueError, match="grads\\[0\\] and grads\\[1\\] overlap"):
        ops.project_orthogonal_([z, z], [v, v.clone()], None, 0.0)
    with pytest.raises(ValueError, match="overlap"):
        ops.projection_apply_([z, z], [v, v.clone()], torch.ones(1, dtype=D))


# ------------------------------------------------------------------ 5. reverse mode through the split passes
def test_projection_gram_and_solve_refuse_reverse_mode():
    x, v = torch.randn(3, dtype=D), torch.randn(3, dtype=D)
    with pytest.raises(NotImplementedError, match="projection_gram"):
        torch.func.grad(lambda a: E.projection_gram([a], [[v]])[1].sum())(x)
    with pytest.raises(NotImplementedError, match="projection_gram"):
        torch.func.grad(lambda a: E.projection_gram([x], [[a]])[0].sum())(v)
    with pytest.raises(NotImplementedError, match="projection_solve"):
        torch.func.grad(lambda G: E.projection_solve(G, torch.ones(1, dtype=D)).sum())(
            torch.ones(1, 1, dtype=D) * 2)
    with pytest.raises(NotImplementedError, match="projection_solve"):
        E.projection_solve(torch.eye(1, dtype=D), torch.ones(1, dtype=D, requires_grad=True))
    xr = x.clone().requires_grad_()
    with pytest.raises(NotImplementedError, match="requires grad"):
        E.projection_gram([xr], [[v]])
    with torch.no_grad():   # read-only use of tensors that require grad
        G, b = E.projection_gram([xr], [[v]])
    torch.testing.assert_close(b, (x @ v).reshape(1))


# ------------------------------------------------------------------ 6. scalars, flags, docs
def test_numpy_real_scalars_and_huge_integers():
    g = torch.tensor([1.0, 2.0], dtype=D)
    V = torch.tensor([[1.0, 0.0]], dtype=D)
    ref = E.project_orthogonal(g, V, ridge=0.1, rcond=1e-7)
    for ridge in (np.float32(0.1), np.float64(0.1)):
        torch.testing.assert_close(E.project_orthogonal(g, V, ridge=ridge, rcond=np.float32(1e-7))[0],
                                   ref[0], rtol=1e-6, atol=0)
    for kw in (dict(ridge=10**400), dict(rcond=10**400)):
        with pytest.raises(ValueError, match="beyond the float range"):
            E.project_orthogonal(g, V, **kw)
    with pytest.raises(ValueError, match="beyond the float range"):
        E.projection_solve(torch.eye(1, dtype=D), torch.ones(1, dtype=D), shift=10**400)
    lam = torch.zeros(2, dtype=D)
    with pytest.raises(ValueError, match="beyond the float range"):
        E.dual_update_(lam, g, 10**400)
    with pytest.raises(ValueError, match="beyond the float range"):
        E.augmented_lagrangian_term(g, lam, 10**400)
    E.dual_update_(lam, g, np.float32(2.0))   # a float mu is accepted (the docstring says so)
    assert lam.tolist() == [2.0, 4.0]


def test_bool_flags_are_checked():
    lam, g = torch.zeros(2, dtype=D), torch.ones(2, dtype=D)
    with pytest.raises(TypeError, match="check_finite must be True or False"):
        E.dual_update_(lam, g, 1.0, check_finite="no")
    assert lam.tolist() == [0.0, 0.0]
    E.dual_update_(lam, g, 1.0, check_finite=np.bool_(True))
    u = torch.randn(4, dtype=D)
    with pytest.raises(TypeError, match="validate must be True or False"):
        E.wasserstein2_1d(u, u, validate="no")
    with pytest.raises(TypeError, match="validate must be True or False"):
        E.wasserstein2_1d(u, u, validate=1)


def test_bad_reduction_is_checked_before_the_kernel(monkeypatch):
    u = torch.tensor([1.0, float("nan")], dtype=D)   # the kernel would raise on NaN first
    with pytest.raises(ValueError, match="reduction"):
        E.wasserstein2_1d(u, u, reduction="max")
    with pytest.raises(ValueError, match="reduction"):
        E.wasserstein2_1d(u, u, reduction=None)


def test_documented_coefficients_of_dependent_rows():
    """README / docs: c = S (S G S)^+ S V g, not pinv(G) V g, for dependent rows; out agrees."""
    V = torch.tensor([[1.0, 0.0], [2.0, 0.0]], dtype=D)
    g = torch.tensor([1.0, 0.0], dtype=D)
    out, c = E.project_orthogonal(g, V)
    torch.testing.assert_close(c, torch.tensor([0.5, 0.25], dtype=D))
    torch.testing.assert_close(out, torch.zeros(2, dtype=D))
    torch.testing.assert_close(V.T @ c, g)


def test_documented_coefficient_overflow_keeps_out_right():
    g = torch.tensor([1.0, 1.0], dtype=D)
    V = torch.tensor([[5e-324, 0.0]], dtype=D)
    out, c = E.project_orthogonal(g, V)
    torch.testing.assert_close(out, torch.tensor([0.0, 1.0], dtype=D))
    assert torch.isinf(c).all()   # documented: beyond the float64 range


def test_the_references_take_the_operators_keywords():
    """The operators' errors name entangle_ext.reference.<op> as the fallback, promised to take the
    same arguments; max_seqlen / validate / check_finite / process_group=None raised TypeError."""
    from entangle_ext import reference as R
    u, v = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    torch.testing.assert_close(R.wasserstein2_1d(u, v, max_seqlen=8, validate=False), R.wasserstein2_1d(u, v))
    lam = torch.zeros(2, dtype=torch.float64)
    R.dual_update_(lam, torch.ones(2, dtype=torch.float64), 2.0, check_finite=False)
    assert lam.tolist() == [2.0, 2.0]
    g, b = torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    R.project_orthogonal_([g], [[b]], process_group=None)
    assert abs(float(g @ b)) < 1e-12
    with pytest.raises(NotImplementedError, match="process_group must be None"):
        R.project_orthogonal_([g], [[b]], process_group=object())
