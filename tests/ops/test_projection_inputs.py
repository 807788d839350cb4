"""Inputs a PyTorch user passes to the projection operators (docs/algorithm.md §5): memory formats
and strides, None gradients, rows of extreme scale, the ridge of the reference recipe, zero-size
inputs, the shared limits, and the CPU kernel variants and thread counts."""
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings, strategies as st

import entangle_ext as ee
from entangle_ext import _ext, projection as proj
from entangle_ext import reference as ref

from _tiny import flat_of, rand


pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")

D = torch.float64


# ------------------------------------------------------------------------------ limits
def test_limits_come_from_the_extension():
    assert proj.MAX_BASIS == _ext._C.projection_max_basis() == 8
    assert proj.DEFAULT_RCOND == _ext._C.projection_default_rcond()
    from entangle_ext.reference import projection as refproj
    assert refproj.DEFAULT_RCOND == proj.DEFAULT_RCOND
    g, V = torch.randn(50, dtype=D), torch.randn(3, 50, dtype=D)
    a, ca = ee.project_orthogonal(g, V)
    b, cb = ee.project_orthogonal(g, V, rcond=proj.DEFAULT_RCOND)
    assert torch.equal(a, b) and torch.equal(ca, cb)
    raw = torch.ops.entangle_ext.project_orthogonal
    raw(torch.randn(5), torch.randn(proj.MAX_BASIS, 5))
    with pytest.raises(ValueError, match=f"\\[1, {proj.MAX_BASIS}\\]"):
        raw(torch.randn(5), torch.randn(proj.MAX_BASIS + 1, 5))


# ------------------------------------------------------------------------------ memory layouts
@pytest.mark.parametrize("layout", ["channels_last", "transposed", "permuted3d"])
def test_strided_dense_tensors_project_like_contiguous(device, layout):
    gen = torch.Generator().manual_seed(1)

    def make(x):
        if layout == "channels_last":
            return x.reshape(4, 3, 5, 6).contiguous(memory_format=torch.channels_last)
        if layout == "transposed":
            return x.reshape(24, 15).T
        return x.reshape(6, 20, 3).permute(2, 0, 1)

    g0, v0, w0, b0 = (rand(360, gen).to(device) for _ in range(4))
    grads = [make(g0.clone()), b0[:7].clone()]
    basis = [[make(v0.clone()), v0[:7].clone()], [make(w0.clone()), w0[:7].clone()]]
    assert not grads[0].is_contiguous()
    want = [x.clone(memory_format=torch.contiguous_format) for x in grads]
    c_want = ee.project_orthogonal_(want, [[v.contiguous() for v in r] for r in basis])
    c = ee.project_orthogonal_(grads, basis)
    torch.testing.assert_close(c, c_want, rtol=1e-12, atol=1e-14)
    for a, b in zip(grads, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert not grads[0].is_contiguous()  # updated in place, layout kept


def test_incompatible_or_overlapping_layouts_are_refused():
    g = torch.randn(4, 6)
    with pytest.raises(ValueError, match="memory layout"):
        ee.project_orthogonal_([g], [[torch.randn(6, 4).T]])
    with pytest.raises(ValueError, match="dense and non-overlapping"):
        ee.project_orthogonal_([torch.randn(6).expand(4, 6)], [[torch.randn(4, 6)]])
    with pytest.raises(ValueError, match="dense and non-overlapping"):
        ee.project_orthogonal_([torch.randn(8, 6)[::2]], [[torch.randn(4, 6)]])
    with pytest.raises(ValueError, match="memory layout"):
        ee.projection_gram([g], [[torch.randn(8, 6)[::2]]])


def test_size_one_dims_may_have_any_stride():
    g = torch.randn(5, 1)
    v = torch.randn(1, 5).T  # strides differ only on dims of size 1
    want = g.clone()
    ref.project_orthogonal_([want], [[v]])
    ee.project_orthogonal_([g], [[v]])
    torch.testing.assert_close(g, want)


# ------------------------------------------------------------------------------ devices
def test_a_meta_tensor_among_cpu_tensors_is_a_device_error_not_a_no_op():
    """A meta tensor makes the dispatcher run the fake kernel: it checks the devices as the C++
    kernels do, so the list operators raise the documented ValueError (they used to return zeros
    or garbage and leave the gradients unchanged)."""
    meta = torch.ones(3, device="meta")
    msg = "basis\\[0\\]\\[0\\] is on meta but grads are on cpu"
    g = torch.ones(3)
    with pytest.raises(ValueError, match="^project_orthogonal_: " + msg):
        ee.project_orthogonal_([g], [[meta]])
    with pytest.raises(ValueError, match="^projection_gram: " + msg):
        ee.projection_gram([torch.ones(3)], [[meta]])
    with pytest.raises(ValueError, match="^projection_apply_: " + msg):
        ee.projection_apply_([g], [[meta]], torch.ones(1, dtype=D))
    with pytest.raises(ValueError, match="^projection_apply_: coeffs is on meta but the tensors are on cpu"):
        ee.projection_apply_([g], [[torch.ones(3)]], torch.ones(1, dtype=D, device="meta"))
    with pytest.raises(ValueError, match="^projection_solve: vg is on meta but the tensors are on cpu"):
        ee.projection_solve(torch.eye(1, dtype=D), torch.ones(1, dtype=D, device="meta"))
    with pytest.raises(ValueError, match="^project_orthogonal: basis is on meta but g is on cpu"):
        ee.project_orthogonal(g, meta[None])
    assert torch.equal(g, torch.ones(3))
    c = ee.project_orthogonal_([meta.clone()], [[meta]])   # all on meta: shapes only, as before
    assert c.device.type == "meta" and c.shape == (1,)


# ------------------------------------------------------------------------------ None gradients
def test_none_gradients_are_skipped_with_their_basis(device):
    gen = torch.Generator().manual_seed(2)
    shapes = [(3, 4), (7,), (5, 2)]
    g = [rand(s, gen).to(device) for s in shapes]
    V = [[rand(s, gen).to(device) for s in shapes] for _ in range(2)]
    kept = [g[0].clone(), g[2].clone()]
    c_want = ee.project_orthogonal_(kept, [[r[0], r[2]] for r in V])
    grads = [g[0].clone(), None, g[2].clone()]
    basis = [[V[0][0], None, V[0][2]], [V[1][0], V[1][1], V[1][2]]]
    c = ee.project_orthogonal_(grads, basis)
    assert grads[1] is None
    assert torch.equal(c, c_want) and torch.equal(grads[0], kept[0]) and torch.equal(grads[2], kept[1])
    G, b = ee.projection_gram(grads, basis)
    G2, b2 = ee.projection_gram(kept, [[r[0], r[2]] for r in V])
    assert torch.equal(G, G2) and torch.equal(b, b2)
    c_ref = ref.project_orthogonal_([x.clone() if x is not None else None for x in [g[0], None, g[2]]], basis)
    torch.testing.assert_close(c, c_ref.to(device), rtol=1e-9, atol=1e-12)


def test_all_none_and_missing_basis_entries():
    c = ee.project_orthogonal_([None, None], [[torch.randn(3), None]])
    assert torch.equal(c, torch.zeros(1, dtype=D))
    with pytest.raises(ValueError, match="basis\\[0\\]\\[1\\] is None"):
        ee.project_orthogonal_([torch.randn(3), torch.randn(2)], [[torch.randn(3), None]])


# ------------------------------------------------------------------------------ extreme scales
@pytest.mark.parametrize("scale", [1e160, 1e-160, 1e300, 1e-300, 2.0 ** -1070])
def test_extreme_row_scales_project_correctly(device, scale):
    gen = torch.Generator().manual_seed(3)
    g, V = rand(3000, gen), rand((3, 3000), gen)
    want, c_want = ee.project_orthogonal(g, V)
    s = torch.tensor([scale, 1.0, 1.0 / scale if scale > 1e-300 else 1e300], dtype=D)
    out, c = ee.project_orthogonal(g.to(device), (V * s[:, None]).to(device))
    tol = 1e-9 if scale != 2.0 ** -1070 else 1e-3  # subnormal rows keep only a few bits
    torch.testing.assert_close(out.cpu(), want, rtol=0, atol=tol * g.norm().item())
    if scale != 2.0 ** -1070:
        torch.testing.assert_close(c.cpu() * s, c_want, rtol=1e-8, atol=0)
    for gs in (1e200, 1e-200):  # g itself of extreme scale
        out, _ = ee.project_orthogonal((g * gs).to(device), V.to(device))
        torch.testing.assert_close(out.cpu() / gs, want, rtol=0, atol=1e-9 * g.norm().item())


def test_extreme_scales_in_lists_match_reference():
    gen = torch.Generator().manual_seed(4)
    shapes = [(40000,), (3, 7), (70001,)]
    grads = [rand(s, gen) * 1e-170 for s in shapes]
    basis = [[rand(s, gen) * 1e250 for s in shapes], [rand(s, gen) for s in shapes]]
    want = [x.clone() for x in grads]
    c_ref = ref.project_orthogonal_(want, basis)
    c = ee.project_orthogonal_(grads, basis)
    torch.testing.assert_close(c, c_ref, rtol=1e-8, atol=0)
    got, exp = flat_of(grads) * 1e170, flat_of(want) * 1e170  # norms of 1e-170 values underflow
    assert exp.norm() > 0.1 * flat_of(basis[1]).norm()
    assert (got - exp).norm() <= 1e-9 * exp.norm()


# ------------------------------------------------------------------------------ ridge
@given(k=st.integers(1, 4), seed=st.integers(0, 2**31 - 1), ridge=st.sampled_from([1e-8, 1e-3, 1.0, 50.0]))
def test_ridge_matches_reference_recipe(k, seed, ridge):
    """The reference code: c = solve(G + ridge * T * I, V g), T = number of parameter tensors."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(7,), (3, 2), (11,)]
    grads = [rand(s, gen) for s in shapes]
    basis = [[rand(s, gen) * 0.1 for s in shapes] for _ in range(k)]
    g, V = flat_of(grads), torch.stack([flat_of(r) for r in basis])
    c_want = torch.linalg.solve(V @ V.T + ridge * len(shapes) * torch.eye(k, dtype=D), V @ g)
    work = [x.clone() for x in grads]
    c = ee.project_orthogonal_(work, basis, ridge=ridge, rcond=1e-15)
    torch.testing.assert_close(c, c_want, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(flat_of(work), g - V.T @ c_want, rtol=0, atol=1e-12 * g.norm().item())
    out, c2 = ee.project_orthogonal(g, V, ridge=ridge * len(shapes), rcond=1e-15)
    torch.testing.assert_close(c2, c_want, rtol=1e-9, atol=1e-12)
    ref_c = ref.project_orthogonal_([x.clone() for x in grads], basis, ridge=ridge, rcond=1e-15)
    torch.testing.assert_close(ref_c, c_want, rtol=1e-9, atol=1e-12)


def test_ridge_zero_is_todays_projection_and_bad_ridge_raises():
    g, V = torch.randn(30, dtype=D), torch.randn(2, 30, dtype=D)
    assert all(torch.equal(a, b) for a, b in zip(ee.project_orthogonal(g, V), ee.project_orthogonal(g, V, ridge=0.0)))
    out, _ = ee.project_orthogonal(g, V, ridge=1e-3)
    assert not torch.equal(out, ee.project_orthogonal(g, V)[0])
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="ridge"):
            ee.project_orthogonal(g, V, ridge=bad)
        with pytest.raises(ValueError, match="ridge"):
            torch.ops.entangle_ext.project_orthogonal_([g.clone()], [V[0]], None, bad)
    with pytest.raises(TypeError, match="ridge"):
        ee.project_orthogonal_([g.clone()], [[V[0]]], ridge="1e-8")


def test_ridge_gradcheck():
    g = torch.randn(9, dtype=D, requires_grad=True)
    V = torch.randn(2, 9, dtype=D)
    assert torch.autograd.gradcheck(lambda x: ee.project_orthogonal(x, V, ridge=0.5)[0], (g,))


# ------------------------------------------------------------------------------ zero-size inputs
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_zero_size_flat_keeps_the_graph(device, dtype):
    g = torch.zeros(0, dtype=dtype, device=device, requires_grad=True)
    V = torch.zeros(3, 0, dtype=dtype, device=device, requires_grad=True)
    out, c = ee.project_orthogonal(g, V)
    assert out.requires_grad and out.shape == (0,) and torch.equal(c.cpu(), torch.zeros(3, dtype=D))
    (out.sum() * 2).backward()
    assert g.grad is not None and g.grad.shape == (0,)
    grads = [torch.zeros(0, dtype=dtype, device=device), torch.zeros(2, 0, dtype=dtype, device=device)]
    c = ee.project_orthogonal_(grads, [[torch.zeros(0, dtype=dtype, device=device),
                                        torch.zeros(2, 0, dtype=dtype, device=device)]])
    assert torch.equal(c.cpu(), torch.zeros(1, dtype=D))


# ------------------------------------------------------------------------------ CPU kernels
def test_cpu_kernel_variants_agree():
    """Every compiled CPU variant (ATEN_CPU_CAPABILITY picks one per process) gives the projection."""
    code = ("import torch, entangle_ext as ee\n"
            "from entangle_ext import _ext\n"
            "gen = torch.Generator().manual_seed(5)\n"
            "out = {}\n"
            "for dt in (torch.float32, torch.float64, torch.bfloat16):\n"
            "  for k in (1, 2, 5, 8):\n"
            "    gs = [torch.randn(n, generator=gen, dtype=torch.float64).to(dt) for n in (70001, 13, 0)]\n"
            "    bs = [[torch.randn(n, generator=gen, dtype=torch.float64).to(dt) for n in (70001, 13, 0)] for _ in range(k)]\n"
            "    c = ee.project_orthogonal_(gs, bs)\n"
            "    out[(str(dt), k)] = (c, torch.cat([x.reshape(-1).double() for x in gs]))\n"
            "torch.save((_ext._C.projection_cpu_kernel(), out), __import__('sys').argv[1])\n")
    results = {}
    for cap in ("default", "avx2", "avx512"):
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"proj_cap_{os.getpid()}_{cap}.pt")
        env = dict(os.environ, ATEN_CPU_CAPABILITY=cap, OMP_NUM_THREADS="1")
        subprocess.run([sys.executable, "-c", code, path], env=env, check=True, timeout=120)
        name, res = torch.load(path)
        os.remove(path)
        results[name] = res
    assert "default" in results
    base = results["default"]
    for name, res in results.items():
        for key, (c, g) in res.items():
            tol = 1e-2 if "bfloat16" in key[0] else 1e-5
            torch.testing.assert_close(c, base[key][0], rtol=tol, atol=tol)
            assert (g - base[key][1]).abs().max() <= tol * base[key][1].norm(), (name, key)


@pytest.mark.parametrize("dtype,k", [(torch.float32, 8), (torch.float64, 3), (torch.bfloat16, 2)])
def test_cpu_bit_identical_across_thread_counts(dtype, k):
    gen = torch.Generator().manual_seed(6)
    shapes = [(200001,), (7, 9)] + [(33,)] * 90 + [(65537,)]  # more tensors than one group holds
    grads = [rand(s, gen, dtype) for s in shapes]
    basis = [[rand(s, gen, dtype) for s in shapes] for _ in range(k)]
    if dtype == D:
        basis[0] = [v * 1e200 for v in basis[0]]  # takes the rescue path
    old = torch.get_num_threads()
    res = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            work = [x.clone() for x in grads]
            res.append((ee.project_orthogonal_(work, basis), work, ee.projection_gram(grads, basis)))
    finally:
        torch.set_num_threads(old)
    for c, work, (G, b) in res[1:]:
        assert torch.equal(c, res[0][0]) and torch.equal(G, res[0][2][0]) and torch.equal(b, res[0][2][1])
        assert all(torch.equal(a, b) for a, b in zip(work, res[0][1]))


@settings(max_examples=12)
@given(k=st.sampled_from([1, 2, 3, 8]), n_small=st.integers(0, 120), seed=st.integers(0, 2**31 - 1))
def test_many_tensors_span_several_groups(k, n_small, seed):
    """The chunk/group index logic shared with the CUDA launches (csrc/projection.h)."""
    gen = torch.Generator().manual_seed(seed)
    sizes = [int(x) for x in torch.randint(0, 40, (n_small,), generator=gen)] + [32768 + 3]
    sizes.insert(n_small // 2, 32768)
    grads = [rand((n,), gen) for n in sizes]
    basis = [[rand((n,), gen) for n in sizes] for _ in range(k)]
    want = [x.clone() for x in grads]
    c_ref = ref.project_orthogonal_(want, basis)
    c = ee.project_orthogonal_(grads, basis)
    torch.testing.assert_close(c, c_ref, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(flat_of(grads), flat_of(want), rtol=0, atol=1e-10 * flat_of(want).norm().item())


# ------------------------------------------------------------------------------ non-finite data
def _poisoned(seed, k, bad, row, dtype, zero_row):
    """g (P,) and V (k, P) with one NaN/Inf in g (row -1) or in basis row min(row, k - 1); V[0]
    zeroed first when ``zero_row``; and the cut points of a 3-tensor list."""
    gen = torch.Generator().manual_seed(seed)
    sizes = [int(n) for n in torch.randint(1, 40, (3,), generator=gen)]
    P = sum(sizes)
    g, V = rand(P, gen, dtype), rand((k, P), gen, dtype)
    if zero_row:
        V[0].zero_()
    pos = int(torch.randint(0, P, (), generator=gen))
    (g if row < 0 else V[min(row, k - 1)])[pos] = float(bad)
    return g, V, torch.tensor(sizes).cumsum(0)[:-1].tolist()


@given(seed=st.integers(0, 2**31 - 1), k=st.integers(1, 4), bad=st.sampled_from(["nan", "inf", "-inf"]),
       row=st.integers(-1, 3), dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]),
       ridge=st.sampled_from([0.0, 1e-3]), zero_row=st.booleans())
def test_non_finite_data_propagates_to_every_output(seed, k, bad, row, dtype, ridge, zero_row):
    """A NaN/Inf in g or in a basis row, anywhere, makes every coefficient and every output entry
    non-finite in the flat, the list and the split operators: never a finite wrong answer
    (nothing checks the data on the host; the value has to propagate). A zero basis row and the
    ridge do not stop it: every solve turns a non-finite G / V g into NaN coefficients."""
    g, V, cuts = _poisoned(seed, k, bad, row, dtype, zero_row)
    out, c = ee.project_orthogonal(g, V, ridge=ridge)
    assert not torch.isfinite(c).any() and not torch.isfinite(out).any()
    for split in (False, True):
        grads = [x.clone() for x in torch.tensor_split(g, cuts)]
        basis = [list(torch.tensor_split(v, cuts)) for v in V]
        if split:
            G, b = ee.projection_gram(grads, basis)
            c = ee.projection_solve(G, b, shift=ridge * len(grads))
            ee.projection_apply_(grads, basis, c)
            assert c.isnan().all() and all(x.isnan().all() for x in grads)
        else:
            c = ee.project_orthogonal_(grads, basis, ridge=ridge)
            assert not torch.isfinite(c).any() and not any(torch.isfinite(x).any() for x in grads)


@pytest.mark.parametrize("zero_row", [False, True])
def test_fused_solve_gives_nan_when_a_dropped_row_is_non_finite(device, zero_row):
    """Every basis row non-finite (k = 1), or the others zero: no row survives the cut, yet the
    coefficients and the output are NaN, not 0 and g."""
    k = 2 if zero_row else 1
    g, V, cuts = _poisoned(0, k, "nan", k - 1, torch.float32, zero_row)
    g, V = g.to(device), V.to(device)
    out, c = ee.project_orthogonal(g, V)
    assert c.isnan().all() and out.isnan().all()


def test_non_finite_data_on_the_device(device):
    """The same on every device (on CUDA: no host synchronisation is involved)."""
    g, V = torch.randn(300, device=device), torch.randn(2, 300, device=device)
    V[1, 123] = float("nan")
    out, c = ee.project_orthogonal(g, V)
    assert c.isnan().all() and out.isnan().all()
    grads = [g[:100].clone(), g[100:].clone()]
    grads[1][5] = float("inf")
    c = ee.project_orthogonal_(grads, [[V[0, :100], V[0, 100:]], [V[1, :100], V[1, 100:]]])
    assert c.isnan().all() and all(x.isnan().all() for x in grads)


def test_no_basis_row_left_is_nan_everywhere_as_documented():
    """The issue's example: the only basis row has an Inf, so no row survives the cutoff. The
    result is NaN everywhere (coefficients and out / every gradient), not "coefficients 0 and NaN
    where the basis is" as the docstrings used to say; an all-zero finite basis leaves g as is."""
    g = torch.tensor([1.0, 2.0, 3.0, 4.0])
    V = torch.tensor([[float("inf"), 0.0, 0.0, 0.0]])
    out, c = ee.project_orthogonal(g, V)
    assert out.isnan().all() and c.isnan().all()
    grads = [g[:2].clone(), g[2:].clone()]
    c = ee.project_orthogonal_(grads, [[V[0, :2], V[0, 2:]]])
    assert c.isnan().all() and all(x.isnan().all() for x in grads)
    out, c = ee.project_orthogonal(g, torch.zeros(2, 4))
    assert torch.equal(out, g) and torch.equal(c, torch.zeros(2, dtype=D))
    for fn in (ee.project_orthogonal, ee.project_orthogonal_):
        doc = " ".join(fn.__doc__.split())
        assert "the coefficients are 0 and" not in doc and "NaN everywhere" in doc, fn.__name__
