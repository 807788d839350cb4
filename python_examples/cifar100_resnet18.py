"""CIFAR-100 / ResNet-18, the paper's Table 1 setting (docs/algorithm.md §1, §8).

The model predicts the 20 superclasses; forget = fine class "aquarium_fish", adjacent = the other four
fish, remote = the other 19 superclasses. The registry entry "cifar100" (`entangle_ext.settings`)
holds the loader, the CIFAR ResNet-18, its training recipe (SGD 1e-3, momentum 0.9, wd 5e-4, cosine,
30 epochs, batch 256, flip + crop) and the "cifar100" preset. CPU variants: ``--variant cpu`` (the
CPU preset of the comparison: a 0.31 M-parameter ResNet at 16 px on all the data) and ``--variant
reduced`` (ResNet-18 on 3 superclasses, 60 / 20 images per fine class; a quick smoke run). Without
``--variant`` the script runs "full" on a CUDA device and "cpu" on a CPU (the full recipe takes about
15 h on a 2-core CPU; ``--variant full --device cpu`` runs it anyway). Bad input (missing or corrupt
data, a missing optional package) prints one error line and exits with code 2.

    python python_examples/cifar100_resnet18.py --device cuda           # full (GPU)
    python python_examples/cifar100_resnet18.py                          # on a CPU-only machine: the CPU preset
"""
import argparse

import torch

import entangle_ext as ee
from entangle_ext.cli import default_device, device_arg, exit_on_bad_input
from entangle_ext.settings import prepare
from entangle_ext.unlearn.files import make_out_dir


def main(argv=None):
    ap = argparse.ArgumentParser(prog="cifar100_resnet18", description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", choices=["full", "cpu", "reduced"], default=None,
                    help="default: full on a CUDA device, cpu (the CPU preset) otherwise")
    ap.add_argument("--data-root", help="cifar100.npz or a dir holding it / cifar-100-python/ "
                    "(default: $ENTANGLE_DATA, the user cache dir, ../shared/data)")
    ap.add_argument("--device", type=device_arg, default=default_device())
    ap.add_argument("--out", default="runs/cifar100_resnet18")
    args = ap.parse_args(argv)
    with exit_on_bad_input("cifar100_resnet18"):
        make_out_dir(args.out, "--out")   # before any data is written or read, or any training
        variant = args.variant
        if variant is None:   # the full recipe is a GPU run: never start it on a CPU by default
            variant = "full" if torch.device(args.device).type == "cuda" else "cpu"
            print(f"variant {variant} (device {args.device}; give --variant to choose)")
        # the data and the original model θ0 (trained once, cached under --out)
        run = prepare("cifar100", variant, data_root=args.data_root, device=args.device, cache_dir=args.out)
        print("sizes:", run.info["sizes"], "| adjacent:", run.info["groups"]["adjacent"])
        cfg = run.config(recipe="reference")   # the preset; e.g. run.config(stage2={"lr": 1e-2}) to change it
        # Stage 1 + Stage 2, then the three-split table (printed) and report.json under --out
        return ee.unlearn(run.model, run.splits, cfg, device=args.device, out_dir=args.out)


if __name__ == "__main__":
    main()
