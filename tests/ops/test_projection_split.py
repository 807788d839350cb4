"""The two passes of the projection as public operators (projection_gram, projection_solve,
projection_apply_) and the sharded project_orthogonal_(process_group=...) (docs/algorithm.md §5):
partial sums over any sharding add up to the unsharded Gram, the split chain equals the fused
operator, and a 2-process gloo run equals one process."""
import os
import tempfile

import pytest
import torch
from hypothesis import given, strategies as st

import entangle_ext as ee
from entangle_ext import reference as ref

from _tiny import flat_of, make_lists

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")

D = torch.float64


def shard(grads, basis, cuts, owner):
    """Split every tensor (flattened) at cuts[t] into two pieces, then give each piece to a shard."""
    shards = [([], [[] for _ in basis]) for _ in range(3)]
    for t, x in enumerate(grads):
        c = cuts[t] % (x.numel() + 1)
        for p, (lo, hi) in enumerate(((0, c), (c, x.numel()))):
            s = owner[(2 * t + p) % len(owner)]
            shards[s][0].append(x.reshape(-1)[lo:hi])
            for i, r in enumerate(basis):
                shards[s][1][i].append(r[t].reshape(-1)[lo:hi])
    return [s for s in shards if s[0]]


@given(sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=7), k=st.integers(1, 8),
       seed=st.integers(0, 2**31 - 1), data=st.data())
def test_partials_over_any_sharding_sum_to_the_gram(sizes, k, seed, data):
    gen = torch.Generator().manual_seed(seed)
    grads, basis = make_lists([(n,) for n in sizes], k, gen)
    cuts = data.draw(st.lists(st.integers(0, 5000), min_size=len(sizes), max_size=len(sizes)))
    owner = data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=14))
    G, b = ee.projection_gram(grads, basis)
    G_ref, b_ref = ref.projection_gram(grads, basis)
    scale = max(G_ref.diagonal().max().item(), 1.0)
    torch.testing.assert_close(G, G_ref, rtol=0, atol=1e-12 * scale)
    torch.testing.assert_close(b, b_ref, rtol=0, atol=1e-12 * scale)
    assert torch.equal(G, G.T)
    parts = [ee.projection_gram(gs, bs) for gs, bs in shard(grads, basis, cuts, owner)]
    torch.testing.assert_close(sum(p[0] for p in parts), G, rtol=0, atol=1e-12 * scale)
    torch.testing.assert_close(sum(p[1] for p in parts), b, rtol=0, atol=1e-12 * scale)
    # apply with the coefficients of the summed partials == the fused operator
    c = ee.projection_solve(sum(p[0] for p in parts), sum(p[1] for p in parts))
    split = [x.clone() for x in grads]
    for gs, bs in shard(split, basis, cuts, owner):
        ee.projection_apply_(gs, bs, c)
    fused = [x.clone() for x in grads]
    c_fused = ee.project_orthogonal_(fused, basis)
    torch.testing.assert_close(c, c_fused, rtol=1e-7, atol=1e-9)
    gn = max(flat_of(grads).norm().item(), 1.0)
    torch.testing.assert_close(flat_of(split), flat_of(fused), rtol=0, atol=1e-10 * gn)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_split_chain_is_bitwise_the_fused_operator(device, dtype):
    """One solve and one pass 2 shared with the fused kernels: same Gram -> same bits."""
    gen = torch.Generator().manual_seed(1)
    grads, basis = make_lists([(40000,), (3, 5), (0,), (70001,)], 3, gen, dtype, device)
    fused = [x.clone() for x in grads]
    c_fused = ee.project_orthogonal_(fused, basis, rcond=1e-9, ridge=1e-3)
    G, b = ee.projection_gram(grads, basis)
    c = ee.projection_solve(G, b, rcond=1e-9, shift=1e-3 * len(grads))
    assert torch.equal(c, c_fused)
    split = [x.clone() for x in grads]
    ee.projection_apply_(split, basis, c_fused)
    assert all(torch.equal(a, f) for a, f in zip(split, fused))


def test_solve_matches_reference_and_handles_degenerate_grams():
    gen = torch.Generator().manual_seed(2)
    V = torch.randn(4, 50, generator=gen, dtype=D)
    g = torch.randn(50, generator=gen, dtype=D)
    for W in (V, torch.stack([V[0], V[0], V[1] * 1e-5, torch.zeros(50, dtype=D)])):
        G, b = W @ W.T, W @ g
        for shift in (0.0, 1e-3):
            c = ee.projection_solve(G, b, shift=shift)
            torch.testing.assert_close(c, ref.projection_solve(G, b, shift=shift), rtol=1e-9, atol=1e-12)
            assert torch.isfinite(c).all()
    c = ee.projection_solve(G.float(), b.float())  # converted to float64
    assert c.dtype == D


@pytest.mark.parametrize("scale", [1e-310, 5e-324, 1e-300, 1e-200, 1.0, 1e200, 1e300])
def test_solve_does_not_depend_on_the_scale_of_the_gram(scale):
    """c = G^+ b is the same for (s G, s b) at any s: a subnormal Gram (rows of magnitude ~1e-155)
    gave c = 0, since the equilibration's s_i s_j overflowed to inf and the row was dropped."""
    G = torch.tensor([[4.0, 2.0], [2.0, 3.0]], dtype=D)
    b = torch.tensor([1.0, 2.0], dtype=D)
    want = torch.linalg.solve(G, b)
    got = ee.projection_solve(G * scale, b * scale)
    rtol = 1e-6 if scale < 1e-307 else 1e-12   # subnormal inputs carry fewer significant bits
    torch.testing.assert_close(got, want, rtol=rtol, atol=0)
    one = ee.projection_solve(torch.tensor([[scale]], dtype=D), torch.tensor([scale], dtype=D))
    torch.testing.assert_close(one, torch.ones(1, dtype=D), rtol=rtol, atol=0)


def test_split_opcheck():
    gen = torch.Generator().manual_seed(3)
    grads, basis = make_lists([(4, 5), (0,), (9,)], 2, gen)
    flat = [v for r in basis for v in r]
    ops = torch.ops.entangle_ext
    torch.library.opcheck(ops.projection_gram.default, (grads, flat))
    torch.library.opcheck(ops.projection_gram.default, (grads, flat, torch.tensor([2.0, 0.5, 4.0], dtype=D)))
    c = torch.tensor([0.3, -0.2], dtype=D)
    torch.library.opcheck(ops.projection_apply_.default, ([x.clone() for x in grads], flat, c))
    torch.library.opcheck(ops.projection_apply_.default, ([x.clone() for x in grads], flat, c,
                                                          torch.tensor([2.0, 0.5], dtype=D)))
    G, b = ee.projection_gram(grads, basis)
    torch.library.opcheck(ops.projection_solve.default, (G, b))
    torch.library.opcheck(ops.projection_solve.default, (G, b, 1e-9, 0.5))
    torch.library.opcheck(ops.project_orthogonal_.default, ([x.clone() for x in grads], flat, None, 1e-8))


def test_scale_argument_of_the_raw_passes():
    gen = torch.Generator().manual_seed(4)
    grads, basis = make_lists([(100,), (7,)], 2, gen)
    s = torch.tensor([2.0 ** 10, 2.0 ** -3, 2.0 ** 5], dtype=D)
    G, b = torch.ops.entangle_ext.projection_gram(grads, [v for r in basis for v in r], s)
    G0, b0 = ee.projection_gram(grads, basis)
    torch.testing.assert_close(G, G0 * s[:2, None] * s[None, :2], rtol=1e-14, atol=0)
    torch.testing.assert_close(b, b0 * s[:2] * s[2], rtol=1e-14, atol=0)
    work, want = [x.clone() for x in grads], [x.clone() for x in grads]
    c = torch.tensor([0.5, -1.5], dtype=D)
    torch.ops.entangle_ext.projection_apply_(work, [v for r in basis for v in r], c, s[:2])
    ee.projection_apply_(want, basis, c * s[:2])
    torch.testing.assert_close(flat_of(work), flat_of(want), rtol=1e-14, atol=1e-14)


def test_split_errors():
    a, b = torch.randn(3, 4, dtype=D), torch.randn(5, dtype=D)
    basis = [[a.clone(), b.clone()]]    # must not alias the gradients
    with pytest.raises(ValueError, match="coeffs must have shape"):
        ee.projection_apply_([a, b], basis, torch.zeros(2, dtype=D))
    with pytest.raises(TypeError, match="coeffs must be float64"):
        ee.projection_apply_([a, b], basis, torch.zeros(1))
    with pytest.raises(TypeError, match="coeffs must be a torch.Tensor"):
        ee.projection_apply_([a, b], basis, [0.5])
    # every gradient None: nothing is written, the coefficients are still checked
    with pytest.raises(ValueError, match=r"coeffs must have shape \(1,\)"):
        ee.projection_apply_([None, None], [[None, None]], torch.zeros(7, dtype=D))
    with pytest.raises(TypeError, match="coeffs must be float64"):
        ee.projection_apply_([None], [[None]], torch.zeros(1))
    ee.projection_apply_([None], [[None]], torch.zeros(1, dtype=D))
    with pytest.raises(ValueError, match="scale must have shape"):
        torch.ops.entangle_ext.projection_gram([a], [a], torch.ones(1, dtype=D))
    with pytest.raises(ValueError, match="gram must be"):
        ee.projection_solve(torch.zeros(2, 3, dtype=D), torch.zeros(2, dtype=D))
    with pytest.raises(ValueError, match="gram must be"):
        ee.projection_solve(torch.zeros(9, 9, dtype=D), torch.zeros(9, dtype=D))
    with pytest.raises(ValueError, match="vg must have shape"):
        ee.projection_solve(torch.eye(2, dtype=D), torch.zeros(3, dtype=D))
    with pytest.raises(ValueError, match="shift"):
        ee.projection_solve(torch.eye(2, dtype=D), torch.zeros(2, dtype=D), shift=-1.0)
    with pytest.raises(TypeError, match="floating-point"):
        ee.projection_solve(torch.eye(2, dtype=torch.long), torch.zeros(2, dtype=D))
    with pytest.raises(ValueError, match="require grad"):
        ee.projection_apply_([a.clone().requires_grad_(True)], [[a]], torch.zeros(1, dtype=D))
    with pytest.raises(NotImplementedError, match="requires grad"):   # would be a zero gradient
        ee.projection_gram([a.clone().requires_grad_(True)], [[a]])
    with torch.no_grad():   # read only, without grad mode: allowed
        G, _ = ee.projection_gram([a.clone().requires_grad_(True)], [[a]])
    assert not G.requires_grad



@pytest.mark.parametrize("group", ["x", 0, object()])
def test_process_group_that_is_not_a_group_names_the_argument(group):
    """TypeError naming process_group, before anything is computed (was an AttributeError from
    inside the sharded path); the gradients are left unchanged."""
    g = torch.ones(3, dtype=D)
    with pytest.raises(TypeError, match="^project_orthogonal_: process_group must be a "
                                        "torch.distributed ProcessGroup or None, got "):
        ee.project_orthogonal_([g], [[torch.arange(3.0, dtype=D)]], process_group=group)
    assert torch.equal(g, torch.ones(3, dtype=D))


# ------------------------------------------------------------------------------ torch.distributed
def _worker(rank, world, init_file, out_dir):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        gen = torch.Generator().manual_seed(7)
        cases = [(torch.float32, 2, 0.0, 1.0), (torch.float64, 3, 1e-2, 1.0),
                 (torch.float64, 2, 0.0, 1e200), (torch.float32, 8, 1e-8, 1.0)]
        results = []
        for dtype, k, ridge, big in cases:
            shapes = [(1000,), (4, 9), (0,), (33333,), (5,)]
            grads, basis = make_lists(shapes, k, gen, dtype)
            basis[0] = [v * big for v in basis[0]]
            full = [x.clone() for x in grads]
            c_full = ee.project_orthogonal_(full, basis, ridge=ridge)
            # FSDP-like: every rank holds a contiguous slice of every tensor (maybe empty)
            mine = [x.reshape(-1).tensor_split(world)[rank].clone() for x in grads]
            mine_b = [[v.reshape(-1).tensor_split(world)[rank] for v in r] for r in basis]
            c = ee.project_orthogonal_(mine, mine_b, ridge=ridge, process_group=dist.group.WORLD)
            want = [x.reshape(-1).tensor_split(world)[rank] for x in full]
            results.append((c, c_full, mine, want))
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_two_process_gloo_sharded_projection_equals_one_process():
    import torch.distributed as dist
    import torch.multiprocessing as mp
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(2, os.path.join(tmp, "init"), tmp), nprocs=2, join=True)
        for rank in range(2):
            for c, c_full, mine, want in torch.load(os.path.join(tmp, f"rank{rank}.pt")):
                torch.testing.assert_close(c, c_full, rtol=1e-6 if c.dtype != D else 1e-9, atol=0)
                got, exp = flat_of(mine).double(), flat_of(want).double()
                tol = 1e-5 if mine[0].dtype == torch.float32 else 1e-11
                assert got.shape == exp.shape and exp.abs().max() > 0
                assert ((got - exp).abs().max() <= tol * exp.abs().max()).item()


@pytest.mark.parametrize("where", ["diag", "lower", "upper", "vg"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_solve_turns_non_finite_input_into_nan(device, where, bad):
    """A NaN/Inf anywhere in G or b gives NaN coefficients (device-side, no host sync), not the
    finite, plausible answer of a solve that drops the row (e.g. [0, 1] for a NaN G[0, 0])."""
    G = torch.tensor([[2.0, 0.5, 0.0], [0.5, 1.0, 0.2], [0.0, 0.2, 3.0]], dtype=D, device=device)
    b = torch.tensor([1.0, -1.0, 0.5], dtype=D, device=device)
    good = ee.projection_solve(G, b)
    assert torch.isfinite(good).all()
    if where == "vg":
        b[2] = bad
    else:
        G[{"diag": (0, 0), "lower": (2, 1), "upper": (1, 2)}[where]] = bad
    c = ee.projection_solve(G, b, shift=0.5)
    assert c.shape == (3,) and c.dtype == D and c.isnan().all()
    assert c.device == G.device
    c32 = ee.projection_solve(G.float(), b.float())   # converted to float64 first: same rule
    assert c32.isnan().all()
