"""The in-place operators bump the version counter of every tensor they write (`dual_update_`,
`project_orthogonal_`, `projection_apply_`), as ATen's in-place ops do: autograd then refuses a
backward through a tensor saved before the write instead of silently using the new values (a λ
saved by the penalty term and then moved by the dual step gave the gradient of the *updated* λ).
The raw ``torch.ops`` calls bump it too (the ADInplaceOrView kernel in csrc/registration.cpp)."""
import pytest
import torch

import entangle_ext as ee

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")

D = torch.float64
STALE = "modified by an inplace operation"


def test_dual_update_bumps_the_multipliers_version_and_autograd_refuses_the_stale_term():
    lam = torch.ones(2, dtype=D)
    g = torch.tensor([1.0, 2.0], dtype=D, requires_grad=True)
    term = ee.augmented_lagrangian_term(g, lam, 1.0)        # saves lam for its backward
    v = lam._version
    ee.dual_update_(lam, g.detach(), 1.0)
    assert lam._version == v + 1 and torch.equal(lam, torch.tensor([2.0, 3.0], dtype=D))
    with pytest.raises(RuntimeError, match=STALE):
        term.backward()


def test_augmented_lagrangian_update_before_backward_is_refused_and_after_is_right():
    """The documented order (backward, step, then update) gives lam + mu g's gradient of the λ
    used in the forward; updating first is refused, not answered with the new λ."""
    al = ee.AugmentedLagrangian(torch.zeros(2, dtype=D), mu=1.0, dtype=D)
    x = torch.tensor([1.0, 2.0], dtype=D, requires_grad=True)
    al.penalty(al.constraint(x)).backward()
    al.update()                                            # lam = [1, 2] now
    loss = al.penalty(al.constraint(x))
    x.grad = None
    loss.backward(retain_graph=True)
    assert torch.allclose(x.grad, torch.tensor([2.0, 4.0], dtype=D))   # lam + mu g with lam = [1, 2]
    al.update()
    with pytest.raises(RuntimeError, match=STALE):
        loss.backward()


def test_project_orthogonal_bumps_every_written_gradient():
    x = torch.randn(5, dtype=D, requires_grad=True)
    y = x * 1.0
    z = (y ** 2).sum()                                     # saves y
    basis = [[torch.randn(5, dtype=D)], [torch.randn(5, dtype=D)]]
    other = torch.randn(3, dtype=D)
    v, w = y._version, other._version
    with torch.no_grad():
        ee.project_orthogonal_([y, other], [[b[0], torch.randn(3, dtype=D)] for b in basis])
    assert y._version == v + 1 and other._version == w + 1
    with pytest.raises(RuntimeError, match=STALE):
        z.backward()


def test_projection_apply_bumps_and_none_entries_are_skipped():
    a, b = torch.randn(4, dtype=D), torch.randn(2, dtype=D)
    basis = [[torch.randn(4, dtype=D), None, torch.randn(2, dtype=D)]]
    va, vb = a._version, b._version
    ee.projection_apply_([a, None, b], basis, torch.tensor([0.5], dtype=D))
    assert (a._version, b._version) == (va + 1, vb + 1)


def test_raw_operators_bump_too():
    lam, g, mu = torch.zeros(3, dtype=D), torch.ones(3, dtype=D), torch.tensor(1.0, dtype=D)
    v = lam._version
    torch.ops.entangle_ext.dual_update_(lam, g, mu, "equality", None, None, 0.0, False)
    assert lam._version == v + 1 and torch.equal(lam, g)
    grad, basis = torch.randn(6, dtype=D), torch.randn(6, dtype=D)
    v = grad._version
    torch.ops.entangle_ext.project_orthogonal_([grad], [basis])
    assert grad._version == v + 1
    assert abs(float(grad @ basis)) < 1e-12 * float(basis.norm()) * max(1.0, float(grad.norm()))
    v = grad._version
    torch.ops.entangle_ext.projection_apply_([grad], [basis], torch.tensor([1.0], dtype=D))
    assert grad._version == v + 1


def test_out_of_place_operators_leave_versions_alone():
    g, basis = torch.randn(6, dtype=D), torch.randn(1, 6, dtype=D)
    vg, vb = g._version, basis._version
    ee.project_orthogonal(g, basis)
    ee.projection_gram([g], [[basis[0]]])
    assert (g._version, basis._version) == (vg, vb)
