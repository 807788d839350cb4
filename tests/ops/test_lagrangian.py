"""Tests of entangle_ext.AugmentedLagrangian (the Stage-1 multiplier state): the pre/post dual
update, the penalty schedule, state_dict, a Stage-1 loop against plain PyTorch, and CUDA-graph capture
of a whole Stage-1 step. The operators it calls are tested in test_augmented_lagrangian.py."""
import io

import pytest
import torch
import torch.nn.functional as F

import entangle_ext as ee
from entangle_ext import reference as ref

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")


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


# --- the schedule with non-finite g (check_finite=False, the CUDA-graph case): the mean is over the
# finite entries, and a window without one is no measurement
NAN, INF = float("nan"), float("inf")


def _sched(m=1, mu=1.0, **kw):
    kw = {"mu_growth": 2.0, "shrink_ratio": 0.75, "schedule_every": 1, "check_finite": False, **kw}
    return ee.AugmentedLagrangian(torch.zeros(m, dtype=torch.float64), mu=mu, **kw)


def _run(al, gs):
    """mu (as a list or float) after each update with the g's of ``gs``."""
    out = []
    for g in gs:
        al.update(torch.tensor(g, dtype=torch.float64))
        out.append(al.mu.tolist())
    return out


def test_schedule_a_nan_step_in_a_halving_violation_does_not_grow_mu():
    """The issue's repro: |g| halves every step; the NaN step stored prev_window = 0, so the next
    step (0.0625 > 0.75 * 0) doubled mu. Now the NaN step measures nothing."""
    mus, prevs = {}, {}
    for inject in (False, True):
        al = ee.AugmentedLagrangian(torch.tensor([0.]), mu=1.0, mu_growth=2.0, schedule_every=1,
                                    shrink_ratio=0.75, check_finite=False)
        v, mus[inject], prevs[inject] = 1.0, [], []
        for i in range(6):
            al.update(torch.tensor([NAN if inject and i == 3 else v]))
            v *= 0.5
            mus[inject].append(al.mu.item())
            prevs[inject].append(al.state_dict()["prev_window"].item())
    assert mus[True] == mus[False] == [1.0] * 6
    assert prevs[True][3] == prevs[True][2] == 0.25 and prevs[True][4:] == prevs[False][4:]


def test_schedule_mean_is_over_the_finite_entries_not_schedule_every():
    """Window 2 = (NaN, 0.9): its mean is 0.9 > 0.75 * 1 (grow), not (0 + 0.9) / 2 = 0.45."""
    al = _sched(schedule_every=2)
    assert _run(al, [[1.0], [1.0], [NAN], [0.9]]) == [1.0, 1.0, 1.0, 2.0]
    assert al.state_dict()["prev_window"].item() == pytest.approx(0.9)
    # scalar mu, two constraints: the max over the constraints' finite means (0.9 and 0.1)
    al = _sched(m=2, schedule_every=2)
    assert _run(al, [[1.0, 1.0], [1.0, 1.0], [NAN, 0.1], [0.9, 0.1]])[-1] == 2.0
    assert al.state_dict()["prev_window"].item() == pytest.approx(0.9)
    # and a window whose finite entries shrank enough does not grow mu, whatever its NaNs
    al = _sched(schedule_every=3)
    assert _run(al, [[1.0]] * 3 + [[INF], [NAN], [0.7]])[-1] == 1.0


def test_schedule_a_window_without_a_finite_entry_keeps_prev_window():
    """An all-NaN/Inf window neither grows mu nor replaces the previous measurement: the next
    window (0.5 <= 0.75 * 1) is compared with window 1, not with 0."""
    al = _sched(schedule_every=2)
    assert _run(al, [[1.0], [1.0], [NAN], [INF]]) == [1.0] * 4
    assert al.state_dict()["prev_window"].item() == 1.0
    assert _run(al, [[0.5], [0.5]]) == [1.0, 1.0]
    assert al.state_dict()["prev_window"].item() == 0.5
    # a first window without a measurement: the second one has nothing to compare with
    al = _sched(schedule_every=2)
    assert _run(al, [[NAN], [NAN], [1.0], [1.0], [1.0], [1.0]]) == [1.0] * 5 + [2.0]
    # scalar mu: no constraint measured is no measurement
    al = _sched(m=2, schedule_every=1)
    assert _run(al, [[1.0, 0.5], [NAN, INF], [0.6, 0.1]]) == [1.0, 1.0, 1.0]
    assert al.state_dict()["prev_window"].item() == pytest.approx(0.6)


def test_schedule_per_constraint_mu_with_one_constraint_nan_in_a_window():
    """Per-constraint mu: constraint 0 has no measurement in window 2 (its mu and prev stay, and
    window 3's 0.5 is compared with window 1's 1.0); constraint 1 stalls and grows twice."""
    al = _sched(m=2, mu=torch.ones(2, dtype=torch.float64))
    assert _run(al, [[1.0, 1.0], [NAN, 1.0], [0.5, 1.0]]) == [[1.0, 1.0], [1.0, 2.0], [1.0, 4.0]]
    assert al.state_dict()["prev_window"].tolist() == [0.5, 1.0]
    al = _sched(m=2, mu=torch.ones(2, dtype=torch.float64), schedule_every=2)
    _run(al, [[1.0, 1.0], [1.0, 1.0], [INF, 1.0]])
    assert al.state_dict()["window_count"].tolist() == [0, 1]
    assert _run(al, [[NAN, 1.0]]) == [[1.0, 2.0]]
    assert al.state_dict()["prev_window"].tolist() == [1.0, 1.0]


_GS = [[1.0, 2.0], [NAN, 1.5], [0.9, 1.0], [0.8, INF], [0.5, 0.9], [0.1, 0.9], [0.7, 0.2], [0.6, 0.3],
       [0.05, 0.3], [0.5, 0.1], [0.4, 0.1], [0.45, 0.05]]


@pytest.mark.parametrize("mu", [1.0, torch.ones(2, dtype=torch.float64)])
def test_state_dict_keeps_the_window_count_and_loads_a_state_without_one(mu):
    """The finite-entry count is saved and restored (a resumed run's schedule is the uninterrupted
    one's); a state of the previous release (version 1, no window_count; prev_window 0 before the
    first window ended) loads as if its window's entries were all finite."""
    kw = {"mu": mu, "schedule_every": 3}
    a = _sched(m=2, **kw)
    _run(a, _GS[:4])   # step 4 has an Inf: the window's count is [1, 0]
    state = a.state_dict()
    assert state["window_count"].tolist() == [1, 0] and state["window_count"].dtype == torch.int64
    b = _sched(m=2, **kw)
    b.load_state_dict(state)
    assert _run(b, _GS[4:]) == _run(a, _GS[4:])
    for k, v in a.state_dict().items():
        assert torch.equal(b.state_dict()[k], v) if isinstance(v, torch.Tensor) else b.state_dict()[k] == v, k
    finite = [[abs(x) if x == x and abs(x) < INF else 0.3 for x in g] for g in _GS]
    for cut in (1, 4):   # before the first window ended (prev_window an unused 0), and after
        a = _sched(m=2, **kw)
        _run(a, finite[:cut])
        old = {k: v for k, v in a.state_dict().items() if k != "window_count"}
        if cut < 3:
            old["prev_window"] = torch.zeros_like(old["prev_window"])
        c = _sched(m=2, **kw)
        c.load_state_dict(old)
        assert c.state_dict()["window_count"].tolist() == [cut % 3] * 2
        rest = _run(a, finite[cut:])
        assert _run(c, finite[cut:]) == rest, cut
        assert rest[-1] != rest[0], "the schedule did nothing"
    c.load_state_dict(dict(state, window_count=torch.tensor([2.0, 0.0])))   # integer-valued floats load
    assert c.state_dict()["window_count"].tolist() == [2, 0]


def test_to_keeps_the_window_count_an_int64_tensor():
    al = _sched(m=2, schedule_every=2, dtype=torch.float32)
    _run(al, [[1.0, 1.0], [1.0, 1.0], [NAN, 1.0]])
    al.to("cpu", dtype=torch.float64)
    count = al.state_dict()["window_count"]
    assert count.dtype == torch.int64 and count.device == al.device and count.tolist() == [0, 1]
    assert _run(al, [[NAN, 0.9]]) == [2.0]   # mean 0.9 (one entry) > 0.75, not 0.45


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


def test_non_finite_c0_raises():
    with pytest.raises(ValueError, match="c0 must be finite"):
        ee.AugmentedLagrangian(torch.tensor([float("nan")]))
    with pytest.raises(ValueError, match="c0 must be finite"):
        ee.AugmentedLagrangian(float("inf"))
    # a finite float64 c0 beyond float32: the message said "got [inf]" (the cast), not the user's value
    for build in (lambda: ee.AugmentedLagrangian(torch.tensor([1e39], dtype=torch.float64), dtype=torch.float32),
                  lambda: ee.AugmentedLagrangian(torch.zeros(1)).load_state_dict(
                      {**ee.AugmentedLagrangian(torch.zeros(1, dtype=torch.float64)).state_dict(),
                       "c0": torch.tensor([1e39], dtype=torch.float64)})):
        with pytest.raises(ValueError, match=r"c0 must be finite in the state dtype torch.float32: \[1e\+39\] "
                                             r"\(torch.float64\) is beyond its range"):
            build()


def test_c0_of_more_than_one_dimension_is_refused_not_flattened():
    with pytest.raises(ValueError, match=r"^AugmentedLagrangian: c0 must be a \(\) or \(m,\) tensor, got shape \(2, 2\)"):
        ee.AugmentedLagrangian(torch.ones(2, 2))
    assert ee.AugmentedLagrangian(torch.ones(())).num_constraints == 1
    assert ee.AugmentedLagrangian(torch.ones(3)).num_constraints == 3


@pytest.mark.parametrize("kw,exc,match", [
    (dict(damping=2.0), ValueError, r"damping must be in \[0, 1\], got 2"),
    (dict(damping=-0.1), ValueError, r"damping must be in \[0, 1\]"),
    (dict(damping="0.1"), TypeError, "damping must be a float"),
    (dict(lam_min=1.0, lam_max=0.0), ValueError, r"lam_min \(1\) > lam_max \(0\)"),
    (dict(lam_min=float("nan")), ValueError, "lam_min is NaN"),
    (dict(kind="inequality", lam_max=-1.0), ValueError, ".*so lam_max must be >= 0, got -1"),
    (dict(mu=torch.tensor(-1.0)), ValueError, "mu must be finite and > 0"),
    (dict(mu=torch.tensor(0.0)), ValueError, "mu must be finite and > 0"),
    (dict(mu=torch.tensor(float("nan"))), ValueError, "mu must be finite and > 0"),
    (dict(mu="10"), TypeError, "mu must be a float"),
    (dict(mu_max=0.0), ValueError, "mu_max must be finite and > 0"),
    (dict(mu_max=float("inf")), ValueError, r"mu_max must be finite and > 0, got inf"),
    (dict(mu_max=float("nan")), ValueError, "mu_max must be finite and > 0"),
    (dict(mu_growth=float("inf")), ValueError, r"mu_growth must be finite and >= 1, got inf"),
    (dict(mu_growth=0.5), ValueError, "mu_growth must be finite and >= 1"),
    (dict(mu_max=1e300, dtype=torch.float32), ValueError,
     r"mu_max must be finite in the state dtype torch.float32 \(<= 3.4\d*e\+38\), got 1e\+300"),
    (dict(mu=1e300, dtype=torch.float32), ValueError, "mu must be a finite float > 0"),
    (dict(schedule_every=1.5), ValueError, "schedule_every must be an integer"),
    (dict(schedule_every="3"), TypeError, "schedule_every must be an integer >= 1, got str '3'"),   # was "a float"
    (dict(schedule_every=True), TypeError, "schedule_every must be an integer >= 1, got bool True"),
    (dict(dtype=torch.float16), TypeError, r"dtype must be float32 or float64 \(got torch.float16\)"),
])
def test_constructor_checks_what_update_would_refuse(kw, exc, match):
    """Every argument is checked when the object is built, before an optimizer step has changed
    the model, with the messages the operators use."""
    with pytest.raises(exc, match=f"^AugmentedLagrangian: {match}"):
        ee.AugmentedLagrangian(1.0, **kw)


def test_infinite_mu_max_is_refused_up_front_not_after_39_steps():
    """The issue's run: mu_max = inf let the schedule drive mu to inf, and update() raised at the
    39th step ("dual_update_: mu is non-finite"), after that many optimizer steps. Now the
    constructor refuses it; the default schedule settings stay valid and finite mu_max caps mu."""
    with pytest.raises(ValueError, match="^AugmentedLagrangian: mu_max must be finite"):
        ee.AugmentedLagrangian(1.0, mu=10.0, mu_growth=10.0, mu_max=float("inf"))
    for dtype in (torch.float32, torch.float64):
        al = ee.AugmentedLagrangian(1.0, mu=10.0, mu_growth=10.0, dtype=dtype)   # mu_max 1e6
        assert (al.mu_growth, al.mu_max) == (10.0, 1e6)
        for _ in range(60):
            al.update(torch.tensor([1e-3], dtype=dtype))
        assert al.mu.item() == 1e6
    ee.AugmentedLagrangian(1.0)   # the defaults (mu 10, no schedule) are valid
    al = ee.AugmentedLagrangian(1.0, mu_max=1e300, dtype=torch.float64)
    with pytest.raises(ValueError, match="mu_max must be finite in the state dtype torch.float32"):
        al.to(dtype=torch.float32)
    assert al.dtype == torch.float64


@pytest.mark.parametrize("state", ["c0", "mu", "lam"])
def test_to_a_narrower_dtype_refuses_state_that_would_become_inf(state):
    """The constructor refuses c0 / mu beyond the state dtype; .to(float32) must not let them
    (or a grown multiplier) become Inf either: ValueError, nothing moved."""
    kw = {"c0": dict(c0=1e300), "mu": dict(c0=1.0, mu=1e100), "lam": dict(c0=1.0)}[state]
    c0 = kw.pop("c0")
    al = ee.AugmentedLagrangian(c0, dtype=torch.float64, **kw)
    if state == "lam":
        al.update(torch.tensor([1e200], dtype=torch.float64))      # lam = mu * g = 1e201
    before = {k: v.clone() for k, v in al.state_dict().items() if isinstance(v, torch.Tensor)}
    with pytest.raises(ValueError, match=r"^AugmentedLagrangian.to: .* does not fit in torch.float32"):
        al.to(dtype=torch.float32)
    assert al.dtype == torch.float64 and al.c0.dtype == torch.float64
    for k, v in al.state_dict().items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, before[k]), k
    small = ee.AugmentedLagrangian(2.5, mu=3.0, dtype=torch.float64).to(dtype=torch.float32)
    assert small.c0.dtype == torch.float32 and small.c0.item() == 2.5 and small.mu.item() == 3.0


def test_schedule_every_beyond_the_int64_step_counter_is_refused_up_front():
    """10**30 was accepted and the first update() raised OverflowError (after an optimizer step);
    2**63 - 1, the largest the int64 counter holds, works."""
    for bad in (2**63, 10**30, 1e30):
        with pytest.raises(ValueError, match=r"schedule_every must be at most 2\*\*63 - 1"):
            ee.AugmentedLagrangian(1.0, mu_growth=2.0, schedule_every=bad)
    al = ee.AugmentedLagrangian(1.0, mu_growth=2.0, schedule_every=2**63 - 1)
    al.update(torch.tensor([1.0]))
    assert al.schedule_every == 2**63 - 1 and al.mu.item() == 10.0


def test_c0_float_beyond_the_state_dtype_is_refused():
    with pytest.raises(ValueError, match="c0 must be finite"):
        ee.AugmentedLagrangian(1e300, dtype=torch.float32)


@pytest.mark.parametrize("key,value,exc,match", [
    ("lam", torch.tensor([float("nan"), 1.0]), ValueError, r"lam must be finite, got \[nan, 1.0\]"),
    ("lam", torch.tensor([float("inf"), 1.0]), ValueError, "lam must be finite"),
    ("mu", torch.tensor(-5.0), ValueError, r"mu must be finite and > 0, got "),
    ("mu", torch.tensor(float("nan")), ValueError, r"mu must be finite and > 0, got "),
    ("c0", torch.tensor([float("inf"), 0.0]), ValueError, "the pinned values c0 must be finite"),
    ("version", 99, ValueError, r"state version 99 .*version 1"),
    ("version", None, ValueError, r"missing keys \['version'\]"),
    ("steps", torch.tensor(-1), ValueError, "steps must be a 0-d integer tensor >= 0"),
    ("steps", torch.tensor(1.5), ValueError, "steps must be a 0-d integer tensor >= 0"),
    ("window_sum", torch.zeros(1), ValueError, r"window_sum of shape \(1,\)"),
    ("last_violation", torch.zeros(3), ValueError, r"last_violation of shape \(3,\)"),
    ("window_count", torch.zeros(1, dtype=torch.int64), ValueError, r"window_count of shape \(1,\)"),
    ("window_count", torch.tensor([-1, 0]), ValueError, r"window_count must hold integers >= 0 .*\[-1, 0\]"),
    ("window_count", torch.tensor([0.5, 1.0]), ValueError, "window_count must hold integers >= 0"),
    ("window_count", torch.tensor([float("nan"), 1.0]), ValueError, "window_count must hold integers >= 0"),
    ("window_count", torch.tensor([1e30, 1.0]), ValueError, "window_count must hold integers >= 0"),
    ("window_count", torch.tensor([True, False]), ValueError, "window_count must hold integers >= 0"),
    ("window_count", [0, 1], TypeError, "window_count must be a tensor, got list"),
    ("lam", [0.0, 1.0], TypeError, "lam must be a tensor, got list"),
    ("c0", torch.zeros(2, device="meta"), ValueError, r"meta tensors \(no data\) for \['c0'\]"),
    ("lam", torch.zeros(2, device="meta"), ValueError, r"meta tensors \(no data\) for \['lam'\]"),
])
def test_load_state_dict_checks_like_the_constructor(key, value, exc, match):
    """A state is checked before anything is copied, with the constructor's / mu setter's messages:
    a NaN multiplier, a non-positive mu, an unknown or missing version are refused, and the
    instance is left as it was."""
    al = ee.AugmentedLagrangian(torch.tensor([1.0, 2.0]), mu=3.0, mu_growth=2.0)
    al.update(torch.tensor([0.5, -0.5]))
    state = al.state_dict()
    bad = dict(state)
    if value is None:
        del bad[key]
    else:
        bad[key] = value
    fresh = ee.AugmentedLagrangian(torch.tensor([0.0, 0.0]), mu=1.0, mu_growth=2.0)
    before = fresh.state_dict()
    with pytest.raises(exc, match=f"^AugmentedLagrangian.load_state_dict: .*{match}"):
        fresh.load_state_dict(bad)
    for k, v in fresh.state_dict().items():
        assert (torch.equal(v, before[k]) if isinstance(v, torch.Tensor) else v == before[k]), k
    fresh.load_state_dict(state)   # the good state loads
    assert torch.equal(fresh.lam, al.lam)


def test_load_state_dict_refuses_a_negative_inequality_multiplier():
    al = ee.AugmentedLagrangian(torch.zeros(2), kind="inequality")
    with pytest.raises(ValueError, match="an inequality multiplier is >= 0"):
        al.load_state_dict(dict(al.state_dict(), lam=torch.tensor([1.0, -1.0])))


@pytest.mark.parametrize("c0", ["a", None, [1.0, 2.0], True])
def test_c0_of_the_wrong_type_names_c0(c0):
    with pytest.raises(TypeError, match="AugmentedLagrangian: c0 must be a float or a floating tensor"):
        ee.AugmentedLagrangian(c0)


def test_mu_setter_is_checked():
    al = ee.AugmentedLagrangian(torch.zeros(2), mu=torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="mu must be finite and > 0"):
        al.mu = torch.tensor([1.0, -1.0])
    with pytest.raises(ValueError, match="finite float > 0"):
        al.mu = float("nan")
    assert al.mu.tolist() == [1.0, 2.0]
    al.mu = 3.0
    assert al.mu.tolist() == [3.0, 3.0]


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_precision_c0_keeps_float32_state(half):
    """lam, mu and c0 stay float32 whatever the model dtype; a half loss enters constraint and
    penalty (computed in float32, gradient back to the half loss) and the update."""
    al = ee.AugmentedLagrangian(torch.tensor(1.0, dtype=half), mu=torch.tensor(4.0, dtype=half))
    assert al.dtype == al.c0.dtype == al.mu.dtype == torch.float32
    loss = torch.tensor(1.5, dtype=half, requires_grad=True)
    g = al.constraint(loss)
    al.lam.fill_(0.25)
    term = al.penalty(g)
    assert term.dtype == torch.float32 and term.item() == pytest.approx(0.25 * 0.5 + 2.0 * 0.25)
    term.backward()
    assert loss.grad.dtype == half and loss.grad.item() == pytest.approx(0.25 + 4.0 * 0.5)
    al.update()
    assert al.lam.item() == pytest.approx(0.25 + 4.0 * 0.5)
    with pytest.raises(TypeError, match="float32 or float64"):
        al.to(dtype=half)


@pytest.mark.parametrize("saved_mu,new_mu", [(torch.tensor([1.0, 2.0]), 5.0),
                                             (3.0, torch.tensor([1.0, 2.0]))])
def test_load_state_dict_restores_mu_of_any_shape(saved_mu, new_mu):
    """The state carries mu: its value and shape are restored whatever the new instance was built
    with; the schedule's window (shaped like mu) follows."""
    a = ee.AugmentedLagrangian(torch.tensor([1.0, 2.0]), mu=saved_mu, mu_growth=2.0)
    for v in ([2.0, 3.0], [2.5, 3.5], [3.0, 4.0]):
        a.update(torch.tensor(v))
    b = ee.AugmentedLagrangian(torch.tensor([0.0, 0.0]), mu=new_mu, mu_growth=2.0)
    b.load_state_dict(a.state_dict())
    for key, want in a.state_dict().items():
        if isinstance(want, torch.Tensor):
            assert torch.equal(b.state_dict()[key], want), key
    for al in (a, b):
        al.update(torch.tensor([1.0, 1.0]))
    assert torch.equal(a.lam, b.lam) and torch.equal(a.mu, b.mu)


def test_load_state_dict_refuses_another_number_of_constraints():
    s = ee.AugmentedLagrangian(torch.tensor([1.0, 2.0]), mu=torch.tensor([1.0, 2.0])).state_dict()
    with pytest.raises(ValueError, match=r"lam of shape \(2,\), but this instance has 3 constraints"):
        ee.AugmentedLagrangian(torch.zeros(3)).load_state_dict(s)
    bad = dict(s, c0=torch.zeros(3))
    with pytest.raises(ValueError, match=r"c0 of shape \(3,\)"):
        ee.AugmentedLagrangian(torch.zeros(2)).load_state_dict(bad)
    bad = dict(s, mu=torch.ones(3), prev_window=torch.zeros(3))
    with pytest.raises(ValueError, match=r"mu has shape \(3,\), expected \(\) or \(2,\)"):
        ee.AugmentedLagrangian(torch.zeros(2)).load_state_dict(bad)



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


@pytest.mark.parametrize("kind", ["equality", "inequality"])
def test_penalty_compiles_with_fullgraph_and_matches_eager(kind):
    """penalty() must not read the mu tensor on the host while torch.compile traces it (a
    data-dependent check breaks fullgraph=True); eager use still rejects a bad mu."""
    al = ee.AugmentedLagrangian(torch.tensor([0.5, 1.0], dtype=torch.float64), mu=3.0, kind=kind)
    al.lam.copy_(torch.tensor([0.2, -0.1], dtype=torch.float64).clamp_min(0 if kind == "inequality" else -1))

    def f(values):
        return al.penalty(al.constraint(values)) * 2.0

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    x = torch.tensor([0.9, 0.4], dtype=torch.float64, requires_grad=True)
    got = compiled(x)
    (g_got,) = torch.autograd.grad(got, x)
    want = f(x)
    (g_want,) = torch.autograd.grad(want, x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(g_got, g_want, rtol=0, atol=0)
    with pytest.raises(ValueError, match="mu must be"):
        ee.augmented_lagrangian_term(torch.zeros(2, dtype=torch.float64), al.lam,
                                     torch.tensor(-1.0, dtype=torch.float64))


def test_bounds_beyond_the_state_dtype_and_a_non_bool_check_finite_are_refused_up_front():
    with pytest.raises(ValueError, match=r"^AugmentedLagrangian: lam_min=1e\+300 is beyond the range"):
        ee.AugmentedLagrangian(1.0, lam_min=1e300)                            # float32 state
    al = ee.AugmentedLagrangian(1.0, lam_min=1e300, dtype=torch.float64)       # fits in float64
    with pytest.raises(ValueError, match=r"^AugmentedLagrangian.to: lam_min=1e\+300"):
        al.to(dtype=torch.float32)
    assert al.dtype == torch.float64
    with pytest.raises(TypeError, match="check_finite must be None, True or False, got 'no'"):
        ee.AugmentedLagrangian(1.0, check_finite="no")


def test_messages_about_many_constraints_name_the_bad_entries_not_every_value():
    """A bad entry among 1000 constraints: the message counts them and names the bad ones with their
    indices (it printed all 1000 values); up to 8 entries still print as a list."""
    c0 = torch.ones(1000, dtype=torch.float64)
    c0[17] = float("nan")
    with pytest.raises(ValueError, match=r"c0 must be finite, got 1000 values, 1 of them offending: \[17\] nan$"):
        ee.AugmentedLagrangian(c0)
    with pytest.raises(ValueError, match=r"in the state dtype torch.float32: 1000 values, 1 of them offending: "
                                         r"\[3\] 1e\+300 \(torch.float64\) is beyond"):
        ee.AugmentedLagrangian(torch.ones(1000, dtype=torch.float64).index_fill_(0, torch.tensor([3]), 1e300),
                               dtype=torch.float32)
    mu = torch.full((1000,), 2.0, dtype=torch.float64)
    mu[[5, 900]] = -1.0
    with pytest.raises(ValueError, match=r"penalty mu must be > 0, got 1000 values, 2 of them offending: "
                                         r"\[5\] -1.0, \[900\] -1.0$"):
        ee.dual_update_(torch.zeros(1000, dtype=torch.float64), torch.ones(1000, dtype=torch.float64), mu)
    al = ee.AugmentedLagrangian(torch.ones(1000, dtype=torch.float64), kind="inequality")
    state = al.state_dict()
    state["lam"][999] = -0.5
    with pytest.raises(ValueError, match=r"inequality multiplier is >= 0, got lam = 1000 values, 1 of them "
                                         r"offending: \[999\] -0.5$"):
        al.load_state_dict(state)
    with pytest.raises(ValueError, match=r"c0 must be finite, got \[1.0, nan\]$"):   # short: the whole list
        ee.AugmentedLagrangian(torch.tensor([1.0, float("nan")], dtype=torch.float64))
