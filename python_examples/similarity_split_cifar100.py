"""How well `entangle_ext.splits.split_by_similarity` finds the entangled siblings when no hierarchy is
given: CIFAR-100, forget = "aquarium_fish", true siblings = the other 4 fish classes.

A model is trained on the 20 superclasses (the "original model"), its penultimate features are taken
with `extract_features`, every forget image votes for its k nearest retain images, and the top
``fraction`` (= the true sibling share, so precision = recall) becomes D_adj. Compared with two
baselines that train no network and never see the coarse labels of the sample they rank: raw pixels →
PCA-256 (no labels at all), and raw pixels → PCA-256 → LDA fitted on the coarse labels of the 10,000
CIFAR-100 *test* images (disjoint from the sample; a linear model of the superclasses).
``--per-class`` is 1 to 500 (the train images per fine class in CIFAR-100). Bad input (a flag out of
range, e.g. ``--threads 0`` or ``--epochs -1``, missing or corrupt data) prints one
``similarity_split_cifar100: error: ...`` line and exits with code 2, before any training.

    python python_examples/similarity_split_cifar100.py --per-class 100 --epochs 8          # CPU, minutes
    python python_examples/similarity_split_cifar100.py --per-class 500 --epochs 30 --model resnet18 --device cuda

``--model small``: a small torchvision ViT from scratch (patch 8, 4 layers, width 128); ``resnet18``:
the CIFAR ResNet-18 of the cifar100 setting.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from entangle_ext.cli import default_device, device_arg, exit_on_bad_input
from entangle_ext.data.seeds import numpy_seed
from entangle_ext.data.cifar100 import CIFAR100_MEAN, CIFAR100_STD, load_cifar100, resnet18_cifar
from entangle_ext.data.tinyimagenet import images_to_tensor
from entangle_ext.data.vit import vit_classifier
from entangle_ext.splits import extract_features, split_by_similarity
from entangle_ext.threads import check_thread_count, torch_threads
from entangle_ext.train import TrainRecipe, train_original


def recovery(feats_r, feats_f, retain, forget, true_adj, k, metric):
    frac = len(true_adj) / len(retain)
    s = split_by_similarity(feats_r, feats_f, k=k, fraction=frac, metric=metric, retain_indices=retain,
                            forget_indices=forget)
    hit = len(true_adj & set(s.adjacent))
    return hit / len(s.adjacent), hit / len(true_adj), frac


def pixel_baselines(d, sel, seed=0):
    """Raw-pixel features of the train images ``sel`` (float32 numpy, (len(sel), 256) each): PCA-256
    of the sample (no labels), and that PCA followed by LDA fitted on the test split's coarse labels
    (never on the sample's, whose coarse labels define the true siblings)."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    X = torch.tensor(d["x_train"][sel].reshape(len(sel), -1), dtype=torch.float32) / 255
    Xt = torch.tensor(d["x_test"].reshape(len(d["x_test"]), -1), dtype=torch.float32) / 255
    torch.manual_seed(seed)
    mu = Xt.mean(0)
    _, _, V = torch.pca_lowrank(Xt - mu, q=256, center=False)   # PCA basis from the test split too
    P, Pt = ((X - mu) @ V).numpy(), ((Xt - mu) @ V).numpy()
    lda = LinearDiscriminantAnalysis().fit(Pt, d["y_test_coarse"])
    return {"pixels PCA     ": P, "pixels PCA+LDA ": lda.transform(P)}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="similarity_split_cifar100", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--per-class", type=int, default=100, help="train images per fine class")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--model", choices=["small", "resnet18"], default="small")
    ap.add_argument("--device", type=device_arg, default=default_device())
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    with exit_on_bad_input("similarity_split_cifar100"):   # bad input: one error line, exit code 2
        # every flag is checked before the data are read or a network is trained
        if args.threads is not None:
            check_thread_count(args.threads, "--threads")
        recipe = TrainRecipe("adamw", lr=1e-3, epochs=args.epochs, batch_size=128, weight_decay=0.05, augment=True)
        rng = np.random.default_rng(numpy_seed(args.seed, '--seed'))
        with torch_threads(args.threads if args.threads is not None else torch.get_num_threads()):
            run(args, recipe, rng)


def run(args, recipe, rng):
    """The comparison of `main` (flags already checked): pixel baselines, then the trained model's features."""
    d = load_cifar100(args.data_root)
    fine, coarse = d["y_train_fine"], d["y_train_coarse"]
    if len(d["fine_names"]) != 100 or "aquarium_fish" not in d["fine_names"] or len(d["x_test"]) < 256:
        raise ValueError(f"this example needs the whole CIFAR-100 (100 fine classes with aquarium_fish, and "
                         f"at least 256 test images for the PCA-256 baseline); the data found has "
                         f"{len(d['fine_names'])} fine classes and {len(d['x_test'])} test images")
    most = int(np.bincount(fine, minlength=100).min())
    if not 1 <= args.per_class <= most:
        raise ValueError(f"--per-class must be 1..{most} (train images per fine class), got {args.per_class}")
    sel = np.concatenate([rng.choice(np.flatnonzero(fine == k), args.per_class, replace=False) for k in range(100)])
    aq, fish = d["fine_names"].index("aquarium_fish"), d["coarse_names"].index("fish")
    forget, retain = sel[fine[sel] == aq], sel[fine[sel] != aq]
    true_adj = set(retain[coarse[retain] == fish].tolist())
    pos = {int(i): j for j, i in enumerate(sel)}
    fi, ri = [pos[int(i)] for i in forget], [pos[int(i)] for i in retain]

    # baselines without training a network, blind to the sample's coarse labels
    for name, Z in pixel_baselines(d, sel, args.seed).items():
        for k in (10, 50):
            p, r, c = recovery(Z[ri], Z[fi], retain, forget, true_adj, k, "euclidean")
            print(f"{name} k={k:<3} precision {p:.3f} recall {r:.3f} (chance {c:.3f})")

    # trained model: penultimate features
    t0 = time.perf_counter()
    x = images_to_tensor(d["x_train"][sel], args.device, mean=CIFAR100_MEAN, std=CIFAR100_STD)
    y = torch.as_tensor(coarse[sel], device=args.device)
    torch.manual_seed(args.seed)
    model = vit_classifier(20, arch="small", image_size=32) if args.model == "small" else resnet18_cifar(20)
    train_original(model, [torch.utils.data.TensorDataset(x, y)], recipe, device=args.device, seed=args.seed,
                   progress=False)
    xt = images_to_tensor(d["x_test"], args.device, mean=CIFAR100_MEAN, std=CIFAR100_STD)
    with torch.no_grad():
        acc = torch.cat([model(xt[i:i + 512]).argmax(1).cpu() for i in range(0, len(xt), 512)])
    acc = (acc.numpy() == d["y_test_coarse"]).mean()
    print(f"{args.model} trained {args.epochs} epochs on {len(sel)} images in {time.perf_counter() - t0:.0f}s; "
          f"superclass test accuracy {100 * acc:.1f}%")
    F = extract_features(model, x, batch_size=512).numpy()
    for k in (10, 50):
        p, r, c = recovery(F[ri], F[fi], retain, forget, true_adj, k, "cosine")
        print(f"{args.model} penultimate k={k:<3} precision {p:.3f} recall {r:.3f} (chance {c:.3f})")

if __name__ == "__main__":
    main()
