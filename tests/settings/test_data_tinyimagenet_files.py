"""Wrong or inconsistent Tiny-ImageNet files (the packed npz and the tiny-imagenet-200 folders):
every reader raises ValueError naming the file and the key or line, never a raw IndexError /
KeyError / UnicodeDecodeError, and never silently drops images. All data is tiny and synthetic."""
import io

import numpy as np
import pytest


DOG = "dog > canine > carnivore > placental > mammal > vertebrate > animal > entity"
NPZ_CLASSES = [("n02085620", "Chihuahua", "Chihuahua > toy_dog > " + DOG),
               ("n02094433", "Yorkshire terrier", "Yorkshire_terrier > terrier > hunting_dog > " + DOG),
               ("n02099601", "golden retriever", "golden_retriever > retriever > sporting_dog > hunting_dog > " + DOG),
               ("n02123045", "tabby, tabby cat", "tabby > domestic_cat > cat > feline > carnivore > placental > "
                                                 "mammal > vertebrate > animal > entity")]


def _jpeg(rng, side=8):
    from PIL import Image
    b = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(b, format="JPEG")
    return np.frombuffer(b.getvalue(), np.uint8)


def _tiny_npz(path, sides=None, **replace):
    """A 4-class npz in the tinyimagenet_dogs_cats.npz format: 2 train + 1 val image per class
    (8x8 JPEGs, or ``sides[i]`` pixels for image i); ``replace`` overrides arrays."""
    pytest.importorskip("PIL")
    rng = np.random.default_rng(0)
    label, split = np.repeat(np.arange(4), 3), np.tile(np.array([0, 0, 1], np.int8), 4)
    imgs = [_jpeg(rng, 8 if sides is None else sides[i]) for i in range(len(label))]
    arrs = {"wnids": np.array([c[0] for c in NPZ_CLASSES]), "class_names": np.array([c[1] for c in NPZ_CLASSES]),
            "hypernym_path": np.array([c[2] for c in NPZ_CLASSES]), "label": label, "split": split,
            "offsets": np.r_[0, np.cumsum([len(i) for i in imgs])], "jpeg_bytes": np.concatenate(imgs)}
    arrs.update(replace)
    np.savez(path, **arrs)
    return path


def test_good_npz_keeps_every_image(tmp_path):
    from entangle_ext.data.tinyimagenet import load_tinyimagenet
    d = load_tinyimagenet(_tiny_npz(tmp_path / "t.npz"))
    assert d["x_train"].shape == (8, 64, 64, 3) and d["x_val"].shape == (4, 64, 64, 3)
    assert d["y_train"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3] and d["y_val"].tolist() == [0, 1, 2, 3]


def test_npz_images_of_another_size_are_resized(tmp_path):
    """One 64x64 image among 8x8 ones: every image comes back 64x64 like the folder layout's (np.stack
    of mixed sizes raised numpy's 'all input arrays must have the same shape')."""
    from entangle_ext.data.tinyimagenet import load_tinyimagenet
    d = load_tinyimagenet(_tiny_npz(tmp_path / "t.npz", sides=[64] + [8] * 11))
    assert d["x_train"].shape == (8, 64, 64, 3)


@pytest.mark.parametrize("replace, msg", [
    ({"wnids": np.array([c[0] for c in NPZ_CLASSES][:2])}, r"'wnids' differs in length .*'wnids' has 2, 'class_names' has 4"),
    ({"class_names": np.array(["Chihuahua", "x"])}, r"'class_names' differs in length .*'class_names' has 2"),
    ({"hypernym_path": np.array([NPZ_CLASSES[0][2]])}, r"'hypernym_path' differs in length .*'hypernym_path' has 1"),
    ({"offsets": np.arange(6)}, r"'offsets' has 6 entries but needs 13 \(one more than the 12 images"),
    ({"offsets": np.arange(13) * 10**6}, r"'offsets' end at 12000000, beyond the \d+ bytes of 'jpeg_bytes'"),
    ({"offsets": np.r_[5, 0, np.arange(11) + 9]}, r"'offsets' must be non-decreasing"),
    ({"label": np.r_[np.repeat(np.arange(4), 3)[:-1], 11]}, r"'label' has values outside 0..3 \(found 11;"),
    ({"label": np.r_[-1, np.repeat(np.arange(4), 3)[1:]]}, r"'label' has values outside 0..3 \(found -1;"),
    ({"label": np.repeat(np.arange(4.0), 3)}, r"'label' must hold integers, got dtype float64"),
    ({"split": np.tile(np.array([0, 0, 2]), 4)}, r"'split' has values other than 0 \(train\) and 1 \(val\) \(found 2\)"),
    ({"split": np.zeros(11, np.int8)}, r"'split' has 11 entries but 'label' has 12"),
    ({"wnids": np.array(["n02085620"] * 4)}, r"'wnids' repeats \['n02085620'\]"),
    ({"wnids": np.arange(4)}, r"'wnids' must hold strings"),
    ({"label": np.repeat(np.arange(4), 3).reshape(3, 4)}, r"'label' must be 1-D, got shape \(3, 4\)"),
])
def test_inconsistent_npz_names_file_and_key(tmp_path, replace, msg):
    """Shortened per-class arrays gave IndexError / KeyError, short offsets IndexError; labels
    outside 0..W-1 and splits other than 0/1 silently dropped their images."""
    from entangle_ext.data.tinyimagenet import load_tinyimagenet
    p = _tiny_npz(tmp_path / "t.npz", **replace)
    with pytest.raises(ValueError, match=msg) as e:
        load_tinyimagenet(p)
    assert str(p) in str(e.value)


def test_repeated_or_string_classes_refused(tmp_path):
    from entangle_ext.data.tinyimagenet import load_tinyimagenet
    p = _tiny_npz(tmp_path / "t.npz")
    with pytest.raises(ValueError, match=r"classes repeat \['n02085620'\]"):
        load_tinyimagenet(p, classes=["n02085620", "n02094433", "n02085620"])
    with pytest.raises(TypeError, match="list of wnids"):
        load_tinyimagenet(p, classes="n02085620")


def _load_folder_error(root, exc=ValueError, match=None):
    from entangle_ext.data.tinyimagenet import load_tinyimagenet
    with pytest.raises(exc, match=match) as e:
        load_tinyimagenet(root)
    return str(e.value)


def test_val_annotations_line_without_tabs(tiny_root):   # noqa: F811
    """Gave 'not enough values to unpack (expected 2, got 1)'."""
    ann = tiny_root / "val" / "val_annotations.txt"
    lines = ann.read_text().splitlines()
    ann.write_text("\n".join(lines[:2] + [lines[2].replace("\t", " ")] + lines[3:]) + "\n")
    msg = _load_folder_error(tiny_root, match=r"val_annotations.txt line 3: expected '<file><TAB><wnid>")
    assert str(ann) in msg


def test_val_annotations_unknown_wnid(tiny_root):   # noqa: F811
    """An annotation naming a class absent from wnids.txt: its image silently vanished."""
    ann = tiny_root / "val" / "val_annotations.txt"
    ann.write_text(ann.read_text().replace("n01443537", "n09999999", 1))
    msg = _load_folder_error(tiny_root, match=r"val_annotations.txt line 7: wnid 'n09999999' is not in wnids.txt")
    assert str(ann) in msg


@pytest.mark.parametrize("name", ["words.txt", "wnids.txt", "val/val_annotations.txt"])
def test_non_utf8_list_file(tiny_root, name):   # noqa: F811
    """Gave a raw UnicodeDecodeError."""
    p = tiny_root / name
    p.write_bytes(p.read_bytes().replace(b"\n", "\n\u00e9 ".encode("latin-1"), 1))
    msg = _load_folder_error(tiny_root, match="is not a UTF-8 text file")
    assert str(p) in msg


def test_words_line_without_tab_and_repeated_wnids(tiny_root):   # noqa: F811
    words, wnids = tiny_root / "words.txt", tiny_root / "wnids.txt"
    good = words.read_text()
    words.write_text(good.replace("n02094433\t", "n02094433 "))     # the line used to be skipped silently
    assert str(words) in _load_folder_error(tiny_root, match=r"words.txt line 2: expected '<wnid><TAB><words>'")
    words.write_text(good)
    wnids.write_text(wnids.read_text() + "n02085620\n")             # its images were loaded twice
    assert str(wnids) in _load_folder_error(tiny_root, match=r"wnids.txt: repeats \['n02085620'\]")


def test_wordnet_csv_problems_name_the_file(tiny_root):   # noqa: F811
    table = tiny_root.parent / "tinyimagenet_wordnet.csv"
    good = table.read_text()
    table.write_text(good.rstrip("\n").rsplit("\n", 1)[0] + "\nn01443537,goldfish\n")   # truncated row
    assert str(table) in _load_folder_error(tiny_root, match=r"truncated or malformed row\(s\) \[5\]")
    table.write_bytes(good.replace("Chihuahua,", "Chihuahua\u00e9,", 1).encode("latin-1"))
    assert str(table) in _load_folder_error(tiny_root, match="is not a UTF-8 text file")
    table.write_text(good + good.splitlines()[1] + "\n")
    assert str(table) in _load_folder_error(tiny_root, match=r"wnid\(s\) \['n02085620'\] have several rows")


def test_forget_class_path_without_its_superclass(tmp_path):
    """Hypernym paths without "dog": said 'forget fine class 0 is unknown or excluded
    (fine_to_coarse has 4 entries)'; now names the file, the class, the missing superclass and the path."""
    from entangle_ext.data.tinyimagenet import tinyimagenet_splits
    paths = np.array([c[2].replace("> dog >", "> canid >") for c in NPZ_CLASSES])
    p = _tiny_npz(tmp_path / "t.npz", hypernym_path=paths)
    with pytest.raises(ValueError, match=r"forget class\(es\) \['Chihuahua'\] contains none of the superclasses "
                                         r"\['feline'\]; .* default superclass\(es\) \['dog'\].*toy_dog > canid") as e:
        tinyimagenet_splits(p)
    assert str(p) in str(e.value)
    with pytest.raises(ValueError, match=r"\['Chihuahua'\] contains none of the superclasses \['feline'\] "
                                         r"\(path of 'Chihuahua'"):
        tinyimagenet_splits(p, superclasses=["feline"], forget="Chihuahua")
    s, info = tinyimagenet_splits(_tiny_npz(tmp_path / "ok.npz"))      # the intact paths still work
    assert info["forget_classes"] == ["Chihuahua"] and info["coarse_names"] == ["dog", "feline"]


@pytest.mark.parametrize("ext", [".jpg", ".jpeg", ".JPG", ".Jpeg"])
def test_train_images_of_any_jpeg_ending_are_read(tiny_root, ext):   # noqa: F811
    """A class folder of .jpg / .jpeg files (any case) was silently dropped: the class kept its
    name but had 0 train images."""
    from entangle_ext.data.tinyimagenet import load_tinyimagenet
    d = tiny_root / "train" / "n02094433" / "images"
    for p in d.iterdir():
        p.rename(p.with_suffix(ext))
    out = load_tinyimagenet(tiny_root)
    assert np.bincount(out["y_train"], minlength=4).tolist() == [3, 3, 3, 3]


def test_class_without_train_or_val_images_names_it(tiny_root):   # noqa: F811
    """A class folder without any JPEG gave 0 images silently; a class without val annotation is no
    error (an empty val_annotations.txt is a layout without held-out part)."""
    d = tiny_root / "train" / "n02094433" / "images"
    for p in d.iterdir():
        p.rename(p.with_suffix(".png"))
    msg = _load_folder_error(tiny_root, match=r"class folder .* has no train image")
    assert str(d) in msg
    for p in d.iterdir():
        p.rename(p.with_suffix(".JPEG"))
    ann = tiny_root / "val" / "val_annotations.txt"
    ann.write_text("".join(l + "\n" for l in ann.read_text().splitlines() if "\tn01443537\t" not in l))
    from entangle_ext.data.tinyimagenet import load_tinyimagenet, tinyimagenet_splits
    assert load_tinyimagenet(tiny_root)["y_val"].tolist() == [0, 0, 1, 1, 2, 2]   # goldfish (3): none held out
    ann.write_text("")   # no held-out part at all: tinyimagenet_splits skips it (e22e266 refused the first class)
    splits, _ = tinyimagenet_splits(tiny_root)
    assert sorted(splits.named()) == ["adjacent", "forget", "remote"]


def test_a_missing_wordnet_csv_says_where_to_put_it_for_the_command_line(tiny_root, monkeypatch):   # noqa: F811
    """The message ended "; pass wordnet_csv=", a Python keyword the command line has no flag for."""
    from entangle_ext.data import tinyimagenet_sources
    from entangle_ext.data.tinyimagenet import load_tinyimagenet
    monkeypatch.setattr(tinyimagenet_sources, "data_dirs", lambda: [])   # no shared table found elsewhere
    (tiny_root.parent / "tinyimagenet_wordnet.csv").unlink()
    with pytest.raises(FileNotFoundError) as e:
        load_tinyimagenet(tiny_root)
    assert str(e.value) == (f"no tinyimagenet_wordnet.csv (WordNet hypernym paths) in {tiny_root}, {tiny_root.parent}: "
                            f"put the file in {tiny_root.parent} (beside tiny-imagenet-200/) or in $ENTANGLE_DATA (no "
                            "command-line flag takes its path), or from Python pass wordnet_csv=PATH")


def test_a_forget_class_without_val_images_is_named_with_the_held_out_part(tmp_path):
    """It said "empty forget set: no sample has fine label in [0]"."""
    from entangle_ext.data.tinyimagenet import tinyimagenet_splits
    split = np.tile(np.array([0, 0, 1], np.int8), 4)
    split[2] = 0                                   # Chihuahua's one val image becomes a train image
    p = _tiny_npz(tmp_path / "t.npz", split=split)
    with pytest.raises(ValueError) as e:
        tinyimagenet_splits(p)
    assert str(e.value) == ("empty forget set: the forget class(es) ['Chihuahua'] have no image in the held-out (val) "
                            "part of t.npz; choose another forget class (--forget) or add val images of it")
