"""Malformed arrays inside a readable CIFAR-100 archive (right keys, wrong content): a ValueError
naming the file and the key, never a raw IndexError / RuntimeError from deep inside, and never a
silently wrong split (float images scaled twice, labels dropped or wrapped around, a fine class
filed under superclass 0). Tiny synthetic files (tmp_path)."""
import numpy as np
import pytest

FINE = ["aquarium_fish", "trout", "rose", "tulip", "bee", "ant"]
COARSE = ["fish", "flowers", "insects"]


def _arrays(**over):
    """6 fine / 3 coarse classes, 2 train + 1 test image per fine class; ``over`` replaces keys."""
    fine_tr, fine_te = np.repeat(np.arange(6), 2), np.arange(6)
    rng = np.random.default_rng(0)
    arrs = {"x_train": rng.integers(0, 256, (12, 32, 32, 3), dtype=np.uint8), "y_train_fine": fine_tr,
            "y_train_coarse": fine_tr // 2, "x_test": rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8),
            "y_test_fine": fine_te, "y_test_coarse": fine_te // 2,
            "fine_names": np.array(FINE), "coarse_names": np.array(COARSE)}
    arrs.update(over)
    return arrs


def _load(tmp_path, **over):
    from entangle_ext.data.cifar100 import load_cifar100
    p = tmp_path / "c.npz"
    np.savez(p, **_arrays(**over))
    return p, (lambda: load_cifar100(p))


x12 = np.zeros((12, 32, 32, 3), np.uint8)
BAD = [
    ("float images", dict(x_train=np.random.rand(12, 32, 32, 3).astype(np.float32)), "'x_train' must hold uint8 images"),
    ("int images > 255", dict(x_test=np.full((6, 32, 32, 3), 1000)), "'x_test' must hold uint8 images"),
    ("channels first", dict(x_train=np.zeros((12, 3, 32, 32), np.uint8)), r"'x_train' must have shape \(N, 32, 32, 3\)"),
    ("2-D images", dict(x_train=np.zeros((12, 3072), np.uint8)), r"'x_train' must have shape"),
    ("fewer images", dict(x_train=x12[:10]), "'y_train_fine' has 12 labels for 10 images"),
    ("label == classes", dict(y_train_fine=np.where(np.repeat(np.arange(6), 2) == 5, 6, np.repeat(np.arange(6), 2))),
     r"'y_train_fine' has labels outside 0..5 .* e.g. 6"),
    ("negative label", dict(y_test_fine=np.array([0, 1, 2, 3, 4, -1])), r"'y_test_fine' has labels outside 0..5"),
    ("coarse beyond names", dict(coarse_names=np.array(["fish"])), r"'y_train_coarse' has labels outside 0..0"),
    ("float labels", dict(y_train_coarse=np.repeat(np.arange(6), 2) / 2.0), "'y_train_coarse' must be a 1-D array of integer labels"),
    ("string labels", dict(y_test_coarse=np.array(list("abcdef"))), "'y_test_coarse' must be a 1-D array of integer labels"),
    ("short names", dict(fine_names=np.array(FINE[:5])), r"'y_train_fine' has labels outside 0..4"),
    ("repeated names", dict(fine_names=np.array(FINE[:5] + ["trout"])), "'fine_names' repeats a name"),
    ("numeric names", dict(coarse_names=np.arange(3)), "'coarse_names' must be a non-empty 1-D array of strings"),
]


@pytest.mark.parametrize("case, over, msg", BAD, ids=[b[0] for b in BAD])
def test_malformed_cifar100_arrays_name_the_file_and_key(tmp_path, case, over, msg):
    p, load = _load(tmp_path, **over)
    with pytest.raises(ValueError, match=msg) as e:
        load()
    assert str(p) in str(e.value)


@pytest.mark.parametrize("case, over, msg", BAD[:3], ids=[b[0] for b in BAD[:3]])
def test_a_loaded_dict_given_as_data_is_checked_too(case, over, msg):
    from entangle_ext.data.cifar100 import cifar100_splits
    with pytest.raises(ValueError, match=msg):
        cifar100_splits(data=_arrays(**over))


def test_a_fine_class_without_train_images_is_named(tmp_path):
    """It was filed under superclass 0 (the map came from the train labels only), and the error
    blamed the test labels ("a fine class appears under two coarse classes")."""
    from entangle_ext.data.cifar100 import cifar100_splits
    keep = np.repeat(np.arange(6), 2) != 3
    _, load = _load(tmp_path, x_train=np.zeros((10, 32, 32, 3), np.uint8),
                    y_train_fine=np.repeat(np.arange(6), 2)[keep], y_train_coarse=(np.repeat(np.arange(6), 2) // 2)[keep])
    with pytest.raises(ValueError, match=r"fine classes without train images: \['tulip'\]"):
        cifar100_splits(data=load())


def test_a_fine_class_under_two_superclasses_is_named(tmp_path):
    from entangle_ext.data.cifar100 import cifar100_splits
    _, load = _load(tmp_path, y_test_coarse=np.array([0, 0, 1, 1, 2, 1]))
    with pytest.raises(ValueError, match=r"fine class 'ant' appears under two superclasses, 'insects' and 'flowers' \(test\)"):
        cifar100_splits(data=load())


def test_good_arrays_still_give_the_splits_and_an_upper_case_suffix_is_found(tmp_path):
    from entangle_ext.data.cifar100 import cifar100_splits, find_cifar100, load_cifar100
    p = tmp_path / "DATA.NPZ"
    np.savez(tmp_path / "x.npz", **_arrays())
    (tmp_path / "x.npz").rename(p)
    assert find_cifar100(p) == p
    s, info = cifar100_splits(data=load_cifar100(p))
    assert info["sizes"] == {"forget": 2, "adjacent": 2, "remote": 8, "forget_test": 1, "adjacent_test": 1,
                             "remote_test": 4}
    x = s.remote.tensors[0]
    assert x.min() < -1.5 and x.max() > 1.5   # uint8 pixels normalised once: the full range, not ~constant


def test_a_forget_class_outside_the_variants_superclasses_names_them_and_the_flag(tmp_path):
    """``--variant reduced --forget apple`` said "superclasses must include 'fruit_and_vegetables',
    the forget class's superclass" though no superclasses were given: the variant's were."""
    from entangle_ext.data.cifar100 import ForgetSuperclassMissing
    from entangle_ext.settings import prepare
    fine_tr, fine_te = np.repeat(np.arange(7), 2), np.arange(7)
    coarse = np.array([0, 0, 1, 1, 2, 2, 3])
    p = tmp_path / "c.npz"
    np.savez(p, **_arrays(x_train=np.zeros((14, 32, 32, 3), np.uint8), y_train_fine=fine_tr,
                          y_train_coarse=coarse[fine_tr], x_test=np.zeros((7, 32, 32, 3), np.uint8),
                          y_test_fine=fine_te, y_test_coarse=coarse, fine_names=np.array(FINE + ["apple"]),
                          coarse_names=np.array(COARSE + ["fruit_and_vegetables"])))
    with pytest.raises(ValueError) as e:
        prepare("cifar100", "reduced", data_root=p, data={"forget": "apple"}, progress=False)
    assert str(e.value) == (
        "forget class 'apple' is in superclass 'fruit_and_vegetables', which variant 'reduced' of cifar100 leaves "
        "out: the variant's superclasses are ['fish', 'flowers', 'insects']; pass --superclasses "
        "fish,flowers,insects,fruit_and_vegetables (from Python: data={'superclasses': [..., "
        "'fruit_and_vegetables']})")
    with pytest.raises(ForgetSuperclassMissing, match=r"superclasses \['fish', 'flowers'\] do not include "
                                                      r"'fruit_and_vegetables', the superclass of the forget class "
                                                      r"'apple': give superclasses that include it"):
        prepare("cifar100", "reduced", data_root=p, data={"forget": "apple", "superclasses": ["fish", "flowers"]},
                progress=False)   # the caller's own superclasses: the loader's message
