"""Where one Stage-1 step and one Stage-2 step of the cifar100/cpu preset spend their time
(torch.profiler, CPU): the small ResNet (0.31 M parameters) at 16×16 px with the preset's batch
sizes (Stage 1: remote 128 + forget 16; Stage 2: adjacent 128, forget 128×4 (the 500-image
forget set), remote 512×10), on random inputs, float32 and bf16 autocast.

Each stage is run once untimed (warm-up: oneDNN plans, allocator), then profiled over ``--steps``
steps; the table groups the self CPU time of the operators into: convolution forward /
backward, batch norm, other model ops, our kernels (entangle_ext::*), optimizer and the rest,
as a share of the profiled wall time.

    python bench/profile_step.py --threads 2
"""
from __future__ import annotations

import argparse
import collections
import copy
import dataclasses
import time

import torch
from torch.utils.data import TensorDataset

import entangle_ext as ee
from entangle_ext.data.cifar100 import small_resnet_cifar
from entangle_ext.settings import get_setting

GROUPS = (("conv bwd", ("convolution_backward",)),   # before "conv fwd": aten::convolution is a prefix
          ("conv fwd", ("mkldnn_convolution", "aten::convolution", "aten::_convolution", "aten::conv2d")),
          ("batch norm", ("batch_norm",)),
          ("ours (entangle_ext::*)", ("entangle_ext::",)),
          ("optimizer", ("adam", "sgd", "_foreach", "lerp", "addcdiv", "addcmul")),
          ("data (index/cat/copy)", ("index_select", "aten::index", "aten::cat", "aten::copy_", "aten::to", "_to_copy")))


def group_of(name: str) -> str:
    low = name.lower()
    for g, keys in GROUPS:
        if any(k.lower() in low for k in keys):
            return g
    return "other"


def profile(fn, steps: int) -> dict:
    fn(1)   # warm-up
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        fn(steps)
        wall = time.perf_counter() - t
    share = collections.Counter()
    for e in prof.key_averages():
        share[group_of(e.key)] += e.self_cpu_time_total / 1e6
    return {"wall_s": wall / steps, **{g: s / steps for g, s in share.items()}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--steps", type=int, default=3, help="steps profiled per stage")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)

    def ds(n):
        return TensorDataset(torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 20, (n,), generator=g))
    cfg = get_setting("cifar100").config("cpu", amp=None)
    s1, s2 = cfg.stage1, cfg.stage2
    forget, remote = ds(500), ds(s2.remote_batch_size * s2.remote_batch_limit)
    torch.manual_seed(0)
    base = small_resnet_cifar(20).eval()
    rows = {}
    for amp in (None, "bf16"):
        def stage1(k):
            sp = ee.Splits(forget=forget, remote=ds(s1.remote_batch_size * k), adjacent=ds(8))
            ee.stage1(copy.deepcopy(base), sp, dataclasses.replace(s1, max_steps=k), c0=3.0, progress=False,
                      log_every=10 ** 9, amp=amp)

        def stage2(k):
            sp = ee.Splits(forget=forget, remote=remote, adjacent=ds(s2.adjacent_batch_size * k))
            ee.stage2(copy.deepcopy(base), sp, dataclasses.replace(s2, epochs=1), progress=False, log_every=10 ** 9,
                      amp=amp)
        for name, fn in (("stage 1", stage1), ("stage 2", stage2)):
            rows[(name, amp or "float32")] = profile(fn, args.steps)
    cols = ["wall_s"] + [g for g, _ in GROUPS] + ["other"]
    print(f"# cifar100/cpu preset step, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          "per step: wall seconds, then each group's share of the wall time in %")
    print(f"{'':18s}" + "".join(f"{c[:12]:>13s}" for c in cols))
    for (name, prec), r in rows.items():
        print(f"{name + ' ' + prec:18s}{r['wall_s']:13.3f}"
              + "".join(f"{100 * r.get(c, 0.0) / r['wall_s']:12.1f}%" for c in cols[1:]))
    return rows


if __name__ == "__main__":
    main()
