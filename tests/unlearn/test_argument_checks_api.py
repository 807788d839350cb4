"""Argument checks of the Python API: every documented seed ([-2**63, 2**64 - 1], torch.manual_seed's
range) reaches numpy / scikit-learn in the data loaders (`entangle_ext.data.seeds`), the seeds those
libraries took before keep their data, and ``allow_config_change=True`` without ``resume`` is refused."""
import numpy as np
import pytest
import torch

import entangle_ext as ee
from entangle_ext.data.seeds import check_data_seed, numpy_seed, sklearn_random_state
from entangle_ext.unlearn.fields import SEED_MAX, SEED_MIN

from _tiny import mlp, tiny_config

OLD_SEEDS = [0, 1, 12345, 2 ** 32 - 1]   # what scikit-learn's random_state took before: the same data
NEW_SEEDS = [-1, 2 ** 40, SEED_MIN, SEED_MAX]   # refused by scikit-learn / numpy before


def _digits_old_split(seed, forget_digit=3):
    """The splits of `digits_splits` as the code before computed them (random_state=seed itself)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    d = load_digits()
    x, digit = d.data / 16.0, d.target.astype(np.int64)
    idx_tr, idx_te = train_test_split(np.arange(len(digit)), test_size=0.3, random_state=seed, stratify=digit)
    odd = [k for k in range(10) if k % 2 == forget_digit % 2 and k != forget_digit]
    even = [k for k in range(10) if k % 2 != forget_digit % 2]
    out = {}
    for suffix, idx in (("", idx_tr), ("_test", idx_te)):
        for name, digs in (("forget", [forget_digit]), ("adjacent", odd), ("remote", even)):
            out[name + suffix] = x[idx[np.isin(digit[idx], digs)]]
    return out


def _digits_x(seed):
    from entangle_ext.data.digits import digits_splits
    splits, _ = digits_splits(seed=seed, dtype=torch.float64)
    return {name: getattr(splits, name).tensors[0].numpy() for name in
            ("forget", "adjacent", "remote", "forget_test", "adjacent_test", "remote_test")}


@pytest.mark.parametrize("seed", OLD_SEEDS)
def test_digits_split_of_a_seed_scikit_learn_took_is_unchanged(seed):
    pytest.importorskip("sklearn")
    old, new = _digits_old_split(seed), _digits_x(seed)
    for name in old:
        assert np.array_equal(old[name], new[name]), (seed, name)


@pytest.mark.parametrize("seed", NEW_SEEDS)
def test_digits_split_takes_every_documented_seed(seed):
    pytest.importorskip("sklearn")
    a, b = _digits_x(seed), _digits_x(seed)   # deterministic
    assert all(np.array_equal(a[k], b[k]) for k in a)
    zero = _digits_x(0)
    assert any(not np.array_equal(a[k], zero[k]) for k in a)   # its own split, not seed 0's


def test_distinct_seeds_outside_scikit_learns_range_draw_distinct_splits():
    pytest.importorskip("sklearn")
    a, b, c = _digits_x(-1), _digits_x(2 ** 40), _digits_x(2 ** 32)
    assert any(not np.array_equal(a[k], b[k]) for k in a)
    assert any(not np.array_equal(b[k], c[k]) for k in a)


def test_digits_setting_loader_takes_a_negative_seed():
    pytest.importorskip("sklearn")
    from entangle_ext.settings import get_setting
    splits, info = get_setting("digits").load(None, seed=-1, device="cpu", max_train_per_class=5)
    assert len(splits.forget) == 5 and info["num_classes"] == 2


def test_seed_helpers_keep_the_seeds_numpy_took():
    for s in (0, 7, 2 ** 32 - 1, 2 ** 40, SEED_MAX):
        assert numpy_seed(s) == s
    assert numpy_seed(-1) == 2 ** 64 - 1 and numpy_seed(SEED_MIN) == 2 ** 63   # torch.manual_seed's reading
    for s in OLD_SEEDS:
        assert sklearn_random_state(s) == s
    for s in NEW_SEEDS:
        rs = sklearn_random_state(s)
        assert isinstance(rs, np.random.RandomState)
        assert np.array_equal(rs.randint(0, 1000, 8), sklearn_random_state(s).randint(0, 1000, 8))
        np.random.default_rng(numpy_seed(s))   # takes it


@pytest.mark.parametrize("bad, exc, msg", [(SEED_MAX + 1, ValueError, "seed must be in"),
                                           (SEED_MIN - 1, ValueError, "seed must be in"),
                                           (1.0, TypeError, "seed must be an integer"),
                                           (True, TypeError, "seed must be an integer")])
def test_seed_outside_the_range_is_a_clear_error(bad, exc, msg):
    with pytest.raises(exc, match=msg):
        check_data_seed(bad)
    pytest.importorskip("sklearn")
    from entangle_ext.data.digits import digits_splits
    with pytest.raises(exc, match=msg):
        digits_splits(seed=bad)


@pytest.mark.parametrize("seed", [-1, 2 ** 40])
def test_toxigen_holdout_and_cap_take_every_documented_seed(seed):
    from entangle_ext.data.toxigen import toxigen_index_splits
    groups = ["lgbtq"] * 12 + ["asian"] * 12
    data = {"target_group": groups, "toxic": [i % 2 for i in range(24)], "text": [f"t{i}" for i in range(24)]}
    a = toxigen_index_splits(data, seed=seed, max_per_group_label=4)
    b = toxigen_index_splits(data, seed=seed, max_per_group_label=4)
    assert np.array_equal(a[2], b[2]) and np.array_equal(a[3], b[3])


def test_unlearn_runs_with_a_negative_seed(small):
    pytest.importorskip("sklearn")
    if not ee.available():
        pytest.skip(f"extension not loaded: {ee.load_error()}")
    res = ee.unlearn(mlp(), small, tiny_config(), seed=-1, progress=False)
    assert res.report["config"]["seed"] == -1


# ------------------------------------------------------------------ allow_config_change / resume
@pytest.mark.parametrize("method", ["two_stage", "ft", "salun"])
def test_allow_config_change_without_resume_is_refused_before_any_run(method, small, tmp_path):
    model = mlp()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"allow_config_change=True applies to a resumed run only: give resume="):
        ee.unlearn(model, small, method=method, setting="digits", allow_config_change=True, out_dir=tmp_path / "o",
                   progress=False)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert not (tmp_path / "o").exists()


def test_allow_config_change_must_be_a_bool(small):
    with pytest.raises(TypeError, match="allow_config_change must be True or False"):
        ee.unlearn(mlp(), small, setting="digits", resume="x", allow_config_change="yes", progress=False)


def test_config_changes_on_a_finished_run_are_refused_not_recorded(small, tmp_path):
    """Resuming the end of a finished run with allow_config_change and another stage2.epochs ran
    nothing, yet the report recorded the change (and claimed the new epochs). Refused now; from
    stage1_done.pt the change applies (Stage 2 runs with it)."""
    import dataclasses
    out = tmp_path / "run"
    ee.unlearn(mlp(), small, tiny_config(), out_dir=out, progress=False)
    longer = tiny_config()
    longer.stage2 = dataclasses.replace(longer.stage2, epochs=2)
    model = mlp()
    with pytest.raises(ValueError, match=r"^resume: the checkpoint .* is the end of a finished run, so no stage runs "
                                         r"again and the config changes \(stage2.epochs: 1 → 2\) would not apply"):
        ee.unlearn(model, small, longer, out_dir=tmp_path / "again", resume=out, allow_config_change=True,
                   progress=False)
    res = ee.unlearn(mlp(), small, longer, out_dir=tmp_path / "from1", resume=out / "checkpoints" / "stage1_done.pt",
                     allow_config_change=True, progress=False)
    assert res.report["resume"]["config_changes"] == {"stage2.epochs": [1, 2]}
    assert res.report["steps"]["stage2"] == 2 * ee.unlearn(mlp(), small, tiny_config(), progress=False).report["steps"]["stage2"]


def test_a_resume_past_a_shortened_stage_is_refused(small, tmp_path):
    """A mid-Stage-2 checkpoint at step 4 resumed with allow_config_change and a Stage 2 of 3 steps
    ran nothing, yet the report claimed the shorter config (found by a new-user test)."""
    import dataclasses
    longer = tiny_config(checkpoint_every=1)
    longer.stage2 = dataclasses.replace(longer.stage2, epochs=2)   # 6 Stage-2 steps
    out = tmp_path / "run"
    ee.unlearn(mlp(), small, longer, out_dir=out, progress=False)
    ckpt = out / "checkpoints" / "stage2_step000004.pt"
    assert ckpt.exists()
    with pytest.raises(ValueError, match=r"^resume: the checkpoint is at step 4 of stage 2 \(W-PGD\), past the 3 "
                                         r"steps of this config \(1 epoch\(s\) of 3 batches\)"):
        ee.unlearn(mlp(), small, tiny_config(checkpoint_every=1), out_dir=tmp_path / "short", resume=ckpt,
                   allow_config_change=True, progress=False)


def test_config_changes_on_a_finished_stage1_only_run_are_refused(small, tmp_path):
    """run_stage2=False: the run ends with Stage 1, so its stage1_done checkpoint is a finished run."""
    import dataclasses
    cfg = tiny_config(run_stage2=False)
    ee.unlearn(mlp(), small, cfg, out_dir=tmp_path / "run", progress=False)
    other = tiny_config(run_stage2=False)
    other.stage1 = dataclasses.replace(other.stage1, lr=other.stage1.lr * 2)
    with pytest.raises(ValueError, match=r"is the end of a finished run.*stage1.lr"):
        ee.unlearn(mlp(), small, other, out_dir=tmp_path / "again", resume=tmp_path / "run",
                   allow_config_change=True, progress=False)
    assert not (tmp_path / "again").exists()   # refused before the out dir was made
