"""The driver (entangle_ext.stage1 / stage2) matches a naive transcription of the reference recipe
(entangle_ext/reference/unlearn.py) parameter for parameter, in float64, after several steps of
each stage."""
import copy

import pytest
import torch

import entangle_ext as ee
from entangle_ext.data.digits import digits_splits
from entangle_ext.unlearn import Stage1Config, Stage2Config

from entangle_ext.reference.unlearn import (driver_order_stage1, driver_order_stage2, naive_c0,
                                            naive_stage1, naive_stage2)

SIGN = -1
pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 24), torch.nn.Tanh(), torch.nn.Linear(24, 2)).double()


@pytest.fixture(scope="module")
def splits():
    s, _ = digits_splits(dtype=torch.float64, max_train_per_digit=40)
    return s   # forget 40, adjacent 160, remote 200 samples


def _assert_params_close(a, b):
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-9, atol=1e-11, msg=lambda m: f"{n}: {m}")


def test_stage1_matches_naive(splits):
    cfg = Stage1Config(lr=3e-3, remote_batch_size=30, forget_batch_size=12, clip=0.9)  # 7 steps, ragged
    m_drv, m_ref = _model(), _model()
    c0 = naive_c0(m_ref, [splits.remote.tensors])
    remote, forget = driver_order_stage1(splits, cfg, seed=3)
    lam_ref = naive_stage1(m_ref, remote, forget, lr=cfg.lr, mu=cfg.mu, clip=cfg.clip, c0=c0)
    r = ee.stage1(m_drv, splits, cfg, seed=3, progress=False, log_every=3)
    assert r.steps == len(remote) == 7
    assert r.c0 == pytest.approx(c0, rel=1e-12)
    assert float(r.lam) == pytest.approx(lam_ref, rel=1e-9, abs=1e-12)
    assert len(r.history) == 7 and {"loss", "violation", "lambda"} <= set(r.history[0])
    _assert_params_close(m_drv, m_ref)
    # the clip actually bit: some forget batch mean CE went above c
    assert max(h["forget_ce"] for h in r.history) > cfg.clip


@pytest.mark.parametrize("micro_batch", [None, 7])
def test_stage2_matches_naive(splits, micro_batch):
    base = _model()
    ee.stage1(base, splits, Stage1Config(lr=3e-3, remote_batch_size=50, forget_batch_size=12),
              progress=False)   # move away from θ0 so the forget losses are spread out
    cfg = Stage2Config(alpha=0.5, lr=5e-2, momentum=0.9, epochs=2, adjacent_batch_size=64,
                       forget_batch_size=15, forget_batch_limit=3, remote_batch_size=45,
                       remote_batch_limit=3, micro_batch=micro_batch, forget_mean_sign=SIGN)   # ragged: 15,15,10 / 45,45,45
    m_drv, m_ref = copy.deepcopy(base), copy.deepcopy(base)
    steps = driver_order_stage2(splits, cfg, seed=5)
    v_ref = naive_stage2(m_ref, steps, lr=cfg.lr, alpha=cfg.alpha, momentum=cfg.momentum)
    r = ee.stage2(m_drv, splits, cfg, seed=5, progress=False, log_every=2)
    assert r.steps == len(steps) == 6
    _assert_params_close(m_drv, m_ref)
    for a, b in zip(r.momentum, v_ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    assert sum(p.sub(q).abs().sum() for p, q in zip(m_drv.parameters(), base.parameters())) > 1e-3
