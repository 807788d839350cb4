"""The in-place operators refuse tensors that share memory (`project_orthogonal_`,
`projection_apply_`, `dual_update_`): two written tensors that overlap, or a read tensor that
aliases a written one, would be read after being written (a silently wrong result). The check is
host-side, from metadata only (entangle_ext._overlap); property-tested against a brute force."""
import pytest
import torch
from hypothesis import given, strategies as st

import entangle_ext as ee
from entangle_ext._overlap import first_overlap

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")

D = torch.float64


def _addresses(x):
    """The byte address of every element of x (brute force from sizes and strides)."""
    offs = torch.zeros((), dtype=torch.long)
    for d, (n, s) in enumerate(zip(x.shape, x.stride())):
        offs = offs.unsqueeze(-1) + torch.arange(n) * s      # row-major over the dims
    return [x.data_ptr() + int(o) * x.element_size() for o in offs.reshape(-1).tolist()]


def _reference(ts, nw):
    """Pairs (i, j), i < j, of dense tensors that share an element, at least one written."""
    addr = [_addresses(x) for x in ts]
    es = [x.element_size() for x in ts]
    dense = [not a or (len(set(a)) == len(a) and (max(a) - min(a)) // e + 1 == len(a))
             for a, e in zip(addr, es)]
    return {(i, j) for i in range(len(ts)) for j in range(i + 1, len(ts))
            if (i < nw or j < nw) and dense[i] and dense[j] and set(addr[i]) & set(addr[j])}


@given(spec=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 12), st.sampled_from([1, 2]),
                               st.booleans()), min_size=1, max_size=40),
       n_written=st.integers(0, 40))
def test_first_overlap_matches_brute_force(spec, n_written):
    """Slices (start, length, step, 2-D?) of one buffer: a pair is reported iff one exists (both
    dense), and the pair reported does share memory. Step 2 makes non-dense views, which the
    operators refuse themselves: only pairs of dense tensors count."""
    buf = torch.zeros(80, dtype=D)
    ts = []
    for start, length, step, two_d in spec:
        x = buf[start:start + step * length:step]
        if two_d and step == 1 and length % 2 == 0 and length:
            x = x.reshape(2, length // 2).T          # dense, transposed: not contiguous
        ts.append(x)
    nw = min(n_written, len(ts))
    want = _reference(ts, nw)
    got = first_overlap(ts[:nw], ts[nw:])
    if not want:
        assert got is None
    else:
        assert got is not None and tuple(sorted(got)) in want


def test_many_tensors_without_overlap_pass_and_one_alias_is_found():
    """The vectorised screen (used from a few dozen tensors on) and the sweep agree."""
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(int(n), generator=gen) for n in torch.randint(1, 50, (150,), generator=gen)]
    basis = [[torch.randn_like(g) for g in grads] for _ in range(2)]
    ee.project_orthogonal_(grads, basis)
    basis[1][77] = grads[77][1:]     # a view into grads[77], the last basis row
    with pytest.raises(ValueError, match=r"basis\[1\]\[77\] shares memory with grads\[77\]"):
        ee.project_orthogonal_(grads, basis)


@pytest.mark.parametrize("op", ["project_orthogonal_", "projection_apply_"])
def test_overlapping_gradients_are_refused(op):
    x, y = torch.randn(6, dtype=D), torch.randn(5, dtype=D)
    a, b = torch.randn(4, dtype=D), torch.randn(4, dtype=D)
    c = torch.tensor([0.5], dtype=D)

    def call(grads, basis):
        if op == "project_orthogonal_":
            return ee.project_orthogonal_(grads, basis)
        return ee.projection_apply_(grads, basis, c)

    before = x.clone()
    with pytest.raises(ValueError, match=r"grads\[0\] and grads\[1\] overlap in memory"):
        call([x[:4], x[2:]], [[a, b]])
    assert torch.equal(x, before)    # refused before anything was written
    with pytest.raises(ValueError, match=r"grads\[0\] and grads\[2\] overlap"):
        call([y, None, y], [[y.clone(), None, y.clone()]])
    with pytest.raises(ValueError, match=r"basis\[0\]\[0\] shares memory with grads\[0\]"):
        call([y], [[y]])
    with pytest.raises(ValueError, match=r"basis\[0\]\[1\] shares memory with grads\[0\]"):
        call([x[:3], torch.randn(3, dtype=D)], [[torch.randn(3, dtype=D), x[2:5]]])
    # what stays allowed: basis tensors that share memory with each other, adjacent slices of one
    # buffer, empty tensors, and views of the same storage that do not intersect
    z = torch.randn(10, dtype=D)
    call([z[:5], z[5:], z[5:5]], [[a[:1].expand(5).clone(), a[:1].expand(5).clone(), z[:0]]])
    shared = torch.randn(5, dtype=D)
    ee.project_orthogonal_([torch.randn(5, dtype=D)], [[shared], [shared]])


@pytest.mark.parametrize("op", ["project_orthogonal_", "projection_apply_", "projection_gram"])
def test_tensors_on_another_device_are_a_device_error_not_an_overlap(op):
    """Two meta tensors both start at address 0: a cpu + meta list was refused as "basis[0][1]
    shares memory with grads[1]" instead of naming the device mismatch (projection_gram did)."""
    grads = [torch.randn(3, dtype=D), torch.empty(3, dtype=D, device="meta")]
    basis = [[torch.randn(3, dtype=D), torch.empty(3, dtype=D, device="meta")]]
    calls = {"project_orthogonal_": lambda: ee.project_orthogonal_(grads, basis),
             "projection_apply_": lambda: ee.projection_apply_(grads, basis, torch.ones(1, dtype=D)),
             "projection_gram": lambda: ee.projection_gram(grads, basis)}
    with pytest.raises(ValueError, match=r"grads\[1\] is on meta but grads\[0\] is on cpu"):
        calls[op]()


def test_coeffs_aliasing_gradients_are_refused():
    g = torch.randn(5, dtype=D)
    with pytest.raises(ValueError, match=r"coeffs shares memory with grads\[0\]"):
        ee.projection_apply_([g], [[torch.randn(5, dtype=D)]], g[:1])


def test_layouts_keep_their_own_messages():
    """A strided view is refused for what it is, not reported as an overlap."""
    x = torch.randn(8)
    with pytest.raises(ValueError, match="dense and non-overlapping"):
        ee.project_orthogonal_([x[::2], x[1::2]], [[torch.randn(8)[::2], torch.randn(8)[::2]]])
    t = torch.randn(4, 6)     # a transposed (dense) view overlapping its base is an overlap
    with pytest.raises(ValueError, match="overlap in memory"):
        ee.project_orthogonal_([t, t.T], [[torch.randn(4, 6), torch.randn(6, 4)]])


def test_read_only_operators_accept_shared_memory():
    """projection_gram and project_orthogonal write nothing of the caller's: no check."""
    y = torch.randn(5, dtype=D)
    G, b = ee.projection_gram([y, y], [[y, y]])
    torch.testing.assert_close(G, 2 * (y @ y).reshape(1, 1))
    V = torch.randn(2, 5, dtype=D)
    out, _ = ee.project_orthogonal(V[0], V)
    torch.testing.assert_close(out, torch.zeros(5, dtype=D), rtol=0, atol=1e-12)


def test_meta_and_fake_tensors_skip_the_check():
    """No data pointers: the check is skipped (every meta pointer is 0), the fake kernels run."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    m = torch.empty(3, device="meta")
    c = ee.project_orthogonal_([m, torch.empty(3, device="meta")], [[m, m]])
    assert c.shape == (1,) and c.device.type == "meta"
    with FakeTensorMode():
        g = [torch.empty(4), torch.empty(3)]
        c = ee.project_orthogonal_(g, [[torch.empty(4), torch.empty(3)]])
        assert c.shape == (1,)


def test_dual_update_refuses_aliasing_multipliers():
    lam = torch.zeros(4, dtype=D)
    with pytest.raises(ValueError, match="g shares memory with lam"):
        ee.dual_update_(lam, lam, 1.0)
    buf = torch.ones(5, dtype=D)
    with pytest.raises(ValueError, match="g shares memory with lam"):
        ee.dual_update_(buf[:4], buf[1:], 1.0)
    with pytest.raises(ValueError, match="mu shares memory with lam"):
        ee.dual_update_(buf[1:], torch.ones(4, dtype=D), buf[1])
    assert torch.equal(buf, torch.ones(5, dtype=D))
    al = ee.AugmentedLagrangian(torch.zeros(2, dtype=D))
    with pytest.raises(ValueError, match="g shares memory with lam"):
        al.update(al.lam)
    ee.dual_update_(buf[:2], buf[2:4], buf[4])    # disjoint slices of one buffer are fine
    assert buf.tolist() == [2.0, 2.0, 1.0, 1.0, 1.0]
