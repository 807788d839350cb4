"""A DataLoader split stands for the items its sampler draws from. Its sampler was ignored: a
DataLoader with ``SubsetRandomSampler(range(10))`` over 60 samples unlearned (and scored) all 60,
and three such loaders over disjoint index ranges of one dataset were refused as "sharing 60
samples". Now a SubsetRandomSampler's indices are honoured (also inside a ``batch_sampler``),
torch's default samplers mean the whole dataset, and any other sampler is refused. Also: overlap
through a ConcatDataset or through negative Subset indices was not seen."""
import pytest
import torch
from torch.utils.data import (BatchSampler, ConcatDataset, DataLoader, RandomSampler, SequentialSampler, Subset,
                              SubsetRandomSampler, TensorDataset, WeightedRandomSampler)

import entangle_ext as ee
from entangle_ext.unlearn.source import as_source, loader_dataset

from _tiny import mlp, tiny_config


def _pool(n=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 64, generator=g), torch.randint(0, 2, (n,), generator=g))


def _indices(ds):
    """The pool indices a dataset built by `loader_dataset` stands for."""
    return list(ds.indices) if isinstance(ds, Subset) else list(range(len(ds)))


@pytest.mark.parametrize("make, expect", [
    (lambda p: DataLoader(p, batch_size=8), range(60)),
    (lambda p: DataLoader(p, batch_size=8, shuffle=True), range(60)),
    (lambda p: DataLoader(p, batch_size=8, sampler=SubsetRandomSampler(range(10, 17))), range(10, 17)),
    (lambda p: DataLoader(p, batch_size=8, sampler=SubsetRandomSampler(torch.tensor([3, 1, 4]))), [3, 1, 4]),
    (lambda p: DataLoader(p, batch_sampler=BatchSampler(SubsetRandomSampler([5, 9]), 2, False)), [5, 9]),
    (lambda p: DataLoader(p, batch_sampler=BatchSampler(SequentialSampler(p), 4, True)), range(60)),
])
def test_the_items_a_loader_stands_for(make, expect):
    pool = _pool()
    ds = loader_dataset(make(pool))
    assert [int(i) for i in _indices(ds)] == list(expect)
    assert as_source(make(pool)).dataset.__class__ is ds.__class__


@pytest.mark.parametrize("make, says", [
    (lambda p: DataLoader(p, batch_size=8, sampler=WeightedRandomSampler([1.0] * 60, 60)),
     "sampler of type WeightedRandomSampler"),
    (lambda p: DataLoader(p, batch_size=8, sampler=RandomSampler(p, replacement=True)),
     r"RandomSampler \(replacement=True"),
    (lambda p: DataLoader(p, batch_size=8, sampler=RandomSampler(p, num_samples=10)),
     r"num_samples=10 of 60"),
    (lambda p: DataLoader(p, batch_size=8, sampler=SequentialSampler(_pool(30))), "sampler of type SequentialSampler"),
    (lambda p: DataLoader(p, batch_sampler=[[0, 1], [2, 3]]), "batch_sampler of type list"),
    (lambda p: DataLoader(p, batch_size=None), "needs automatic batching"),
])
def test_a_sampler_whose_choice_would_be_ignored_is_refused(make, says):
    with pytest.raises(ValueError, match=says):
        loader_dataset(make(_pool()))
    splits = ee.Splits(forget=make(_pool()), adjacent=_pool(20, 1), remote=_pool(30, 2))
    with pytest.raises(ValueError, match=says):
        ee.unlearn(mlp(), splits, tiny_config(), progress=False)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_subset_sampler_split_is_unlearned_and_scored_on_its_items_only():
    pool = _pool()
    forget = DataLoader(pool, batch_size=8, sampler=SubsetRandomSampler(range(10)))
    adjacent = DataLoader(pool, batch_size=8, sampler=SubsetRandomSampler(range(10, 30)))
    remote = DataLoader(pool, batch_size=8, sampler=SubsetRandomSampler(range(30, 60)))
    r = ee.unlearn(mlp(), ee.Splits(forget=forget, adjacent=adjacent, remote=remote), tiny_config(), progress=False)
    assert {k: r.report["evals"]["final"][k]["n"] for k in ("forget", "adjacent", "remote")} == \
        {"forget": 10, "adjacent": 20, "remote": 30}
    overlapping = DataLoader(pool, batch_size=8, sampler=SubsetRandomSampler(range(25, 35)))
    with pytest.raises(ValueError, match=r"'adjacent' and 'remote' share 5 sample\(s\) of one dataset "
                                         r"\(indices \[30, 31, 32, 33, 34\]\)"):
        ee.Splits(forget=forget, adjacent=overlapping, remote=remote).check()


def test_overlap_through_a_concat_dataset_or_negative_indices_is_refused():
    pool = _pool()
    remote = Subset(pool, range(30, 60))
    through_concat = ee.Splits(forget=Subset(pool, range(10)),
                               adjacent=ConcatDataset([Subset(pool, range(10, 20)), Subset(pool, [31, 40])]),
                               remote=remote)
    with pytest.raises(ValueError, match=r"'adjacent' and 'remote' share 2 sample\(s\) .*\[31, 40\]"):
        through_concat.check()
    negative = ee.Splits(forget=Subset(pool, [-1, -2, -3]), adjacent=Subset(pool, range(5, 20)), remote=remote)
    with pytest.raises(ValueError, match=r"'forget' and 'remote' share 3 sample\(s\) .*\[57, 58, 59\]"):
        negative.check()
    concat_of_subset = Subset(ConcatDataset([_pool(5, 3), pool]), [0, 5 + 58])   # item 58 of the pool
    with pytest.raises(ValueError, match=r"'forget' and 'remote' share 1 sample\(s\) .*\[58\]"):
        ee.Splits(forget=concat_of_subset, adjacent=Subset(pool, range(10, 20)), remote=remote).check()
    ee.Splits(forget=Subset(pool, range(10)), remote=remote,
              adjacent=ConcatDataset([Subset(pool, range(10, 20)), _pool(5, 4)])).check()   # disjoint: runs
