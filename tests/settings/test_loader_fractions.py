"""The held-out share of the loaders (`check_fraction`, shared): `digits_splits` checks its
test_fraction up front ((0, 1), at least 10 images on each side) instead of passing scikit-learn's
InvalidParameterError about ``test_size`` through, and `toxigen_index_splits` ([0, 1)) refuses a
str or bool with a TypeError naming test_fraction instead of a raw comparison error."""
import numpy as np
import pytest

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("f", [0, 0.0, 1, 1.0, -0.1, 1.5, float("nan"), float("inf")])
def test_digits_test_fraction_outside_the_open_interval_is_our_value_error(f):
    pytest.importorskip("sklearn")
    from entangle_ext.data.digits import digits_splits
    with pytest.raises(ValueError, match=r"test_fraction must be in \(0, 1\) \(the held-out share\)") as e:
        digits_splits(test_fraction=f)
    assert type(e.value) is ValueError          # not scikit-learn's InvalidParameterError (a ValueError subclass)


@pytest.mark.parametrize("f", ["0.3", True, None, [0.3]])
def test_digits_test_fraction_of_another_type_is_a_type_error(f):
    pytest.importorskip("sklearn")
    from entangle_ext.data.digits import digits_splits
    with pytest.raises(TypeError, match=r"test_fraction must be a real number in \(0, 1\)"):
        digits_splits(test_fraction=f)


@pytest.mark.parametrize("f", [0.001, 0.999])
def test_digits_test_fraction_leaving_too_few_images_on_a_side(f):
    pytest.importorskip("sklearn")
    from entangle_ext.data.digits import digits_splits
    with pytest.raises(ValueError, match=r"holds out \d+ of the 1797 images: the stratified split needs at least 10"):
        digits_splits(test_fraction=f)


def test_digits_accepts_numpy_and_small_fractions():
    pytest.importorskip("sklearn")
    from entangle_ext.data.digits import digits_splits
    _, info = digits_splits(test_fraction=np.float32(0.5), max_train_per_digit=2)
    assert sum(v for k, v in info["sizes"].items() if k.endswith("_test")) == 899
    digits_splits(test_fraction=0.006, max_train_per_digit=2)   # 11 held out: one per digit fits


@pytest.mark.parametrize("f, err, msg", [
    ("0.2", TypeError, r"test_fraction must be a real number in \[0, 1\), got str"),   # was '<=' not supported
    (True, TypeError, "got bool True"),
    (1.0, ValueError, r"test_fraction must be in \[0, 1\)"),
    (float("nan"), ValueError, r"test_fraction must be in \[0, 1\)"),
])
def test_toxigen_test_fraction_uses_the_shared_check(f, err, msg):
    from entangle_ext.data.toxigen import toxigen_index_splits
    with pytest.raises(err, match=msg):
        toxigen_index_splits({}, test_fraction=f)


def test_check_fraction():
    from entangle_ext.data.checks import check_fraction
    assert check_fraction(0.25) == 0.25 and check_fraction(np.float64(0.5)) == 0.5
    assert check_fraction(0, zero_ok=True) == 0.0
    with pytest.raises(ValueError, match=r"share must be in \(0, 1\)"):
        check_fraction(0, "share")
