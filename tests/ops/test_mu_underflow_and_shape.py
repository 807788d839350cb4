"""A penalty mu that rounds to 0 in the multipliers' dtype (1e-50 in float32) is refused where it
is given: it was accepted by `AugmentedLagrangian`, its setter and `dual_update_` (which then left
lam at 0, a step with mu = 0) and refused only later, after an optimizer step, by `penalty`. And
the raw operators refuse a (1,) mu for m > 1 as the wrappers do (they broadcast it)."""
import pytest
import torch

import entangle_ext as ee

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")


@pytest.mark.parametrize("call", [
    lambda: ee.AugmentedLagrangian(torch.tensor([1.0]), mu=1e-50),
    lambda: setattr(ee.AugmentedLagrangian(torch.tensor([1.0]), mu=1.0), "mu", 1e-50),
    lambda: ee.dual_update_(torch.zeros(1), torch.tensor([1.0]), 1e-50),
    lambda: ee.augmented_lagrangian_term(torch.tensor([1.0], requires_grad=True), torch.zeros(1), 1e-50),
])
def test_a_mu_that_underflows_in_float32_is_refused_where_it_is_given(call):
    with pytest.raises(ValueError, match=r"mu.*1e-50.*(underflows to 0|> 0)"):
        call()


def test_the_same_mu_is_fine_where_it_is_representable():
    al = ee.AugmentedLagrangian(torch.tensor([1.0], dtype=torch.float64), mu=1e-50)
    assert float(al.mu) == 1e-50
    lam = torch.zeros(1)
    ee.dual_update_(lam, torch.tensor([1.0]), 1e-40)   # a float32 subnormal: > 0 there
    assert float(lam) > 0


@pytest.mark.parametrize("name", ["dual_update_", "augmented_lagrangian"])
def test_raw_operators_refuse_a_one_element_mu_for_several_constraints(name):
    lam, g = torch.zeros(3), torch.tensor([1.0, 2.0, 3.0])
    op = getattr(torch.ops.entangle_ext, name)
    args = (lam, g, torch.tensor([5.0]), "equality", None, None, 0.0, True) if name == "dual_update_" else \
        (g, lam, torch.tensor([5.0]), "equality")
    with pytest.raises(ValueError, match=r"mu must have shape \(\) or \(m,\) = \(3,\), got \(1,\) "
                                         r"\(a \(1,\) mu is not broadcast: give a 0-d one\)"):
        op(*args)
    assert torch.equal(lam, torch.zeros(3))
    one = (torch.zeros(1), torch.tensor([2.0]), torch.tensor([5.0]))   # m = 1: (1,) is (m,)
    if name == "dual_update_":
        op(one[0], one[1], one[2], "equality", None, None, 0.0, True)
        assert torch.equal(one[0], torch.tensor([10.0]))
    else:
        assert float(op(one[1], one[0], one[2], "equality")) == pytest.approx(10.0)


def test_a_finite_lam_beyond_the_state_dtype_is_named_as_given():
    """A float64 lam of 1e300 loaded into a float32 instance was reported as "got [inf, 0.0]", the
    value after the cast, not the caller's finite one."""
    st = ee.AugmentedLagrangian(torch.tensor([1.0, 2.0], dtype=torch.float64)).state_dict()
    st["lam"] = torch.tensor([1e300, 0.0], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"lam must be finite in the state dtype torch.float32: \[1e\+300, 0.0\] "
                                         r"\(torch.float64\) is beyond its range"):
        ee.AugmentedLagrangian(torch.tensor([1.0, 2.0])).load_state_dict(st)
