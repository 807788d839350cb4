"""CelebA / ViT, the paper's attribute setting (docs/algorithm.md §1, §8).

4 target classes = (Male, Smiling); forget = female · not smiling · not young · no eyeglasses,
adjacent = the other three (Young, Eyeglasses) sub-classes of "female · not smiling", remote = the
other target classes. Data: torchvision's layout (``celeba/img_align_celeba/*.jpg``,
``list_attr_celeba.txt``, ``list_eval_partition.txt``). The registry entry "celeba"
(`entangle_ext.settings`) fine-tunes ViT-B/32 from ``--weights`` or trains a small ViT from scratch;
``--reduced`` is its CPU variant. No CelebA is available offline: ``--make-miniature DIR`` writes a
generated miniature (noise images, random attributes; its accuracies mean nothing) and runs on it.

    python python_examples/celeba_vit.py --data-root path/to/data --weights vit_b_32.pth --device cuda
    python python_examples/celeba_vit.py --make-miniature runs/celeba_mini --reduced --out runs/celeba_smoke
"""
import argparse


import entangle_ext as ee
from entangle_ext.data.celeba import write_celeba_miniature
from entangle_ext.cli import default_device, device_arg, exit_on_bad_input
from entangle_ext.settings import prepare
from entangle_ext.unlearn.files import make_out_dir


def main(argv=None):
    ap = argparse.ArgumentParser(prog="celeba_vit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--reduced", action="store_true", help="the CPU variant")
    ap.add_argument("--data-root", help="dir holding celeba/ (default: the data directories)")
    ap.add_argument("--make-miniature", metavar="DIR", help="write a generated miniature there and use it")
    ap.add_argument("--weights", help="local ViT-B/32 ImageNet state dict (.pth)")
    ap.add_argument("--device", type=device_arg, default=default_device())
    ap.add_argument("--out", default="runs/celeba_vit")
    args = ap.parse_args(argv)
    with exit_on_bad_input("celeba_vit"):   # bad input: one error line, exit code 2
        make_out_dir(args.out, "--out")   # before any data is written or read, or any training
        root = write_celeba_miniature(args.make_miniature, n=600) if args.make_miniature else args.data_root
        run = prepare("celeba", "reduced" if args.reduced else None, data_root=root, device=args.device,
                      cache_dir=args.out, model={"weights": args.weights})
        print(run.info["model"], "| sizes:", run.info["sizes"])
        # Stage 1 + Stage 2, then the three-split table (printed) and report.json under --out
        return ee.unlearn(run.model, run.splits, run.config(), device=args.device, out_dir=args.out)

if __name__ == "__main__":
    main()
