"""The driver (entangle_ext.stage1 / stage2 / unlearn) matches a naive transcription of the reference
code's loops (entangle_ext/reference/unlearn.py) parameter for parameter, in float64, after several
steps of each stage: the cycled forget loader, the ToxiGen penalty on the unclipped CE, the Gram
ridge per parameter tensor, ragged remote batches, c0 as `unlearn` computes it. Each test also
checks that the alternative behaviour would have been caught (it differs by far more than the
tolerance)."""
import copy
import dataclasses

import pytest
import torch

import entangle_ext as ee
from entangle_ext.data.digits import digits_splits
from entangle_ext.unlearn import Stage1Config, Stage2Config, UnlearnConfig, losses, stages

from entangle_ext.reference.unlearn import (driver_order_stage1, driver_order_stage2, naive_c0,
                                            naive_stage1, naive_stage2)

SIGN = -1
RTOL, ATOL = 1e-9, 1e-11
pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 24), torch.nn.Tanh(), torch.nn.Linear(24, 2)).double()


@pytest.fixture(scope="module")
def splits():
    pytest.importorskip("sklearn")
    s, _ = digits_splits(dtype=torch.float64, max_train_per_digit=40)
    return s   # forget 40, adjacent 160, remote 200 samples


def _max_diff(a, b):
    return max((pa - pb).abs().max().item() for pa, pb in zip(a.parameters(), b.parameters()))


def _assert_params_close(a, b):
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=RTOL, atol=ATOL, msg=lambda m: f"{n}: {m}")


def _naive1(splits, cfg, seed, c0, **kw):
    m = _model()
    remote, forget = driver_order_stage1(splits, cfg, seed=seed)
    kw = {"cycle": cfg.forget_order == "cycle", "small_punish": cfg.confidence_penalty,
          "small_punish_factor": cfg.penalty_factor, **kw}
    lam = naive_stage1(m, remote, forget, lr=cfg.lr, mu=cfg.mu, clip=cfg.clip, c0=c0, **kw)
    return m, lam, len(remote)


@pytest.mark.parametrize("forget_order", ["cycle", "reshuffle"])
def test_stage1_matches_naive(splits, forget_order):
    # 7 ragged remote steps over a forget stream of 4 batches: the second pass differs by order
    cfg = Stage1Config(lr=3e-3, remote_batch_size=30, forget_batch_size=12, clip=0.9,
                       forget_order=forget_order)
    c0 = naive_c0(_model(), [splits.remote.tensors])
    m_ref, lam_ref, n = _naive1(splits, cfg, 3, c0)
    m_drv = _model()
    r = ee.stage1(m_drv, splits, cfg, seed=3, progress=False, log_every=3)
    assert r.steps == n == 7
    assert r.c0 == pytest.approx(c0, rel=1e-12)
    assert float(r.lam) == pytest.approx(lam_ref, rel=1e-9, abs=1e-12)
    assert len(r.history) == 7 and {"loss", "violation", "lambda"} <= set(r.history[0])
    _assert_params_close(m_drv, m_ref)
    assert max(h["forget_ce"] for h in r.history) > cfg.clip   # the clip actually bit
    other, _, _ = _naive1(splits, cfg, 3, c0, cycle=forget_order != "cycle")
    assert _max_diff(other, m_drv) > 1e3 * ATOL   # the other forget order would be caught


@pytest.mark.parametrize("penalty_on, factor", [("ce", 1.0), ("ce", 0.3), ("clipped", 1.0)])
def test_stage1_confidence_penalty_matches_naive(splits, penalty_on, factor):
    """ToxiGen penalty: the reference applies κ/(CE+ε) to the unclipped CE (gradient also above
    the clip); "clipped" is the alternative (no penalty gradient above the clip)."""
    cfg = Stage1Config(lr=3e-3, remote_batch_size=50, forget_batch_size=10, clip=0.9,
                       confidence_penalty=True, penalty_factor=factor, penalty_on=penalty_on)
    c0 = naive_c0(_model(), [splits.remote.tensors])
    m_drv = _model()
    ee.stage1(m_drv, splits, cfg, seed=4, progress=False)
    m_ref, _, _ = _naive1(splits, cfg, 4, c0)
    if penalty_on == "ce":
        _assert_params_close(m_drv, m_ref)
    else:
        assert _max_diff(m_drv, m_ref) > 1e3 * ATOL   # the difference (c) is caught


def test_stage1_from_unlearn_float64_c0(splits):
    """c0 as `unlearn` computes it (from its evaluation of θ0) in float64: no float32 cast."""
    cfg = UnlearnConfig(stage1=Stage1Config(lr=3e-3, remote_batch_size=30, forget_batch_size=12),
                        seed=3, run_stage2=False)
    m_drv = _model()
    res = ee.unlearn(m_drv, splits, cfg, progress=False)
    c0 = naive_c0(_model(), [(x[None], y[None]) for x, y in zip(*splits.remote.tensors)])
    assert res.report["c0"] == pytest.approx(c0, rel=1e-14)
    m_ref, lam_ref, _ = _naive1(splits, cfg.stage1, 3, c0)
    assert res.report["lambda_final"] == pytest.approx(lam_ref, rel=1e-9, abs=1e-12)
    _assert_params_close(m_drv, m_ref)


def _stage2_base(splits):
    base = _model()
    ee.stage1(base, splits, Stage1Config(lr=3e-3, remote_batch_size=50, forget_batch_size=12),
              progress=False)   # move away from θ0 so the forget losses are spread out
    return base


@pytest.mark.parametrize("micro_batch", [None, 7, "auto"])
@pytest.mark.parametrize("gram_ridge", [None, 1e-8])
def test_stage2_matches_naive(splits, micro_batch, gram_ridge, monkeypatch):
    if micro_batch == "auto":   # bounded to 7 samples: the float64 MLP's largest output is 24 values
        monkeypatch.setattr(losses, "CPU_CHUNK_BYTES", 7 * 24 * 8)
    base = _stage2_base(splits)
    # ragged batches: forget 15, 15, 10 and remote 90, 90, 20 (weights 1/90 are inexact in float32)
    cfg = Stage2Config(alpha=0.5, lr=5e-2, momentum=0.9, epochs=2, adjacent_batch_size=64,
                       forget_batch_size=15, forget_batch_limit=3, remote_batch_size=90,
                       remote_batch_limit=3, micro_batch=micro_batch, forget_mean_sign=SIGN,
                       gram_ridge=gram_ridge)
    m_drv, m_ref = copy.deepcopy(base), copy.deepcopy(base)
    steps = driver_order_stage2(splits, cfg, seed=5)
    assert [len(b[1]) for b in steps[0][2]] == [90, 90, 20]
    v_ref = naive_stage2(m_ref, steps, lr=cfg.lr, alpha=cfg.alpha, momentum=cfg.momentum,
                         ridge=gram_ridge or 0.0)
    r = ee.stage2(m_drv, splits, cfg, seed=5, progress=False, log_every=2)
    assert r.steps == len(steps) == 6
    _assert_params_close(m_drv, m_ref)
    for a, b in zip(r.momentum, v_ref):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
    assert sum(p.sub(q).abs().sum() for p, q in zip(m_drv.parameters(), base.parameters())) > 1e-3


def test_stage2_gram_ridge_is_material_and_passed(splits, monkeypatch):
    """With small gradients the reference's per-tensor ridge changes the result by far more than
    the tolerance (so `test_stage2_matches_naive` catches a missing ridge), and the driver hands
    ``gram_ridge`` to the projection operator as ``ridge`` once it takes one (not under the paper
    recipe)."""
    base = _stage2_base(splits)
    with torch.no_grad():
        for p in base.parameters():
            p.mul_(1e-3)    # tiny logits: tiny gradients, squared norms near T·1e-8
    cfg = Stage2Config(epochs=1, lr=5e-2, adjacent_batch_size=64, forget_batch_size=15,
                       forget_batch_limit=3, remote_batch_size=90, remote_batch_limit=3)
    steps = driver_order_stage2(splits, cfg, seed=5)
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    naive_stage2(a, steps, lr=cfg.lr, ridge=1e-8)
    naive_stage2(b, steps, lr=cfg.lr, ridge=0.0)
    assert _max_diff(a, b) > 1e3 * ATOL
    seen = []

    def with_ridge(grads, basis, *, rcond=1e-7, ridge=0.0):
        seen.append(ridge)
        return ee.project_orthogonal_(grads, basis, rcond=rcond)
    monkeypatch.setattr(stages, "project_orthogonal_", with_ridge)
    ee.stage2(copy.deepcopy(base), splits, cfg, seed=5, progress=False)
    assert seen and set(seen) == {1e-8}
    seen.clear()
    paper = UnlearnConfig(stage2=cfg).with_recipe("paper").stage2
    ee.stage2(copy.deepcopy(base), splits, dataclasses.replace(paper, epochs=1), progress=False)
    assert seen and set(seen) == {0.0}
