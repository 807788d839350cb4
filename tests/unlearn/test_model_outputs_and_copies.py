"""What a run takes from the user's model and splits without a word, now said: a model returning
``(features, logits)`` (element 0 of a tuple is taken as the logits), a model that cannot be
deep-copied where a copy is needed (``inplace=False``, compare, SCRUB's teacher, relearn time),
and a held-out split that is a train split."""
import collections
import dataclasses
import threading
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, Subset

import entangle_ext as ee
from entangle_ext.unlearn import OverlappingSplitsWarning
from entangle_ext.unlearn.metrics import relearn_time
from entangle_ext.unlearn.model_copy import copy_model

from _tiny import mlp, tiny_config

pytestmark = [pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}"),
              pytest.mark.usefixtures("one_thread")]


class FeaturesFirst(torch.nn.Module):
    """Returns (features (B, 32), logits (B, 2)): element 0 is not the logits."""
    def __init__(self, logits_first=False):
        super().__init__()
        self.net, self.logits_first = mlp(), logits_first

    def forward(self, x):
        h = self.net[1](self.net[0](x))
        out = self.net[2](h)
        return (out, h) if self.logits_first else (h, out)


@pytest.mark.parametrize("logits_first", [False, True])
def test_a_tuple_of_several_batch_tensors_warns_which_element_is_taken(small, logits_first):
    """Before, (features, logits) trained and scored the 32 features as 32 classes silently."""
    with pytest.warns(UserWarning, match=r"returns a tuple of 2 with several \(batch, k\) tensors \(0: \(batch, "
                                         rf"{2 if logits_first else 32}\), 1: \(batch, {32 if logits_first else 2}\)\): "
                                         rf"element 0 is taken as the logits, {2 if logits_first else 32} classes"):
        ee.unlearn(FeaturesFirst(logits_first), small, tiny_config(), progress=False)


def test_a_tuple_with_one_batch_tensor_does_not_warn(small):
    class Tup(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def forward(self, x):
            return self.net(x), torch.zeros(3)   # one (batch, k) tensor: nothing ambiguous
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        ee.unlearn(Tup(), small, tiny_config(), progress=False)


def test_a_namedtuple_with_logits_does_not_warn_about_element_0(small):
    """A namedtuple (features, logits) is read by its .logits field (`logits_of`), but the warning
    said element 0 (the 32 features) was taken as the logits, telling a correct model to change."""
    Out = collections.namedtuple("Out", ["features", "logits"])

    class Named(FeaturesFirst):
        def forward(self, x):
            return Out(*super().forward(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        res = ee.unlearn(Named(), small, tiny_config(), progress=False)
    assert res.report["num_classes"] == 2


class Locked(torch.nn.Module):
    """An MLP holding a lock, which copy.deepcopy cannot copy."""
    def __init__(self):
        super().__init__()
        self.net, self.lock = mlp(), threading.Lock()

    def forward(self, x):
        return self.net(x)


def test_inplace_false_on_a_model_that_cannot_be_copied_names_the_reason(small):
    with pytest.raises(TypeError, match=r"^inplace=False runs on a copy of the model \(pass inplace=True to update "
                                        r"it in place\), and the model \(Locked\) cannot be copied with copy.deepcopy: "
                                        r"TypeError: cannot pickle '_thread.lock' object; the attribute that "
                                        r"cannot be copied is model.lock \(a lock\)"):
        ee.unlearn(Locked(), small, tiny_config(), inplace=False, progress=False)
    # the path names the submodule (the message used to promise "the attribute named" and name none)
    with pytest.raises(TypeError, match=r"^a copy, .* is model\.1\.lock \(a lock\)\. Make it deep-copyable"):
        copy_model(torch.nn.Sequential(mlp(), Locked()), "a copy")
    ee.unlearn(Locked(), small, tiny_config(), inplace=True, progress=False)   # in place: no copy needed


def test_scrub_and_relearn_time_name_their_copy(small):
    from entangle_ext.methods.scrub import frozen_copy
    with pytest.raises(TypeError, match=r"^SCRUB distils from a frozen copy of the original model"):
        frozen_copy(Locked())
    with pytest.raises(TypeError, match=r"^relearn_time fine-tunes a copy of the model"):
        relearn_time(Locked(), small.forget, threshold=0.9)


def _fresh(small, **held_out):
    return ee.Splits(forget=small.forget, adjacent=small.adjacent, remote=small.remote,
                     **{"forget_test": small.forget_test, "adjacent_test": small.adjacent_test,
                        "remote_test": small.remote_test, **held_out})


def test_a_held_out_split_that_is_a_train_split_warns_once_per_run(small):
    splits = _fresh(small, forget_test=small.forget)
    with pytest.warns(OverlappingSplitsWarning) as rec:
        ee.unlearn(mlp(), splits, tiny_config(), progress=False)
    mine = [w for w in rec if "held-out split 'forget_test' is the train split 'forget'" in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in rec]


def test_a_held_out_subset_or_loader_sharing_train_samples_warns(small):
    ds = small.remote
    train, test = Subset(ds, range(0, 60)), Subset(ds, range(50, 100))   # 10 shared
    splits = ee.Splits(forget=small.forget, adjacent=small.adjacent, remote=train, remote_test=test)
    with pytest.warns(OverlappingSplitsWarning, match=r"held-out split 'remote_test' shares 10 sample\(s\) with "
                                                      r"the train split 'remote'"):
        splits.check()
    splits = ee.Splits(forget=small.forget, adjacent=small.adjacent, remote=small.remote,
                       adjacent_test=DataLoader(small.adjacent))
    with pytest.warns(OverlappingSplitsWarning, match=r"'adjacent_test' shares 80 sample\(s\) with the train split "
                                                      r"'adjacent'"):
        splits.check()
    with warnings.catch_warnings():   # disjoint held-out subsets: no warning
        warnings.simplefilter("error", OverlappingSplitsWarning)
        ee.Splits(forget=small.forget, adjacent=small.adjacent, remote=Subset(ds, range(0, 50)),
                  remote_test=Subset(ds, range(50, 100))).check()


def test_a_tuple_whose_element_0_is_not_a_tensor_is_the_logits_error_not_a_crash_of_the_warning(small):
    class NoneFirst(FeaturesFirst):
        def forward(self, x):
            return (None,) + super().forward(x)
    with pytest.raises(ValueError, match=r"the model must return 2-D logits \(batch, classes\); got NoneType "
                                         r"\(element 0 of the tuple it returns: the logits must come first\)"):
        ee.unlearn(NoneFirst(), small, tiny_config(), progress=False)


@pytest.mark.parametrize("output, where", [
    (lambda z: (z[:, 0], z), r"got \(\d+,\) \(element 0 of the tuple it returns: the logits must come first\)"),
    (lambda z: {"logits": z[:, 0]}, r"got \(\d+,\) \(its \"logits\" entry\)"),
    (lambda z: z[:, 0], r"got \(\d+,\)$"),
])
def test_the_logits_error_says_which_part_of_the_output_it_read(small, output, where):
    """A model returning (per-sample score, logits) was told "got (2,)" without a word on where
    that came from."""
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(64, 2)

        def forward(self, x):
            return output(self.lin(x))
    with pytest.raises(ValueError, match=r"the model must return 2-D logits \(batch, classes\); " + where):
        ee.unlearn(Model(), small, tiny_config(), progress=False)


def test_a_squeezing_model_on_a_batch_of_one_is_told_why(small):
    """A model ending in ``.squeeze()`` gives (C,) for a batch of one sample (here the last Stage-2
    forget batch of a 9-sample split in batches of 8): the error says that this batch held one
    sample and what to squeeze instead (it said only "got (2,)"); a (B,) output of a larger batch
    is not told this."""
    class Squeezing(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(64, 2)

        def forward(self, x):
            return self.lin(x).squeeze()
    splits = dataclasses.replace(small, forget=Subset(small.forget, range(9)))
    with pytest.raises(ValueError, match=r"got \(2,\); this batch held one sample: a model that squeezes its "
                                         r"output .* drops the batch dimension"):
        ee.unlearn(Squeezing(), splits, tiny_config(), progress=False)
