"""How well `entangle_ext.splits.split_by_similarity` finds the entangled siblings when no hierarchy is
given: CIFAR-100, forget = "aquarium_fish", true siblings = the other 4 fish classes.

A model is trained on the 20 superclasses (the "original model"), its penultimate features are taken
with `extract_features`, every forget image votes for its k nearest retain images, and the top
``fraction`` (= the true sibling share, so precision = recall) becomes D_adj. Compared with a
no-training baseline (raw pixels → PCA-256 → LDA on the coarse labels).

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

from entangle_ext.data.cifar100 import CIFAR100_MEAN, CIFAR100_STD, load_cifar100, resnet18_cifar
from entangle_ext.data.tinyimagenet import images_to_tensor
from entangle_ext.data.vit import vit_classifier
from entangle_ext.splits import extract_features, split_by_similarity
from entangle_ext.train import TrainRecipe, train_original


def recovery(feats_r, feats_f, retain, forget, true_adj, k, metric):
    frac = len(true_adj) / len(retain)
    s = split_by_similarity(feats_r, feats_f, k=k, fraction=frac, metric=metric, retain_indices=retain,
                            forget_indices=forget)
    hit = len(true_adj & set(s.adjacent))
    return hit / len(s.adjacent), hit / len(true_adj), frac


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--per-class", type=int, default=100, help="train images per fine class")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--model", choices=["small", "resnet18"], default="small")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        d = load_cifar100(args.data_root)
    except FileNotFoundError as e:
        raise SystemExit(f"similarity_split_cifar100: {e}")
    fine, coarse = d["y_train_fine"], d["y_train_coarse"]
    rng = np.random.default_rng(args.seed)
    sel = np.concatenate([rng.choice(np.flatnonzero(fine == k), args.per_class, replace=False) for k in range(100)])
    aq, fish = d["fine_names"].index("aquarium_fish"), d["coarse_names"].index("fish")
    forget, retain = sel[fine[sel] == aq], sel[fine[sel] != aq]
    true_adj = set(retain[coarse[retain] == fish].tolist())
    pos = {int(i): j for j, i in enumerate(sel)}
    fi, ri = [pos[int(i)] for i in forget], [pos[int(i)] for i in retain]

    # baseline without training: PCA + LDA on raw pixels
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    X = torch.tensor(d["x_train"][sel].reshape(len(sel), -1), dtype=torch.float32) / 255
    torch.manual_seed(args.seed)
    mu = X.mean(0)
    _, _, V = torch.pca_lowrank(X - mu, q=256, center=False)
    P = ((X - mu) @ V).numpy()
    Z = LinearDiscriminantAnalysis().fit(P, coarse[sel]).transform(P)
    for k in (10, 50):
        p, r, c = recovery(Z[ri], Z[fi], retain, forget, true_adj, k, "euclidean")
        print(f"pixels PCA+LDA  k={k:<3} precision {p:.3f} recall {r:.3f} (chance {c:.3f})")

    # trained model: penultimate features
    t0 = time.perf_counter()
    x = images_to_tensor(d["x_train"][sel], args.device, mean=CIFAR100_MEAN, std=CIFAR100_STD)
    y = torch.as_tensor(coarse[sel], device=args.device)
    torch.manual_seed(args.seed)
    model = vit_classifier(20, arch="small", image_size=32) if args.model == "small" else resnet18_cifar(20)
    recipe = TrainRecipe("adamw", lr=1e-3, epochs=args.epochs, batch_size=128, weight_decay=0.05, augment=True)
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
