"""Stage2Config.basis_every (ours, docs/algorithm.md §3 "basis_every (ours)", issue 22 item 2):
r = 1 is today's Stage 2; r > 1 recomputes the projection basis g_f, g_rem at steps 0, r, 2r, ...
only (from pass i // r of the forget/remote streams), and a resume mid-interval restores the cached
basis so that it equals the uninterrupted run."""
import dataclasses

import pytest
import torch

import entangle_ext as ee
from entangle_ext.unlearn.config import Stage2Config, UnlearnConfig
from entangle_ext.unlearn.stages import stage2

from _tiny import mlp, params

pytestmark = [pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}"),
              pytest.mark.usefixtures("one_thread")]

# adjacent 80 samples in batches of 10: 8 steps. Forget batches of 4 (limit 2: one pass of 8
# samples), remote batches of 6 (limit 3: one pass of 18 samples): the pass sizes tell them apart.
ADJ, F_PASS, R_PASS = 10, 8, 18


def _config(r=None, **kw):
    """The digits preset's Stage 2 on 8 steps; ``basis_every=r`` unless r is None (left unset)."""
    s2 = UnlearnConfig.preset("digits").stage2
    if r is not None:
        kw["basis_every"] = r
    return dataclasses.replace(s2, epochs=1, adjacent_batch_size=ADJ, forget_batch_size=4,
                               forget_batch_limit=2, remote_batch_size=6, remote_batch_limit=3,
                               micro_batch=None, **kw)


def _model():
    return mlp(seed=3).double()


def _run(small, cfg, model=None, **kw):
    model = model if model is not None else _model()
    sizes = []
    h = model.register_forward_pre_hook(lambda _m, args: sizes.append(args[0].shape[0])
                                        if torch.is_grad_enabled() else None)
    try:
        res = stage2(model, small, cfg, seed=1, progress=False, log_every=1, **kw)
    finally:
        h.remove()
    return model, res, sizes


def test_r1_is_the_reference_stage2(small):
    """basis_every=1 is the default; its run equals one with the field left unset, bit for bit,
    with the same history columns (no basis_refreshed) and one forget + one remote pass a step."""
    cfg_unset = _config()
    assert Stage2Config().basis_every == 1 and cfg_unset.basis_every == 1
    m_default, r_default, _ = _run(small, cfg_unset)
    m1, r1, s1 = _run(small, _config(1))
    assert torch.equal(params(m1), params(m_default))
    assert r1.history == r_default.history and "basis_refreshed" not in r1.history[0]
    assert s1 == [ADJ, F_PASS, R_PASS] * 8


def test_r3_refreshes_exactly_every_third_step_with_a_third_of_the_passes(small):
    m1, r1, s1 = _run(small, _config(1))
    m3, r3, s3 = _run(small, _config(3))
    assert [h["basis_refreshed"] for h in r3.history] == [1, 0, 0, 1, 0, 0, 1, 0]
    # gradient-enabled forward passes: the adjacent one every step, forget + remote on refreshes
    assert s3 == [ADJ, F_PASS, R_PASS, ADJ, ADJ] * 2 + [ADJ, F_PASS, R_PASS, ADJ]
    basis = lambda s: sum(n in (F_PASS, R_PASS) for n in s)
    assert (basis(s1), basis(s3)) == (16, 6)
    # step 0 is the same step; the refresh at step 3 uses pass 1 of the streams (r = 1: step 1's)
    assert r3.history[0] == {**r1.history[0], "basis_refreshed": 1.0}
    assert r3.history[3]["forget_obj"] != r1.history[3]["forget_obj"]
    # in between, the logged basis values are the cached ones of the last refresh
    for i in (1, 2, 4, 5, 7):
        last = r3.history[i - i % 3]
        assert all(r3.history[i][k] == last[k] for k in ("forget_obj", "w2", "forget_ce", "remote_ce"))
    assert not torch.equal(params(m3), params(m1))


def test_r3_refresh_uses_the_streams_next_pass(small):
    """The forget/remote streams advance one pass per refresh: r = 3's refresh k reads pass k, the
    batches r = 1 reads at step k (checked on the logged forget objective of the θ at that step)."""
    _, r3, _ = _run(small, _config(3, lr=0.0))   # lr 0: θ stays θ̄, so only the batches differ
    _, r1, _ = _run(small, _config(1, lr=0.0))
    assert [r3.history[3 * k]["forget_obj"] for k in range(3)] == \
        [r1.history[k]["forget_obj"] for k in range(3)]
    assert [r3.history[3 * k]["remote_ce"] for k in range(3)] == \
        [r1.history[k]["remote_ce"] for k in range(3)]


def test_resume_mid_interval_equals_the_uninterrupted_run(small):
    """checkpoint_every=2 with r=3: the checkpoint of step 2 (and 4) falls inside an interval, its
    cached basis is restored, and the resumed run equals the uninterrupted one bit for bit."""
    cfg = _config(3)
    m_full, r_full, _ = _run(small, cfg)
    saved = {}

    def keep(step, state):
        saved[step] = torch.utils._pytree.tree_map(
            lambda x: x.clone() if isinstance(x, torch.Tensor) else x, state)
        return None
    _run(small, cfg, checkpoint_every=2, checkpoint_fn=keep)
    assert sorted(saved) == [2, 4, 6] and saved[2]["basis"]["valid"]
    for at in (2, 4):
        m, r, sizes = _run(small, cfg, resume_state=saved[at])
        assert torch.equal(params(m), params(m_full)), at
        assert r.history == r_full.history
        assert sizes[0] == ADJ and sizes[1] == ADJ   # steps 2/4 and 5... use the cached basis
        assert sizes.count(F_PASS) == sum(i % 3 == 0 for i in range(at, 8))


def test_resume_without_a_cached_basis_refreshes_first(small):
    """A Stage-2 checkpoint written with r = 1 has no basis: resuming it with r = 3 refreshes at
    its first step (pass first_step // 3) instead of failing."""
    saved = {}
    _run(small, _config(1), checkpoint_every=2,
         checkpoint_fn=lambda s, st: saved.setdefault(s, torch.utils._pytree.tree_map(
             lambda x: x.clone() if isinstance(x, torch.Tensor) else x, st)) and None)
    assert "basis" not in saved[4]
    _, r, sizes = _run(small, _config(3), resume_state=saved[4])
    assert [h["basis_refreshed"] for h in r.history[4:]] == [1, 0, 1, 0]
    assert sizes[:3] == [ADJ, F_PASS, R_PASS]


def test_invalid_basis_every_names_the_field():
    for bad in (0, -2):
        with pytest.raises(ValueError, match="basis_every"):
            Stage2Config(basis_every=bad)
    with pytest.raises(TypeError, match="basis_every"):
        Stage2Config(basis_every=2.0)


@pytest.mark.parametrize("recipe", ["reference", "paper"])
@pytest.mark.parametrize("name", ["cifar100", "tinyimagenet", "celeba", "toxigen", "digits"])
def test_presets_and_recipes_keep_basis_every_1(name, recipe):
    assert UnlearnConfig.preset(name, recipe=recipe).stage2.basis_every == 1
    assert UnlearnConfig().with_recipe(recipe).stage2.basis_every == 1


def test_the_ablation_row_and_the_command_line_override():
    from entangle_ext.cli.config import parse_overrides
    from entangle_ext.methods import get_method
    assert get_method("two_stage_basis4").config_for("digits").stage2.basis_every == 4
    assert get_method("two_stage").config_for("digits").stage2.basis_every == 1
    assert parse_overrides(["stage2.basis_every=4"])["stage2"] == {"basis_every": 4}


def test_an_old_checkpoint_config_without_the_field_resumes_as_r1():
    from entangle_ext.unlearn.checkpoint import check_resume_config
    new = UnlearnConfig().to_dict()
    old = UnlearnConfig().to_dict()
    del old["stage2"]["basis_every"]
    assert check_resume_config({"config": old}, new) == {}
    assert UnlearnConfig.from_dict(old).stage2.basis_every == 1
    with pytest.raises(ValueError, match="stage2.basis_every"):
        check_resume_config({"config": old}, UnlearnConfig(stage2=Stage2Config(basis_every=4)).to_dict())
