"""Fixtures of the settings tests: on-disk miniatures of the Tiny-ImageNet (tiny-imagenet-200
layout + hypernym CSV) and CelebA (torchvision's celeba/ layout) data sets, written in their exact
formats with generated images (shared by test_splits.py and test_data_files.py)."""
import csv

import numpy as np
import pytest


WORDNET_ROWS = [
    ("n02085620", "Chihuahua", "Chihuahua > toy_dog > dog > canine > carnivore > placental > mammal > vertebrate > animal > entity"),
    ("n02094433", "Yorkshire terrier", "Yorkshire_terrier > terrier > hunting_dog > dog > canine > carnivore > placental > mammal > vertebrate > animal > entity"),
    ("n02123045", "tabby, tabby cat", "tabby > domestic_cat > cat > feline > carnivore > placental > mammal > vertebrate > animal > entity"),
    ("n01443537", "goldfish, Carassius auratus", "goldfish > cyprinid > fish > aquatic_vertebrate > vertebrate > animal > entity"),
]


def _jpeg(path, rng, size=(64, 64)):
    from PIL import Image
    arr = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(arr).save(path, format="JPEG", quality=70)


@pytest.fixture
def tiny_root(tmp_path):
    """A 4-class tiny-imagenet-200 miniature (3 train / 2 val JPEGs per class) + hypernym CSV."""
    pytest.importorskip("PIL")   # the miniature's JPEGs are written and read with Pillow
    rng = np.random.default_rng(0)
    root = tmp_path / "tiny-imagenet-200"
    (root / "val" / "images").mkdir(parents=True)
    wnids = [r[0] for r in WORDNET_ROWS]
    (root / "wnids.txt").write_text("\n".join(wnids) + "\n")
    (root / "words.txt").write_text("".join(f"{w}\t{n}\n" for w, n, _ in WORDNET_ROWS) + "n00000001\tunused\n")
    ann = []
    for w in wnids:
        d = root / "train" / w / "images"
        d.mkdir(parents=True)
        for i in range(3):
            _jpeg(d / f"{w}_{i}.JPEG", rng)
        (root / "train" / w / f"{w}_boxes.txt").write_text("")
        for i in range(2):
            name = f"val_{len(ann)}.JPEG"
            _jpeg(root / "val" / "images" / name, rng)
            ann.append(f"{name}\t{w}\t0\t0\t63\t63")
    (root / "val" / "val_annotations.txt").write_text("\n".join(ann) + "\n")
    with open(tmp_path / "tinyimagenet_wordnet.csv", "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["wnid", "words", "hypernym_path", "hypernym_wnids"])
        for w, n, p in WORDNET_ROWS:
            wr.writerow([w, n, p, ""])
    return root


CELEBA_ATTRS = ("5_o_Clock_Shadow Arched_Eyebrows Attractive Bags_Under_Eyes Bald Bangs Big_Lips Big_Nose "
                "Black_Hair Blond_Hair Blurry Brown_Hair Bushy_Eyebrows Chubby Double_Chin Eyeglasses Goatee "
                "Gray_Hair Heavy_Makeup High_Cheekbones Male Mouth_Slightly_Open Mustache Narrow_Eyes No_Beard "
                "Oval_Face Pale_Skin Pointy_Nose Receding_Hairline Rosy_Cheeks Sideburns Smiling Straight_Hair "
                "Wavy_Hair Wearing_Earrings Wearing_Hat Wearing_Lipstick Wearing_Necklace Wearing_Necktie "
                "Young").split()


@pytest.fixture
def celeba_root(tmp_path):
    """torchvision celeba/ layout with 48 generated 22×27 JPEGs (real aspect 178:218 scaled down, written
    by `write_celeba_miniature`); every (Male, Smiling, Young, Eyeglasses) combination appears once in
    each partition (checked here, read back from the files)."""
    pytest.importorskip("PIL")   # the miniature's JPEGs are written and read with Pillow
    from entangle_ext.data.celeba import write_celeba_miniature
    write_celeba_miniature(tmp_path, 48, size=(22, 27))
    d = tmp_path / "celeba"
    rows = [l.split() for l in (d / "list_attr_celeba.txt").read_text().splitlines()[2:]]
    vals = np.array([[int(v) for v in r[1:]] for r in rows])
    part = np.array([int(l.split()[1]) for l in (d / "list_eval_partition.txt").read_text().splitlines()])
    cols = [CELEBA_ATTRS.index(a) for a in ("Male", "Smiling", "Young", "Eyeglasses")]
    for p in range(3):
        assert (part == p).sum() == 16 and len({tuple(r) for r in vals[part == p][:, cols]}) == 16
    return tmp_path, vals, part


@pytest.fixture
def celeba_attrs():
    """The 40 CelebA attribute names in the order of ``list_attr_celeba.txt`` (written here by
    hand, independently of the package's own list)."""
    return CELEBA_ATTRS
