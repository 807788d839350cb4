"""The memory-overlap check of the raw in-place operators (``torch.ops.entangle_ext.*``) runs in
the backend kernels (csrc/overlap.h), so it holds on every dispatch path: grad mode, no_grad, and
``torch.inference_mode()``, which skips the Autograd kernel where the check used to live (there an
aliased call silently computed a wrong result; each operator in each mode:
test_review_contracts.py::test_raw_inplace_refuses_aliasing). Property-tested against a brute force."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

import entangle_ext as ee

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")

D = torch.float64
ops = torch.ops.entangle_ext


def test_raw_messages_name_the_entries_in_inference_mode():
    with torch.inference_mode():
        x, v = torch.randn(6, dtype=D), torch.randn(3, dtype=D)
        with pytest.raises(ValueError, match=r"project_orthogonal_: grads\[0\] and grads\[1\] overlap in memory"):
            ops.project_orthogonal_([x[:4], x[2:5]], [torch.randn(4, dtype=D), v], None, 0.0)
        g = [torch.randn(3, dtype=D), torch.randn(3, dtype=D)]
        with pytest.raises(ValueError, match=r"basis\[3\] shares memory with grads\[1\]"):   # flat k*T list
            ops.project_orthogonal_(g, [torch.randn(3, dtype=D), torch.randn(3, dtype=D),
                                        torch.randn(3, dtype=D), g[1]], None, 0.0)
        c = torch.ones(2, dtype=D)
        with pytest.raises(ValueError, match=r"scale shares memory with grads\[0\]"):
            gs = torch.randn(4, dtype=D)
            ops.projection_apply_([gs[:2]], [v[:2], v[1:]], c, gs[1:3])
        lam = torch.zeros(3, dtype=D)
        with pytest.raises(ValueError, match="dual_update_: mu shares memory with lam"):
            ops.dual_update_(lam, torch.ones(3, dtype=D), lam[2], "equality", None, None, 0.0, False)


@settings(max_examples=60, deadline=None)
@given(spec=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 8), st.integers(0, 30)),
                     min_size=1, max_size=5))
def test_raw_check_matches_brute_force_in_inference_mode(spec):
    """grads[t] = buf[a_t : a_t + n_t], basis[t] = buf[b_t : b_t + n_t] (k = 1) of one buffer:
    refused iff a written interval meets another written one or a read one."""
    buf = torch.randn(40, dtype=D)
    grads = [buf[a:a + n] for a, n, _ in spec]
    basis = [buf[b:b + n] for _, n, b in spec]
    iv = [(a, a + n) for a, n, _ in spec] + [(b, b + n) for _, n, b in spec]
    nw = len(spec)
    want = any(iv[i][0] < iv[j][1] and iv[j][0] < iv[i][1]
               for i in range(len(iv)) for j in range(i + 1, len(iv)) if i < nw)
    with torch.inference_mode():
        try:
            ops.projection_apply_(grads, basis, torch.zeros(1, dtype=D))
            got = False
        except ValueError as e:
            assert "overlap in memory" in str(e) or "shares memory with" in str(e)
            got = True
    assert got == want
