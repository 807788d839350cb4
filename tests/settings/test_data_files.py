"""Wrong, corrupt or inconsistent data files and loader options: every reader raises ValueError /
FileNotFoundError / TypeError naming the file (and line) or the option, never a raw low-level error.
All data here is tiny and synthetic (tmp_path)."""
import numpy as np
import pytest


FINE = ["aquarium_fish", "trout", "rose", "tulip", "bee", "ant"]
COARSE = ["fish", "flowers", "insects"]


def _cifar_npz(path, **drop_or_replace):
    """A 6-fine / 3-coarse CIFAR-100-format npz, 2 train + 1 test image per fine class."""
    fine_tr, fine_te = np.repeat(np.arange(6), 2), np.arange(6)
    arrs = {"x_train": np.zeros((12, 32, 32, 3), np.uint8), "y_train_fine": fine_tr, "y_train_coarse": fine_tr // 2,
            "x_test": np.zeros((6, 32, 32, 3), np.uint8), "y_test_fine": fine_te, "y_test_coarse": fine_te // 2,
            "fine_names": np.array(FINE), "coarse_names": np.array(COARSE)}
    arrs.update(drop_or_replace)
    np.savez(path, **{k: v for k, v in arrs.items() if v is not None})
    return path


@pytest.mark.parametrize("make, msg", [
    (lambda p: p.write_bytes(_cifar_npz(p.parent / "ok.npz").read_bytes()[:300]), "not a zip file"),
    (lambda p: p.write_text("just text\n"), "not a zip file"),
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: _cifar_npz(p, x_train=None, fine_names=None), r"missing keys \['x_train', 'fine_names'\]"),
])
def test_cifar100_bad_npz_names_the_file(tmp_path, make, msg):
    from entangle_ext.data.cifar100 import load_cifar100
    p = tmp_path / "cifar100.npz"
    make(p)
    with pytest.raises(ValueError, match=msg) as e:
        load_cifar100(tmp_path)
    assert str(p) in str(e.value)


def test_cifar100_bad_pickle_layout(tmp_path):
    from entangle_ext.data.cifar100 import load_cifar100
    d = tmp_path / "cifar-100-python"
    d.mkdir()
    (d / "train").write_bytes(b"\x80\x04garbage")
    with pytest.raises(ValueError, match="train is not a CIFAR-100 pickle"):
        load_cifar100(tmp_path)
    (d / "train").unlink()
    with pytest.raises(FileNotFoundError, match="train is missing"):
        load_cifar100(tmp_path)


def test_cifar_npz_as_tinyimagenet_names_the_keys(tmp_path):
    from entangle_ext.data.tinyimagenet import load_tinyimagenet
    p = _cifar_npz(tmp_path / "cifar100.npz")
    with pytest.raises(ValueError, match=r"is not a Tiny-ImageNet archive: missing keys \['wnids'"):
        load_tinyimagenet(p)


def test_cifar100_superclass_and_forget_checks(tmp_path):
    from entangle_ext.data.cifar100 import cifar100_splits, load_cifar100
    d = load_cifar100(_cifar_npz(tmp_path / "c.npz"))
    s, info = cifar100_splits(data=d, superclasses=["fish", "flowers"])
    assert info["num_classes"] == 2 and info["sizes"]["remote"] == 4
    with pytest.raises(ValueError, match=r"repeat \['fish'\]"):
        cifar100_splits(data=d, superclasses=("fish", "fish", "flowers"))
    with pytest.raises(ValueError, match="remote split would be empty"):
        cifar100_splits(data=d, superclasses=["fish"])
    with pytest.raises(TypeError, match="list of names"):
        cifar100_splits(data=d, superclasses="fish")
    with pytest.raises(ValueError, match=r"unknown superclass 'flower'; did you mean \['flowers'\]"):
        cifar100_splits(data=d, superclasses=["fish", "flower"])
    with pytest.raises(ValueError, match="is a superclass; forget takes one of its fine classes.*"):
        cifar100_splits(data=d, forget_fine="fish")
    with pytest.raises(ValueError, match=r"unknown fine class 'Aquarium_Fish'; did you mean \['aquarium_fish'\]"):
        cifar100_splits(data=d, forget_fine="Aquarium_Fish")


def test_tinyimagenet_superclass_checks(tiny_root):   # noqa: F811
    from entangle_ext.data.tinyimagenet import tinyimagenet_splits
    s, info = tinyimagenet_splits(tiny_root)      # defaults on a 4-class subset: the empty names are dropped
    assert info["coarse_names"] == ["mammal", "vertebrate"]
    assert info["forget_classes"] == ["Chihuahua", "Yorkshire terrier"] and info["adjacent_classes"] == ["tabby"]
    with pytest.raises(ValueError, match=r"repeat \['mammal'\]"):
        tinyimagenet_splits(tiny_root, superclasses=("mammal", "mammal", "vertebrate"))
    with pytest.raises(ValueError, match=r"\['other'\] would get no class"):
        tinyimagenet_splits(tiny_root, superclasses=("mammal", "vertebrate", "other"))
    with pytest.raises(ValueError, match="no loaded class has them"):    # a real node, but no class below it
        tinyimagenet_splits(tiny_root, superclasses=("dog", "feline", "fish"), classes=["n02085620", "n02094433",
                                                                                         "n02123045"])
    with pytest.raises(ValueError, match=r"\['mamal'\]: not WordNet nodes.*typo"):
        tinyimagenet_splits(tiny_root, superclasses=("mamal", "vertebrate"))
    with pytest.raises(TypeError, match="list of names"):
        tinyimagenet_splits(tiny_root, superclasses="mammal")


def test_tinyimagenet_corrupt_jpeg_names_the_file(tiny_root):   # noqa: F811
    from entangle_ext.data.tinyimagenet import load_tinyimagenet
    bad = next((tiny_root / "train").glob("*/images/*.JPEG"))
    bad.write_bytes(b"not a jpeg")
    with pytest.raises(ValueError, match="not a readable image") as e:
        load_tinyimagenet(tiny_root)
    assert str(bad) in str(e.value)


def _edit_line(path, lineno, fn):
    lines = path.read_text().splitlines()
    lines[lineno - 1] = fn(lines[lineno - 1])
    path.write_text("\n".join(lines) + "\n")


def test_celeba_bad_files_name_file_and_line(celeba_root):   # noqa: F811
    from entangle_ext.data.celeba import celeba_splits, read_celeba_attributes
    root = celeba_root[0]
    d = root / "celeba"
    attr, part = (d / "list_attr_celeba.txt").read_text(), (d / "list_eval_partition.txt").read_text()
    _edit_line(d / "list_attr_celeba.txt", 5, lambda l: l.replace(" 1", " 5", 1).replace("-1", " 5", 1))
    with pytest.raises(ValueError, match=r"list_attr_celeba.txt line 5: attribute values must be -1 or 1"):
        read_celeba_attributes(root)
    _edit_line(d / "list_attr_celeba.txt", 5, lambda l: l.replace(" 5", " x", 1))
    with pytest.raises(ValueError, match=r"list_attr_celeba.txt line 5: a field is not an integer"):
        read_celeba_attributes(root)
    (d / "list_attr_celeba.txt").write_text(attr)
    _edit_line(d / "list_eval_partition.txt", 6, lambda l: l.split()[0] + " x")
    with pytest.raises(ValueError, match=r"list_eval_partition.txt line 6: a field is not an integer"):
        read_celeba_attributes(root)
    (d / "list_eval_partition.txt").write_text(part.replace("000001.jpg 0", "000001.jpg 7"))
    with pytest.raises(ValueError, match=r"line 1: expected '<file> 0\|1\|2'"):
        read_celeba_attributes(root)
    (d / "list_eval_partition.txt").write_text(part)
    (d / "list_attr_celeba.txt").write_bytes(attr.encode().replace(b"000002.jpg", b"00000\xe9.jpg"))
    with pytest.raises(ValueError, match="list_attr_celeba.txt is not a UTF-8"):
        read_celeba_attributes(root)
    (d / "list_attr_celeba.txt").write_text(attr)
    (d / "img_align_celeba" / "000001.jpg").write_bytes(b"\xff\xd8 broken")
    with pytest.raises(ValueError, match="000001.jpg: not a readable image"):
        celeba_splits(root, image_size=8)


def test_celeba_repeated_names_and_files_are_refused(celeba_root):   # noqa: F811
    """A repeated attribute name or image file was resolved silently (the last one won); a file
    listed twice in the partition list under two partitions too."""
    from entangle_ext.data.celeba import read_celeba_attributes
    root = celeba_root[0]
    d = root / "celeba"
    attr, part = (d / "list_attr_celeba.txt").read_text(), (d / "list_eval_partition.txt").read_text()
    _edit_line(d / "list_attr_celeba.txt", 2, lambda l: l.replace("Male", "Smiling"))
    with pytest.raises(ValueError, match=r"list_attr_celeba.txt line 2 \(the attribute names\): 'Smiling' appears more"):
        read_celeba_attributes(root)
    (d / "list_attr_celeba.txt").write_text(attr)
    _edit_line(d / "list_attr_celeba.txt", 4, lambda l: l.replace("000002.jpg", "000001.jpg"))
    with pytest.raises(ValueError, match=r"list_attr_celeba.txt \(the image files\): '000001.jpg' appears more"):
        read_celeba_attributes(root)
    (d / "list_attr_celeba.txt").write_text(attr)
    first = part.splitlines()[0].split()
    (d / "list_eval_partition.txt").write_text(part + f"{first[0]} {(int(first[1]) + 1) % 3}\n")
    with pytest.raises(ValueError, match=rf"list_eval_partition.txt line \d+: {first[0]} is listed again, in partition"):
        read_celeba_attributes(root)
    (d / "list_eval_partition.txt").write_text(part + f"{first[0]} {first[1]}\n")   # the same partition again: fine
    read_celeba_attributes(root)


def test_celeba_heldout_cap_message(celeba_root):   # noqa: F811
    from entangle_ext.data.celeba import celeba_splits
    root = celeba_root[0]
    # each target class of the held-out partition holds 4 images; a cap of 1 keeps the forget image with
    # probability 1/4, so some seed among the first 20 must drop it
    for seed in range(20):
        try:
            celeba_splits(root, image_size=8, max_test_per_class=1, seed=seed)
        except ValueError as e:
            assert "held-out part (CelebA partition 2)" in str(e) and "max_test_per_class=1" in str(e)
            return
    pytest.fail("no seed dropped the held-out forget sample")


def _toxigen_csv(path, rows, header="text,target_group,toxicity_ai,toxicity_human"):
    path.write_text(header + "\n" + "".join(r + "\n" for r in rows), encoding="utf-8")
    return path


GOOD_ROWS = [f"t{i},{g},{a},{a}" for i, (g, a) in enumerate([("lgbtq", 4), ("lgbtq", 1), ("asian", 4), ("asian", 1)])]


@pytest.mark.parametrize("rows, header, msg", [
    (GOOD_ROWS[:3] + ["t3,asian,nan,1"], None, r"toxicity_ai is NaN or infinite in data row\(s\) \[5\]"),
    (GOOD_ROWS[:3] + ["t3,asian,x,1"], None, r"non-numeric toxicity_ai 'x' in data row 5"),
    (GOOD_ROWS[:3] + ['"t3,asian,1,1'], None, r"truncated or malformed row\(s\) \[5\]"),
    (GOOD_ROWS[:3] + ["t3,asian"], None, r"truncated or malformed row\(s\) \[5\]"),
    (["a,lgbtq,1", "b,lgbtq,2"], "text,target_group,toxic", r"'toxic' must be 0 or 1; row\(s\) \[3\] hold \[2.0\]"),
])
def test_toxigen_csv_checks(tmp_path, rows, header, msg):
    from entangle_ext.data.toxigen import load_toxigen
    p = _toxigen_csv(tmp_path / "toxigen_annotated.csv", rows, **({"header": header} if header else {}))
    with pytest.raises(ValueError, match=msg) as e:
        load_toxigen(tmp_path)
    assert str(p) in str(e.value)


def test_toxigen_latin1_and_caps(tmp_path):
    from entangle_ext.data.toxigen import load_toxigen, toxigen_index_splits
    p = _toxigen_csv(tmp_path / "toxigen_annotated.csv", GOOD_ROWS)
    d = load_toxigen(p)
    assert d["toxic"].tolist() == [1, 0, 1, 0]
    for bad in (0, -3, 1.5, True):
        with pytest.raises(ValueError, match="max_per_group_label must be an integer >= 1"):
            toxigen_index_splits(d, max_per_group_label=bad)
    p.write_bytes(p.read_bytes().replace(b"t0", "caf\u00e9".encode("latin-1")))
    with pytest.raises(ValueError, match="is not a UTF-8 text file") as e:
        load_toxigen(p)
    assert str(p) in str(e.value)


def test_toxigen_csv_with_utf8_bom_is_read(tmp_path):
    """Excel's "CSV UTF-8" starts with a byte-order mark: the header read '\\ufefftext' and the file
    was refused as missing the column text. The hypernym table shares the reader."""
    from entangle_ext.data.checks import read_csv_rows
    from entangle_ext.data.toxigen import load_toxigen
    p = _toxigen_csv(tmp_path / "toxigen_annotated.csv", GOOD_ROWS)
    p.write_bytes(b"\xef\xbb\xbf" + p.read_bytes())
    d = load_toxigen(p)
    assert d["text"] == ["t0", "t1", "t2", "t3"] and d["toxic"].tolist() == [1, 0, 1, 0]
    assert read_csv_rows(p)[1][0] == "text"


def test_toxigen_fraction_that_empties_a_part(tmp_path):
    """test_fraction=0.99 on a small file said 'unknown group 'lgbtq'; groups: []' although the file
    has the group; now the message names the empty train part and the fraction."""
    import torch
    from entangle_ext.data.toxigen import toxigen_splits
    p = _toxigen_csv(tmp_path / "x.csv", GOOD_ROWS)
    enc = lambda texts: torch.zeros(len(texts), 3)
    with pytest.raises(ValueError, match=r"ToxiGen train part is empty: test_fraction=0.99 holds out"):
        toxigen_splits(p, encode=enc, test_fraction=0.99)
    other = [f"o{i},asian,{a},{a}" for i, a in enumerate([4, 1] * 5)]         # lgbtq: 1 row per stratum
    p = _toxigen_csv(tmp_path / "y.csv", GOOD_ROWS[:2] + other)
    with pytest.raises(ValueError, match=r"train part \(4 rows, 0 of group 'lgbtq'\) has no forget sample .*"
                                         r"test_fraction=0.6"):
        toxigen_splits(p, encode=enc, test_fraction=0.6)


@pytest.mark.parametrize("encode, msg", [
    (lambda t: __import__("torch").zeros(len(t) + 1, 3), r"for 1 texts it returned shape \(2, 3\) \(expected \(1, D\)\)"),
    (lambda t: __import__("torch").zeros(len(t)), r"for 1 texts it returned shape \(1,\)"),
    (lambda t: "not features", r"encode must return an \(N, D\) float tensor or array; .* returned str"),
])
def test_toxigen_encode_with_wrong_rows(tmp_path, encode, msg):
    """Gave 'AssertionError: Size mismatch between tensors' (a 1-D result was accepted as x)."""
    from entangle_ext.data.toxigen import toxigen_splits
    with pytest.raises(ValueError, match=msg):
        toxigen_splits(_toxigen_csv(tmp_path / "x.csv", GOOD_ROWS), encode=encode)


@pytest.mark.parametrize("make", [
    lambda p: p.write_bytes(_npy_bytes(np.zeros((3, 4), np.float32))[:-8]),       # truncated
    lambda p: p.write_bytes(_npy_bytes(np.zeros((3, 4), np.float32))[:20]),       # header only
    lambda p: np.save(p, np.array([object(), 1, 2], dtype=object), allow_pickle=True),
    lambda p: np.save(p, np.zeros(3, np.float32)),                                 # 1-D
    lambda p: np.save(p, np.zeros((2, 4), np.float32)),                            # wrong row count
])
def test_embeddings_cache_errors_name_the_file(tmp_path, make):
    from entangle_ext.data.toxigen import sentence_embeddings
    p = tmp_path / "emb.npy"
    make(p)
    with pytest.raises(ValueError, match="delete it") as e:
        sentence_embeddings(["a", "b", "c"], cache=p)
    assert str(p) in str(e.value)


def test_embeddings_cache_write_is_atomic(tmp_path):
    from entangle_ext.data.hf_text import _write_cache, sentence_embeddings
    p = tmp_path / "sub" / "emb.npy"
    _write_cache(p, np.arange(6, dtype=np.float32).reshape(3, 2))
    assert sorted(x.name for x in p.parent.iterdir()) == ["emb.npy"]      # no temporary file left
    assert sentence_embeddings(["a", "b", "c"], cache=p).tolist() == [[0, 1], [2, 3], [4, 5]]


def _npy_bytes(arr):
    import io
    b = io.BytesIO()
    np.save(b, arr)
    return b.getvalue()


@pytest.mark.parametrize("bad, exc", [(3.7, TypeError), (True, TypeError), ("3", TypeError), (10, ValueError)])
def test_digits_forget_not_coerced(bad, exc):
    pytest.importorskip("sklearn")
    from entangle_ext.data.digits import digits_splits
    with pytest.raises(exc, match="forget_digit"):
        digits_splits(forget_digit=bad)


def test_digits_setting_forget_option():
    pytest.importorskip("sklearn")
    from entangle_ext.data.digits import load_setting as load_digits_setting
    for bad in (3.7, True):
        with pytest.raises(TypeError, match="forget_digit"):
            load_digits_setting(None, seed=0, device="cpu", forget=bad)
    with pytest.raises(ValueError, match="forget must be a digit"):
        load_digits_setting(None, seed=0, device="cpu", forget="3.7")
    assert load_digits_setting(None, seed=0, device="cpu", forget="5", max_train_per_class=2)[1]["groups"]["forget"] == [5]


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "64"])
def test_celeba_image_size_checked_up_front(celeba_root, bad):   # noqa: F811
    """0 blamed a good image ('not a readable image'), -3 gave numpy's 'negative dimensions are not
    allowed'; now one ValueError naming the option, as cifar100_splits (the same check)."""
    from entangle_ext.data.celeba import celeba_splits, load_celeba_images
    with pytest.raises(ValueError, match=rf"image_size must be an integer >= 1 \(pixels\), got {bad!r}"):
        celeba_splits(celeba_root[0], image_size=bad)
    with pytest.raises(ValueError, match="image_size must be an integer >= 1"):
        load_celeba_images(celeba_root[0] / "celeba", ["000001.jpg"], bad)


def test_list_files_with_a_byte_order_mark_are_read(tmp_path):
    """wnids.txt / CelebA lists saved with a BOM: the first entry read '\\ufeffn01443537' (no such
    class) where the CSV reader had already dropped it."""
    from entangle_ext.data.checks import read_text_lines
    p = tmp_path / "wnids.txt"
    p.write_bytes(b"\xef\xbb\xbfn01443537\nn02094433\n")
    assert read_text_lines(p) == ["n01443537", "n02094433"]
