"""`IndexSplit` with index sequences of every accepted kind (lists, tuples, ranges, 1-D integer numpy
arrays and tensors, numpy integer entries) and the split files' fields of the wrong type: each is
read as plain Python ints at construction (so the checks, the hash and the file agree), or refused
with a ValueError naming the list (and the file), never a wrong answer or a raw error."""
import json

import numpy as np
import pytest
import torch

from entangle_ext.splits import IndexSplit, load_split, save_split, split_by_hierarchy, split_hash

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("make", [torch.tensor, np.array, tuple, lambda v: [np.int64(i) for i in v],
                                  lambda v: np.array(v, dtype=np.int32), lambda v: [torch.tensor(i) for i in v]],
                         ids=["tensor", "ndarray", "tuple", "np-int-entries", "int32", "0-d-tensors"])
def test_index_sequences_become_lists_of_python_ints(make):
    s = IndexSplit(make([3, 4]), make([1]), make([0, 2]), targets=make([0, 1, 2, 3, 4]))
    for n, want in (("forget", [3, 4]), ("adjacent", [1]), ("remote", [0, 2]), ("targets", [0, 1, 2, 3, 4])):
        got = getattr(s, n)
        assert type(got) is list and got == want and all(type(v) is int for v in got), (n, got)
    s.check()
    assert s == IndexSplit([3, 4], [1], [0, 2], targets=[0, 1, 2, 3, 4])


def test_overlap_in_tensors_is_found_and_save_refuses_it(tmp_path):
    # the tensors' elements hashed by identity: the overlap was missed, save wrote a file load refused
    s = IndexSplit(torch.tensor([3]), torch.tensor([3]), [2])
    with pytest.raises(ValueError, match=r"^splits 'forget' and 'adjacent' share indices \(3\): a sample may be in one"):
        s.check()
    with pytest.raises(ValueError, match="share indices"):
        save_split(tmp_path / "ov.json", s)
    assert not (tmp_path / "ov.json").exists()
    with pytest.raises(ValueError, match=r"split 'forget' holds duplicate indices \(3\)"):
        IndexSplit(torch.tensor([3, 3]), [1], [2]).check()      # was RuntimeError: Boolean value of Tensor


def test_messages_name_both_splits_and_the_indices():
    """The overlap message named one split ("overlaps another split"), none of the indices."""
    with pytest.raises(ValueError, match=r"^splits 'adjacent' and 'remote' share indices \(5, 6, 7, 8, 9 and 3 more\)"):
        IndexSplit([0], list(range(5, 13)), list(range(5, 20))).check()
    with pytest.raises(ValueError, match=r"^split 'remote' holds duplicate indices \(4, 9\)$"):
        IndexSplit([0], [1], [4, 9, 4, 9, 9]).check()


@pytest.mark.parametrize("forget", [np.array([0]), np.array([3, 4]), torch.tensor([0]), torch.tensor([3, 4])])
def test_array_forget_lists_check_and_round_trip(tmp_path, forget):
    s = IndexSplit(forget, [1], [2])        # np.array([0]) read as empty; [3, 4] "truth value ambiguous"
    s.check()
    save_split(tmp_path / "s.json", s)
    assert load_split(tmp_path / "s.json").forget == forget.tolist()


@pytest.mark.parametrize("bad, msg", [
    (np.array([0.5]), "split 'forget' must hold integers only; entry 0 is float 0.5"),
    (torch.tensor([1.0]), "split 'forget' must hold integers only; entry 0 is float 1.0"),
    (np.array([True]), "split 'forget' must hold integers only; entry 0 is bool True"),
    (torch.tensor([True]), "entry 0 is bool True"),
    ([np.bool_(True)], "split .forget. must hold integers only; entry 0 is bool"),
    (np.array([[0, 1]]), r"split 'forget' must be a 1-D sequence of integer indices, got an array of shape \(1, 2\)"),
    (torch.tensor(3), r"split 'forget' must be a 1-D sequence .* shape \(\)"),
    ({3, 4}, "split 'forget' must be a list of integer indices, got set"),
    ("12", "split 'forget' must be a list of integer indices, got str"),
    (5, "split 'forget' must be a list of integer indices, got int"),
])
def test_bad_index_sequences_are_refused_at_construction(bad, msg):
    with pytest.raises(ValueError, match=msg):
        IndexSplit(bad, [1], [2])


def test_bad_targets_are_refused_at_construction():
    with pytest.raises(ValueError, match="targets must hold integers only; entry 0 is float 0.0"):
        IndexSplit([0], [1], [2], targets=np.array([0, 0.5, 1]))
    with pytest.raises(ValueError, match=r"targets must be a 1-D sequence .* shape \(3, 1\)"):
        IndexSplit([0], [1], [2], targets=torch.zeros(3, 1, dtype=torch.long))


def test_lists_assigned_after_construction_are_checked_as_plain_ints():
    s = IndexSplit([0], [1], [2])
    s.forget = np.array([1])
    with pytest.raises(ValueError, match="splits .forget. and .adjacent. share indices \\(1\\)"):
        s.check()
    s.forget = np.array([0])
    s.check()                               # np.array([0]) is not "empty"


# ----------------------------------------------------------------------------------- split files
FINE = np.array([0, 1, 2, 3, 4, 5] * 5)
F2C = np.array([0, 0, 1, 1, 2, 2])


def _rehashed(tmp_path, **change):
    d = split_by_hierarchy(FINE, F2C, 1).to_dict()
    d.update(change)
    d["sha256"] = split_hash(d)
    p = tmp_path / "s.json"
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize("sha", [5, None, ["ab"], {"x": 1}])
def test_load_split_with_a_hash_that_is_not_a_string_names_the_file(tmp_path, sha):
    p = _rehashed(tmp_path)
    d = json.loads(p.read_text())
    d["sha256"] = sha                       # 5 was TypeError: 'int' object is not subscriptable
    p.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="the sha256 content hash must be a hex string") as e:
        load_split(p)
    assert str(p) in str(e.value)


@pytest.mark.parametrize("change, msg", [
    ({"forget": 5}, "split 'forget' must be a list of integer indices, got int"),
    ({"adjacent": {"0": 1}}, "split 'adjacent' must be a list of integer indices, got dict"),
    ({"remote": "1,2"}, "split 'remote' must be a list of integer indices, got str"),
    ({"forget": [[1]]}, "split 'forget' must hold integers only; entry 0 is list"),
    ({"targets": 3}, "targets must be a list of integer indices, got int"),
    ({"meta": [1]}, "meta must be a dict, got list"),
    ({"format": 1}, "is not an entangle_ext split file"),
])
def test_load_split_fields_of_the_wrong_type_name_the_file(tmp_path, change, msg):
    p = _rehashed(tmp_path, **change)
    with pytest.raises(ValueError, match=msg) as e:
        load_split(p)
    assert str(p) in str(e.value)
