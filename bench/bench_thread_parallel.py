"""Where the second core goes: the Stage-2 remote gradient of the ``cifar100`` / ``cpu`` model
(``--chunks`` passes of ``--batch`` random 16-px images, forward + backward under bf16 autocast,
channels-last inputs, eval mode, ``torch.autograd.grad``) run three ways, in one process:

* ``seq1``: one pass after the other on one intra-op thread;
* ``seq2``: one pass after the other on two intra-op threads (what a run does today);
* ``par2x1``: the passes split between two Python threads with one intra-op thread each, their
  gradients summed at the end (not what any run does: a measurement for a possible change).

Prints seconds per round for each and the median ratios seq2 / par2x1 and seq1 / seq2; the
gradients of ``par2x1`` are checked against ``seq2``'s (same sum, another order).

    OMP_WAIT_POLICY=PASSIVE python bench/bench_thread_parallel.py --rounds 6
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch
import torch.nn.functional as F

from entangle_ext.data.cifar100 import small_resnet_cifar


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args(argv)
    if min(args.batch, args.chunks, args.rounds) < 1 or args.chunks < 2:
        raise SystemExit("--batch and --rounds must be >= 1, --chunks >= 2")
    torch.manual_seed(0)
    model = small_resnet_cifar(20).eval()
    params = list(model.parameters())
    xs = [torch.randn(args.batch, 3, 16, 16).contiguous(memory_format=torch.channels_last)
          for _ in range(args.chunks)]
    ys = [torch.randint(0, 20, (args.batch,)) for _ in range(args.chunks)]

    def grad_of(i):
        with torch.autocast("cpu", dtype=torch.bfloat16):   # thread-local: entered in each thread
            logits = model(xs[i])
        return torch.autograd.grad(F.cross_entropy(logits.float(), ys[i]), params)

    def total(grads):
        return [torch.stack(g).sum(0) for g in zip(*grads)]

    def seq(threads):
        torch.set_num_threads(threads)
        t = time.perf_counter()
        g = total([grad_of(i) for i in range(args.chunks)])
        return time.perf_counter() - t, g

    def par():
        torch.set_num_threads(1)
        parts = [None, None]

        def work(k):
            torch.set_num_threads(1)
            parts[k] = [grad_of(i) for i in range(k, args.chunks, 2)]
        t = time.perf_counter()
        workers = [threading.Thread(target=work, args=(k,)) for k in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        g = total(parts[0] + parts[1])
        return time.perf_counter() - t, g

    previous = torch.get_num_threads()
    print(f"# {args.chunks} passes of {args.batch} images, bf16 autocast, channels-last, torch {torch.__version__}")
    times = {"seq1": [], "seq2": [], "par2x1": []}
    try:
        grad_of(0)   # warm-up
        for r in range(args.rounds):
            t1, _ = seq(1)
            t2, g2 = seq(2)
            tp, gp = par()
            for k, v in (("seq1", t1), ("seq2", t2), ("par2x1", tp)):
                times[k].append(v)
            err = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)) for a, b in zip(gp, g2))
            print(f"round {r}: seq1 {t1:.2f} s  seq2 {t2:.2f} s  par2x1 {tp:.2f} s  (par2x1 vs seq2 gradients: "
                  f"max rel. difference {err:.1e})", flush=True)
            if err > 5e-2:
                raise SystemExit(f"par2x1's gradients differ from seq2's by {err:.1e}")
    finally:
        torch.set_num_threads(previous)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"median: seq1 {med['seq1']:.2f} s, seq2 {med['seq2']:.2f} s, par2x1 {med['par2x1']:.2f} s; "
          f"seq1/seq2 {med['seq1'] / med['seq2']:.2f}x, seq2/par2x1 {med['seq2'] / med['par2x1']:.2f}x")


if __name__ == "__main__":
    main()
