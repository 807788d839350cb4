"""Bad input to the split builders, the split files, the data loaders, `prepare` / `train_original`
and the python_examples scripts: a clear exception (or one ``SCRIPT: error:`` line, exit 2) naming
what is wrong, raised before any data is read or any training starts; never a silent wrong answer.
Everything here is tiny and synthetic."""
import importlib.util
import json
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from entangle_ext.splits import (IndexSplit, extract_features, load_split, save_split, split_by_attributes,
                                 split_by_group, split_by_hierarchy, split_by_similarity, split_hash, subset_splits)

from _support import REPO_ROOT

pytestmark = pytest.mark.usefixtures("one_thread")

FINE = np.array([0, 1, 2, 3, 4, 5] * 5)
F2C = np.array([0, 0, 1, 1, 2, 2])


# ------------------------------------------------------------------------ split_by_similarity
def _planted():
    """Retain rows 40..49 are near-copies of the 5 forget rows; rows 0..39 are far away."""
    rng = np.random.default_rng(0)
    ff = rng.normal(size=(5, 4)) + 10
    fr = rng.normal(size=(50, 4))
    fr[40:45], fr[45:50] = ff + 1e-3, ff + 2e-3
    return fr, ff


def test_similarity_finds_the_near_copies_and_refuses_a_bad_chunk():
    fr, ff = _planted()
    assert split_by_similarity(fr, ff, k=2, fraction=0.2, metric="euclidean").adjacent == list(range(40, 50))
    assert split_by_similarity(fr, ff, k=2, fraction=0.2, metric="euclidean", chunk=2).adjacent == list(range(40, 50))
    for chunk in (-1, 0):   # -1: the loop never ran and positions 0..9 came back as "adjacent"
        with pytest.raises(ValueError, match=f"chunk must be an integer >= 1, got {chunk}"):
            split_by_similarity(fr, ff, k=2, fraction=0.2, chunk=chunk)
    with pytest.raises(TypeError, match="chunk must be an integer"):
        split_by_similarity(fr, ff, k=2, fraction=0.2, chunk=2.5)


@pytest.mark.parametrize("k", [3.5, True, "3"])
def test_similarity_k_must_be_an_int(k):
    fr, ff = _planted()
    with pytest.raises(TypeError, match="k must be an integer"):
        split_by_similarity(fr, ff, k=k, fraction=0.2)


def test_similarity_k_accepts_numpy_and_0d_tensor_ints():
    fr, ff = _planted()
    want = split_by_similarity(fr, ff, k=2, fraction=0.2).adjacent
    assert split_by_similarity(fr, ff, k=np.int64(2), fraction=0.2).adjacent == want
    assert split_by_similarity(fr, ff, k=torch.tensor(2), fraction=0.2).adjacent == want


@pytest.mark.parametrize("where", ["retain", "forget"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_similarity_refuses_non_finite_features(where, bad):
    fr, ff = _planted()
    (fr if where == "retain" else ff)[3, 1] = bad
    with pytest.raises(ValueError, match=f"features_{where} holds 1 NaN or infinite value.*first row 3"):
        split_by_similarity(fr, ff, k=2, fraction=0.2)


def test_similarity_refuses_string_features_and_fraction():
    fr, ff = _planted()
    with pytest.raises(TypeError, match="features_retain must hold real numbers"):
        split_by_similarity(fr.astype(str), ff, k=2)
    with pytest.raises(TypeError, match="fraction must be a real number"):
        split_by_similarity(fr, ff, k=2, fraction="0.2")


def test_similarity_meta_says_which_index_space_each_list_is_in():
    fr, ff = _planted()
    s = split_by_similarity(fr, ff, k=2, fraction=0.2, forget_indices=np.arange(50, 55))
    assert s.forget == [50, 51, 52, 53, 54]
    assert s.meta["index_space"] == "positions in features_retain / forget_indices"
    s = split_by_similarity(fr, ff, k=2, fraction=0.2, retain_indices=np.arange(100, 150))
    assert s.meta["index_space"] == "retain_indices / positions in features_forget"
    s = split_by_similarity(fr, ff, k=2, fraction=0.2)
    assert s.meta["index_space"] == "positions in features_retain / positions in features_forget"
    s = split_by_similarity(fr, ff, k=2, fraction=0.2, retain_indices=np.arange(50), forget_indices=np.arange(50, 55))
    assert s.meta["index_space"] == "global"


@pytest.mark.parametrize("given", ["retain", "forget"])
@pytest.mark.parametrize("bad, msg", [(lambda a: np.concatenate([a[:1], a[:-1]]), "repeats index"),
                                      (lambda a: np.concatenate([[-1], a[1:]]), r"must be sample indices >= 0, got -1")])
def test_similarity_refuses_repeated_or_negative_indices_given_alone(given, bad, msg):
    """With one index list alone nothing checked it: a repeated retain index landed in adjacent and
    remote at once, a -1 passed as a sample."""
    fr, ff = _planted()
    kw = {"retain_indices": bad(np.arange(100, 150))} if given == "retain" else {"forget_indices": bad(np.arange(5))}
    with pytest.raises(ValueError, match=f"{given}_indices {msg}"):
        split_by_similarity(fr, ff, k=2, fraction=0.2, **kw)


# ------------------------------------------------------------------------ split_by_attributes
ATTRS = {"Male": np.array([1, -1] * 10), "Smiling": np.array([1, 1, -1, -1] * 5),
         "Young": np.array([-1] * 10 + [1] * 10), "Eyeglasses": np.array([1, -1, -1, 1, -1] * 4)}
NAMES = (["Male", "Smiling"], ["Young", "Eyeglasses"])


def test_attributes_read_minus_one_as_absent_in_forget_subclass_too():
    """CelebA's {-1, +1}: -1 = absent, in the columns and in forget_subclass alike (it read -1 as
    present there and forgot the opposite sub-class)."""
    zero = split_by_attributes(ATTRS, *NAMES, {k: 0 for k in ATTRS})
    minus = split_by_attributes(ATTRS, *NAMES, {k: -1 for k in ATTRS})
    false = split_by_attributes(ATTRS, *NAMES, {k: False for k in ATTRS})
    assert minus.forget == zero.forget == false.forget
    assert minus.meta["forget_subclass"] == {k: False for k in ATTRS} and minus.meta["forget_target"] == 0
    plus = split_by_attributes(ATTRS, *NAMES, {"Male": 1, "Smiling": True, "Young": -1, "Eyeglasses": 1})
    assert plus.meta["forget_target"] == 3 and 0 in plus.forget
    assert plus.meta["forget_subclass"] == {"Male": True, "Smiling": True, "Young": False, "Eyeglasses": True}


@pytest.mark.parametrize("value", [2, 0.5, "yes", None])
def test_attributes_refuse_undocumented_forget_values(value):
    with pytest.raises(ValueError, match=r"forget_subclass\['Male'\] must be True / 1 .* or False / 0 / -1"):
        split_by_attributes(ATTRS, *NAMES, {**{k: 0 for k in ATTRS}, "Male": value})


def test_attributes_clear_errors_for_str_columns_and_empty_lists():
    fs = {k: 0 for k in ATTRS}
    with pytest.raises(ValueError, match="attribute 'Male' must hold numbers or bools.*dtype <U"):
        split_by_attributes({k: v.astype(str) for k, v in ATTRS.items()}, *NAMES, fs)
    with pytest.raises(ValueError, match="target_attrs is empty"):
        split_by_attributes(ATTRS, [], NAMES[1], {"Young": 0, "Eyeglasses": 0})
    with pytest.raises(ValueError, match="subclass_attrs is empty"):
        split_by_attributes(ATTRS, NAMES[0], [], {"Male": 0, "Smiling": 0})
    with pytest.raises(TypeError, match="target_attrs must be a list of attribute names, not one str 'Male'"):
        split_by_attributes(ATTRS, "Male", ["Young"], {"Male": 0, "Young": 0})
    with pytest.raises(ValueError, match="attribute 'Young' holds NaN"):
        split_by_attributes({**ATTRS, "Young": np.where(ATTRS["Young"] > 0, np.nan, 0.0)}, *NAMES, fs)


# -------------------------------------------------------------- split_by_hierarchy / split_by_group
@pytest.mark.parametrize("label", [1, np.int64(1), torch.tensor(1), np.array(1), [1], np.array([1]),
                                   torch.tensor([1])])
def test_hierarchy_accepts_integer_labels_of_every_kind(label):
    s = split_by_hierarchy(FINE, F2C, label)
    assert s.meta["forget_fine"] == [1] and s.sizes() == {"forget": 5, "adjacent": 5, "remote": 20}


@pytest.mark.parametrize("label", [1.5, 1.0, True, "1", "aquarium_fish", [1, 0.5], torch.tensor(1.0)])
def test_hierarchy_refuses_non_integer_labels(label):
    with pytest.raises(TypeError, match="forget_fine.* must be an integer"):
        split_by_hierarchy(FINE, F2C, label, fine_names=list("abcdef"))


def test_hierarchy_names_must_cover_the_classes():
    with pytest.raises(ValueError, match="fine_names has 1 names but 6 fine classes"):
        split_by_hierarchy(FINE, F2C, 1, fine_names=["a"])
    with pytest.raises(ValueError, match="coarse_names has 2 names but 3 coarse classes"):
        split_by_hierarchy(FINE, F2C, 1, coarse_names=["x", "y"])
    with pytest.raises(ValueError, match="fine_to_coarse entries must be coarse indices >= 0, or -1"):
        split_by_hierarchy(FINE, np.array([0, 0, 1, 1, -2, -2]), 1)


def test_group_labels_must_be_integers():
    g, y = np.array(["a", "b", "c"] * 10), np.array([0, 1] * 15)
    assert split_by_group(g, y, "a", np.int64(1), flip_label=torch.tensor(0)).meta["flip_label"] == 0
    with pytest.raises(TypeError, match="forget_label must be an integer.*float 1.5"):
        split_by_group(g, y, "a", 1.5)
    with pytest.raises(TypeError, match="flip_label must be an integer"):
        split_by_group(g, y, "a", 1, flip_label=0.5)
    with pytest.raises(TypeError, match="groups must be a sequence"):
        split_by_group("abcabc", [0, 1, 0, 1, 0, 1], "a", 1)


_FLOAT_ARRAYS = {"1e20": lambda n: np.full(n, 1e20), "inf": lambda n: np.full(n, np.inf),
                 "whole": lambda n: np.arange(n, dtype=np.float64),
                 "tensor": lambda n: torch.arange(n, dtype=torch.float32)}


@pytest.mark.parametrize("kind", _FLOAT_ARRAYS)
@pytest.mark.parametrize("where", ["fine_labels", "fine_to_coarse", "labels", "retain_indices", "forget_indices"])
def test_builders_refuse_float_label_and_index_arrays(kind, where):
    """The builders cast a float array of whole values to int64: 1e20 and inf wrapped around to
    -9223372036854775808 (a label or an index nobody passed), while the data loaders, `IndexSplit`
    and every scalar label refuse floats. Now every builder refuses them too, naming the argument."""
    fr, ff = _planted()
    a = _FLOAT_ARRAYS[kind]
    calls = {"fine_labels": lambda: split_by_hierarchy(a(30), F2C, 1),
             "fine_to_coarse": lambda: split_by_hierarchy(FINE, a(6), 1),
             "labels": lambda: split_by_group(np.array(["a", "b", "c"] * 10), a(30), "a", 1),
             "retain_indices": lambda: split_by_similarity(fr, ff, k=2, fraction=0.2, retain_indices=a(50)),
             "forget_indices": lambda: split_by_similarity(fr, ff, k=2, fraction=0.2, forget_indices=a(5))}
    with pytest.raises(ValueError, match=f"{where} must hold integers, got dtype float.*floats are not cast"):
        calls[where]()


# --------------------------------------------------------------------------------- subset_splits
def test_subset_splits_checks_indices_against_the_dataset():
    s = split_by_hierarchy(FINE, F2C, 1)                       # indices up to 29
    small = TensorDataset(torch.randn(12, 8), torch.zeros(12, dtype=torch.long))
    with pytest.raises(ValueError, match=r"split 'forget' holds indices beyond dataset \(length 12\): \[13, 19"):
        subset_splits(small, s)
    big = TensorDataset(torch.randn(30, 8), torch.zeros(30, dtype=torch.long))
    with pytest.raises(ValueError, match="beyond test_dataset"):
        subset_splits(big, s, test_dataset=small, test_split=s)
    with pytest.raises(ValueError, match="negative"):
        subset_splits(big, IndexSplit([-1], [1], [2]))
    with pytest.raises(ValueError, match="must hold integers only; entry 0 is float 1.5"):
        subset_splits(big, IndexSplit([1.5], [1], [2]))
    with pytest.raises(ValueError, match="test_dataset and test_split together"):
        subset_splits(big, s, test_dataset=big)
    fr, ff = _planted()
    with pytest.raises(ValueError, match="different index spaces"):
        subset_splits(TensorDataset(torch.randn(55, 4), torch.zeros(55, dtype=torch.long)),
                      split_by_similarity(fr, ff, k=2, fraction=0.2))
    assert len(subset_splits(big, s).forget) == 5


# ------------------------------------------------------------------------------ extract_features
def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def test_extract_features_takes_a_dataloader():
    x, y = torch.randn(30, 8), torch.randint(0, 3, (30,))
    want = extract_features(_mlp(), x)
    got = extract_features(_mlp(), DataLoader(TensorDataset(x, y), batch_size=7))
    assert got.shape == (30, 16) and torch.allclose(got, want, atol=1e-6)


def test_extract_features_bad_batch_size_and_width():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        extract_features(_mlp(), x, batch_size=0)
    with pytest.raises(TypeError, match="batch_size must be an integer"):
        extract_features(_mlp(), x, batch_size=2.5)
    with pytest.raises(ValueError, match="first nn.Linear expects 8 features per sample, the data has 5"):
        extract_features(_mlp(), torch.randn(4, 5))
    with pytest.raises(TypeError, match="data must be a tensor, a map-style Dataset"):
        extract_features(_mlp(), iter([x]))


# ----------------------------------------------------------------------------------- split files
def _rehashed(tmp_path, name, **change):
    s = split_by_hierarchy(FINE, F2C, 1)
    d = s.to_dict()
    d.update(change)
    d["sha256"] = split_hash(d)
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize("change, msg", [
    ({"forget": ["1"]}, "split 'forget' must hold integers only; entry 0 is str '1'"),
    ({"forget": [1.5]}, "split 'forget' must hold integers only; entry 0 is float 1.5"),
    ({"adjacent": [True]}, "split 'adjacent' must hold integers only; entry 0 is bool True"),
    ({"targets": [0.5] * 30}, "targets must hold integers only"),
])
def test_load_split_refuses_non_integer_entries_naming_the_file(tmp_path, change, msg):
    p = _rehashed(tmp_path, "s.json", **change)
    with pytest.raises(ValueError, match=msg) as e:
        load_split(p)
    assert str(p) in str(e.value)


def test_load_split_non_utf8_names_the_file(tmp_path):
    p = tmp_path / "bin.json"
    p.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ValueError, match="not UTF-8 text") as e:
        load_split(p)
    assert str(p) in str(e.value)


def test_save_split_refuses_non_integer_indices(tmp_path):
    with pytest.raises(ValueError, match="entry 0 is float 0.5"):
        save_split(tmp_path / "s.json", IndexSplit([0.5], [1], [2]))
    assert not (tmp_path / "s.json").exists()


# ------------------------------------------------------------------------------------ loaders
@pytest.mark.parametrize("cap", [-1, 0, 1.5, True])
def test_digits_cap_is_checked(cap):
    pytest.importorskip("sklearn")
    from entangle_ext.data.digits import digits_splits
    with pytest.raises(ValueError, match="max_train_per_digit must be an integer >= 1"):
        digits_splits(max_train_per_digit=cap)


def test_digits_dtype_must_be_floating():
    pytest.importorskip("sklearn")
    from entangle_ext.data.digits import digits_splits
    with pytest.raises(TypeError, match="dtype must be a floating torch dtype.*torch.int64"):
        digits_splits(dtype=torch.int64)


def test_cifar100_cap_and_dtype_are_checked(tmp_path):
    from entangle_ext.data.cifar100 import cifar100_splits
    with pytest.raises(ValueError, match=r"max_train_per_class must be an integer >= 1 \(or None = no cap\), got -1"):
        cifar100_splits(tmp_path / "absent", max_train_per_class=-1)   # checked before the data are looked for
    with pytest.raises(ValueError, match=r"max_test_per_class must be an integer >= 1 \(or None = no cap\), got 0"):
        cifar100_splits(tmp_path / "absent", max_test_per_class=0)
    with pytest.raises(TypeError, match="dtype must be a floating torch dtype"):
        cifar100_splits(tmp_path / "absent", dtype=torch.uint8)


def test_tinyimagenet_and_celeba_caps_are_checked(tmp_path):
    from entangle_ext.data.celeba import celeba_splits
    from entangle_ext.data.tinyimagenet import load_tinyimagenet
    with pytest.raises(ValueError, match=r"max_val_per_class must be an integer >= 1 \(or None = no cap\), got -1"):
        load_tinyimagenet(tmp_path / "absent", max_val_per_class=-1)
    with pytest.raises(ValueError, match=r"max_test_per_class must be an integer >= 1 \(or None = no cap\), got -1"):
        celeba_splits(tmp_path / "absent", max_test_per_class=-1)


# ---------------------------------------------------------------------------------- ENTANGLE_DATA
@pytest.fixture
def fresh_warnings(monkeypatch, tmp_path):
    from entangle_ext.data import root as root_mod
    monkeypatch.setattr(root_mod, "_warned", set(), raising=False)
    monkeypatch.delenv("ENTANGLE_SHARED_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "x.csv").write_text("")
    monkeypatch.setattr(root_mod, "checkout_data_dir", lambda: checkout)
    return checkout


def test_mistyped_entangle_data_warns_once_naming_it(monkeypatch, tmp_path, fresh_warnings):
    from entangle_ext.data import find_data_file
    monkeypatch.setenv("ENTANGLE_DATA", str(tmp_path / "typo"))
    with pytest.warns(UserWarning, match=f"ENTANGLE_DATA={tmp_path / 'typo'} is not an existing directory"):
        assert find_data_file("x.csv") == fresh_warnings / "x.csv"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        find_data_file("x.csv")                                      # once per value


def test_entangle_data_without_the_file_warns_naming_the_place_used(monkeypatch, tmp_path, fresh_warnings):
    from entangle_ext.data import find_data_file
    env = tmp_path / "env"
    env.mkdir()
    monkeypatch.setenv("ENTANGLE_DATA", str(env))
    with pytest.warns(UserWarning, match=f"ENTANGLE_DATA={env} has no x.csv; using {fresh_warnings}"):
        assert find_data_file("x.csv") == fresh_warnings / "x.csv"
    (env / "x.csv").write_text("")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert find_data_file("x.csv") == env / "x.csv"


# ------------------------------------------------------------------- prepare / train_original cache
def test_prepare_refuses_a_file_as_cache_dir_before_loading(monkeypatch, tmp_path):
    import dataclasses
    from entangle_ext.settings import SETTINGS, prepare

    def boom(*a, **k):
        raise AssertionError("the data were loaded before cache_dir was checked")
    monkeypatch.setitem(SETTINGS, "digits", dataclasses.replace(SETTINGS["digits"], load=boom))
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(ValueError, match=f"cache_dir '{f}' exists and is not a directory"):
        prepare("digits", cache_dir=f, progress=False)
    with pytest.raises(TypeError, match="cache_dir must be a path"):
        prepare("digits", cache_dir=3, progress=False)


def test_train_original_checks_the_cache_folder_before_training(monkeypatch, tmp_path):
    from entangle_ext import train
    monkeypatch.setattr(train, "fit", lambda *a, **k: pytest.fail("trained before the cache folder was checked"))
    f = tmp_path / "file"
    f.write_text("")
    data = TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,)))
    with pytest.raises(ValueError, match="exists and is not a directory"):
        train.train_original(torch.nn.Linear(4, 2), [data], train.TrainRecipe("adam", epochs=1, batch_size=4),
                             device="cpu", cache=f / "m.pt", progress=False)


# ------------------------------------------------------------------------------ python_examples
def _example(name):
    spec = importlib.util.spec_from_file_location(f"_ex_{name}", REPO_ROOT / "python_examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("flags, msg", [
    (["--threads", "-1"], "--threads must be an integer in [1, 1024] (torch CPU threads; this process may run on"),
    (["--threads", "0"], "--threads must be an integer in [1, 1024]"),
    (["--epochs", "-1"], "epochs must be an integer >= 0, got -1"),
])
def test_similarity_example_bad_flags_one_line_exit_2(flags, msg, capsys, tmp_path, monkeypatch):
    ex = _example("similarity_split_cifar100")
    monkeypatch.setattr(ex, "load_cifar100", lambda *a: pytest.fail("data read before the flags were checked"))
    before = torch.get_num_threads()
    with pytest.raises(SystemExit) as e:
        ex.main(flags + ["--data-root", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("similarity_split_cifar100: error: ")
    assert msg in err[0] and torch.get_num_threads() == before


@pytest.mark.parametrize("name, flags", [
    ("cifar100_resnet18", ["--variant", "reduced"]),
    ("celeba_vit", ["--reduced", "--make-miniature", "MINI"]),
    ("tinyimagenet_vit", ["--variant", "reduced"]),
    ("toxigen_transformer", ["--reduced"]),
])
def test_examples_refuse_a_file_as_out_before_any_work(name, flags, capsys, tmp_path, monkeypatch):
    ex = _example(name)
    monkeypatch.setattr(ex, "prepare", lambda *a, **k: pytest.fail("prepare ran before --out was checked"))
    f = tmp_path / "out"
    f.write_text("")
    with pytest.raises(SystemExit) as e:
        ex.main([x.replace("MINI", str(tmp_path / "mini")) for x in flags] + ["--out", str(f), "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err == [f"{name}: error: --out '{f}' exists and is not a directory"]
    assert not (tmp_path / "mini").exists()                      # no miniature written either


def test_collections_and_0d_values_that_worked_before_still_do():
    """The new integer / bool / index checks must not refuse what the builders took before: a
    set or generator of fine classes, a 0-d array fraction, a 0-d bool tensor in forget_subclass,
    range index lists and array targets."""
    fine, f2c = np.array([0, 1, 2, 3, 0, 1]), np.array([0, 0, 1, 1])
    want = split_by_hierarchy(fine, f2c, [0])
    for given in ({0}, (c for c in [0]), {0: "x"}.keys(), np.array([0]), torch.tensor([0])):
        got = split_by_hierarchy(fine, f2c, given)
        assert (got.forget, got.adjacent, got.remote) == (want.forget, want.adjacent, want.remote)
    g = torch.Generator().manual_seed(0)
    fr, ff = torch.randn(20, 3, generator=g), torch.randn(4, 3, generator=g)
    assert split_by_similarity(fr, ff, k=2, fraction=np.array(0.25)).adjacent == \
        split_by_similarity(fr, ff, k=2, fraction=0.25).adjacent
    attrs = {"A": np.array([1, 1, 0, 0]), "B": np.array([1, 0, 1, 0])}
    assert split_by_attributes(attrs, ["A"], ["B"], {"A": torch.tensor(True), "B": np.bool_(True)}).forget == [0]
    IndexSplit(forget=range(2), adjacent=[2, 3], remote=range(4, 6),
               targets=np.array([0, 0, 1, 1, 2, 2])).check()
    with pytest.raises(ValueError, match="must hold integers only"):
        IndexSplit(forget=np.array([0.5]), adjacent=[1], remote=[2]).check()
