"""Overlapping train splits are refused before any training (issue 24, item 4): the same object
as two splits, DataLoaders over one dataset, Subsets of one dataset sharing indices; identical
rows of two tensor datasets warn. For the two-stage family and the baselines (Retrain included)."""
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, Subset, TensorDataset

import entangle_ext as ee
from entangle_ext.unlearn import OverlappingSplitsWarning
from _tiny import mlp, params, tiny_config

METHODS = ["two_stage", "retrain", "ft"]


def _run(splits, method):
    cfg = tiny_config() if method == "two_stage" else None
    return ee.unlearn(mlp(), splits, cfg, method=method, setting=None if cfg else "digits", progress=False)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("pair", [("forget", "adjacent"), ("forget", "remote"), ("adjacent", "remote")])
def test_one_object_as_two_splits_is_refused_before_any_training(small, method, pair):
    model = mlp()
    before = params(model)
    s = ee.Splits(forget=small.forget, adjacent=small.adjacent, remote=small.remote)
    setattr(s, pair[1], getattr(s, pair[0]))
    cfg = tiny_config() if method == "two_stage" else None
    with pytest.raises(ValueError, match=f"splits '{pair[0]}' and '{pair[1]}' are the same object"):
        ee.unlearn(model, s, cfg, method=method, setting=None if cfg else "digits", progress=False)
    torch.testing.assert_close(params(model), before, rtol=0, atol=0)   # nothing trained or re-initialised


@pytest.mark.parametrize("method", METHODS)
def test_subsets_sharing_indices_are_refused_naming_them(small, method):
    x = torch.cat([small.forget.tensors[0], small.adjacent.tensors[0], small.remote.tensors[0]])
    y = torch.cat([small.forget.tensors[1], small.adjacent.tensors[1], small.remote.tensors[1]])
    full = TensorDataset(x, y)
    nf, na = len(small.forget), len(small.adjacent)
    forget = Subset(full, list(range(nf)))
    adjacent = Subset(Subset(full, list(range(nf - 3, len(full)))), list(range(na + 3)))   # nested: 3 shared
    remote = Subset(full, list(range(nf + na, len(full))))
    with pytest.raises(ValueError, match=r"splits 'forget' and 'adjacent' share 3 sample\(s\) of one dataset "
                                         rf"\(indices \[{nf - 3}, {nf - 2}, {nf - 1}\]\)"):
        _run(ee.Splits(forget=forget, adjacent=adjacent, remote=remote), method)
    ok = ee.Splits(forget=forget, adjacent=Subset(full, list(range(nf, nf + na))), remote=remote)
    _run(ok, method)   # disjoint Subsets of one dataset run


def test_dataloaders_over_one_dataset_are_refused(small):
    s = ee.Splits(forget=DataLoader(small.forget, batch_size=4), adjacent=small.adjacent,
                  remote=DataLoader(small.forget, batch_size=8))
    with pytest.raises(ValueError, match="'forget' and 'remote' share 20 sample"):
        s.check()


def test_identical_rows_of_two_tensor_datasets_warn(small):
    x, y = small.remote.tensors
    copy = TensorDataset(torch.cat([small.forget.tensors[0][:2].clone(), x]),
                         torch.cat([small.forget.tensors[1][:2].clone(), y]))
    s = ee.Splits(forget=small.forget, adjacent=small.adjacent, remote=copy)
    with pytest.warns(OverlappingSplitsWarning, match=r"'forget' and 'remote' hold 2 identical input row\(s\)"):
        s.check()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        small.check()   # the digits splits are disjoint: no warning



def _with_copies(small, n=2):
    """remote with the first ``n`` forget rows prepended (identical rows in two splits)."""
    x, y = small.remote.tensors
    return TensorDataset(torch.cat([small.forget.tensors[0][:n].clone(), x]),
                         torch.cat([small.forget.tensors[1][:n].clone(), y]))


def _overlap_warnings(fn, action="always"):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter(action)
        fn()
    return [w for w in got if issubclass(w.category, OverlappingSplitsWarning)]


def test_each_run_warns_once_about_identical_rows(small):
    """unlearn checks the splits for the method and again in each evaluation: one warning per
    run, and the next run with the same splits warns again."""
    s = ee.Splits(forget=small.forget, adjacent=small.adjacent, remote=_with_copies(small))
    for _ in range(2):
        got = _overlap_warnings(lambda: _run(s, "two_stage"))
        assert len(got) == 1 and "'forget' and 'remote' hold 2 identical" in str(got[0].message)


def test_identical_rows_warning_follows_each_runs_filters(small):
    """A run under 'ignore' does not silence the next run; 'error' refuses every run."""
    s = ee.Splits(forget=small.forget, adjacent=small.adjacent, remote=_with_copies(small))
    assert _overlap_warnings(s.check, "ignore") == []
    assert len(_overlap_warnings(lambda: _run(s, "two_stage"))) == 1
    for _ in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("error", OverlappingSplitsWarning)
            with pytest.raises(OverlappingSplitsWarning, match="hold 2 identical"):
                _run(s, "two_stage")


def test_bare_checks_scan_every_time_and_see_later_edits(small):
    remote = _with_copies(small)
    s = ee.Splits(forget=small.forget, adjacent=small.adjacent, remote=remote)
    assert len(_overlap_warnings(s.check)) == 1
    assert len(_overlap_warnings(s.check)) == 1                   # outside a run: every check
    remote.tensors[0].data = remote.tensors[0].data + 1.0         # no version bump; rows now differ
    assert _overlap_warnings(s.check) == []


def test_disjoint_scope_scans_a_pair_once_and_nests(small):
    from entangle_ext.unlearn.disjoint import disjoint_scope
    s = ee.Splits(forget=small.forget, adjacent=small.adjacent, remote=_with_copies(small))

    def twice_in_scope():
        with disjoint_scope():
            s.check()
            with disjoint_scope():                                # joins the outer scope
                s.check()
            s.check()
    assert len(_overlap_warnings(twice_in_scope)) == 1
    assert len(_overlap_warnings(twice_in_scope)) == 1            # a new scope scans again


def test_a_comparison_warns_once_about_identical_rows(small):
    """compare checks the splits itself, then each method run and each scoring checks them again:
    one warning per compare call, not one per run or per check; the next call warns again."""
    pytest.importorskip("sklearn")
    pytest.importorskip("scipy")
    s = ee.Splits(forget=small.forget, adjacent=small.adjacent, remote=_with_copies(small),
                  adjacent_test=small.adjacent_test, remote_test=small.remote_test)
    kw = dict(methods=["ga", "ssd"], seeds=[0, 1], setting="digits", relearn=False, progress=False)
    for _ in range(2):
        got = _overlap_warnings(lambda: ee.compare(mlp(), s, **kw))
        assert len(got) == 1 and "'forget' and 'remote' hold 2 identical" in str(got[0].message)


def test_every_copied_row_is_found_wherever_it_sits(small):
    """A copy of any forget row appended to the remote split is found, and k copies count k (the
    row keys were a float projection that BLAS rounded differently in matrices of other sizes:
    10 of these 20 single copies went unseen, 5 copies counted 4); -0.0 equals 0.0 as in
    torch.equal; the keys of other dtypes do not depend on the other rows either."""
    from entangle_ext.unlearn.disjoint import _duplicate_rows, _row_keys
    x, y = small.forget.tensors
    r, ry = small.remote.tensors
    for k in range(len(x)):
        with_copy = TensorDataset(torch.cat([r, x[k:k + 1]]), torch.cat([ry, y[k:k + 1]]))
        assert _duplicate_rows(small.forget, with_copy) == (1, [(k, len(r))]), k
    assert _duplicate_rows(small.forget, TensorDataset(torch.cat([r, x[:5]]), torch.cat([ry, y[:5]])))[0] == 5
    assert torch.equal(_row_keys(torch.tensor([[-0.0, 1.0]])), _row_keys(torch.tensor([[0.0, 1.0]])))
    for dt in (torch.float16, torch.bfloat16, torch.float64, torch.complex64, torch.int64, torch.uint8, torch.bool):
        z = torch.randn(9, 5) > 0 if dt is torch.bool else (torch.randn(9, 5) * 3).to(dt)
        keys = _row_keys(z, chunk=4)
        assert torch.equal(_row_keys(torch.cat([z[2:3], z]), chunk=3), torch.cat([keys[2:3], keys])), dt


def test_identical_rows_in_two_dtypes_warn(small):
    """A float64 copy of float32 rows is the same samples once the run casts both to the model's
    dtype; it went unseen because the row scan skipped datasets of two dtypes."""
    x, y = small.forget.tensors
    s = ee.Splits(forget=small.forget, adjacent=small.adjacent, remote=TensorDataset(x[:3].double(), y[:3]))
    with pytest.warns(OverlappingSplitsWarning, match=r"'forget' and 'remote' hold 3 identical input row\(s\)"):
        s.check()
    ids = TensorDataset(torch.arange(12).reshape(4, 3), torch.zeros(4, dtype=torch.long))
    as_int32 = TensorDataset(ids.tensors[0][:2].int(), torch.zeros(2, dtype=torch.long))
    with pytest.warns(OverlappingSplitsWarning, match="hold 2 identical"):
        ee.Splits(forget=ids, adjacent=small.adjacent, remote=as_int32).check()
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # floats against integers: another kind of input, not compared
        ee.Splits(forget=TensorDataset(ids.tensors[0].float(), ids.tensors[1]), adjacent=small.adjacent,
                  remote=ids).check()
