"""The runs of tests/unlearn/test_distributed.py: a tiny float64 problem, its configs, and the worker each of
two gloo processes runs (every scenario in one launch: process start-up is the slow part)."""
import dataclasses
import gc
import importlib
import json
import os
import shutil
import sys
import traceback
from datetime import timedelta

import torch
from torch.utils.data import TensorDataset

import entangle_ext as ee
from entangle_ext.train import TrainRecipe

C, DIM = 3, 6
# forget 13, adjacent 21, remote 27: with the batch sizes below some global batches have a single
# sample, so one of two ranks gets an empty part.
SIZES = {"forget": 13, "adjacent": 21, "remote": 27, "forget_test": 5, "adjacent_test": 6, "remote_test": 7}
# Every registered method that trains, under DDP: case -> (method, its config's fields; None = the
# two-stage `config()`). Two ranks cut a global batch of n samples into ceil(n/2) + floor(n/2): an
# odd n gives unequal parts, n = 1 an empty part on rank 1. The streams are forget (13 samples),
# retain = adjacent + remote (48) and all three (61). "_unequal": unequal parts, none empty;
# "_empty": a part is empty on rank 1 (the comments give each stream's global batches).
_TRAIN = dict(epochs=1, train_mode=False)
_ADAM = dict(optimizer="adam", lr=1e-2, weight_decay=0.0, epochs=1)
BASELINES = {"ft": ("ft", dict(optimizer="adam", lr=1e-2, epochs=2, batch_size=8, weight_decay=0.0)),
             "ga": ("ga", dict(lr=5e-2, epochs=2, forget_batch_size=6)),
             "salun": ("salun", dict(_ADAM, batch_size=10, forget_batch_size=6)),
             "scrub": ("scrub", dict(_ADAM, epochs=2, msteps=1, batch_size=12, forget_batch_size=6)),
             # retain 7 x 6 + 6, forget 5, 5, 3 (restarted)
             "neggrad_plus_unequal": ("neggrad_plus", dict(_TRAIN, lr=5e-2, batch_size=7, forget_batch_size=5)),
             # retain 4 x 12, forget 4, 4, 4, 1
             "neggrad_plus_empty": ("neggrad_plus", dict(_TRAIN, lr=5e-2, batch_size=12, forget_batch_size=4)),
             # retain 7 x 6 + 6; then 47 + 1 (two epochs)
             "l1_sparse_unequal": ("l1_sparse", dict(_TRAIN, lr=5e-2, batch_size=7, l1=1e-2, momentum=0.0)),
             "l1_sparse_empty": ("l1_sparse", dict(_TRAIN, lr=5e-2, epochs=2, batch_size=47, l1=1e-2)),
             # forget 7 + 6, all 8 x 7 + 5; then forget 6, 6, 1, all 10 x 6 + 1
             "ssd_unequal": ("ssd", dict(lam=1.0, alpha=1.5, batch_size=7)),
             "ssd_empty": ("ssd", dict(lam=1.0, alpha=1.5, batch_size=6)),
             # forget 5, 5, 3 with retain 7s; then forget 4, 4, 4, 1 with retain 4 x 12 (two epochs:
             # the memory bank; gamma 1: the weight λ is far from 0)
             "gdr_unequal": ("gdr", dict(_TRAIN, lr=1e-2, epochs=2, batch_size=7, forget_batch_size=5, gamma=1.0,
                                         weight_decay=0.0)),
             "gdr_empty": ("gdr", dict(_TRAIN, lr=1e-2, epochs=2, batch_size=12, forget_batch_size=4, gamma=1.0,
                                       weight_decay=0.0)),
             # retain 7 x 6 + 6 with forget 5, 5, 3 restarted; then retain 6 x 8 with forget 4, 4, 4, 1 and
             # two retain-only steps (not restarted)
             "munba_unequal": ("munba", dict(_TRAIN, lr=5e-2, batch_size=7, forget_batch_size=5, forget_cycle=True)),
             "munba_empty": ("munba", dict(_TRAIN, lr=5e-2, batch_size=8, forget_batch_size=4, forget_cycle=False)),
             # forget 5, 5, 3 (two epochs); then 4, 4, 4, 1
             "delete_unequal": ("delete", dict(_TRAIN, lr=5e-2, epochs=2, forget_batch_size=5)),
             "delete_empty": ("delete", dict(_TRAIN, lr=5e-2, forget_batch_size=4)),
             # all 8 x 7 + 5; then 6 x 10 + 1
             "rl_unequal": ("rl", dict(_ADAM, batch_size=7)),
             "rl_empty": ("rl", dict(_ADAM, batch_size=10)),
             # no parts: every rank trains the fresh model on whole batches, as one process does
             "retrain": ("retrain", dict(recipe=TrainRecipe("adam", lr=1e-2, epochs=2, batch_size=7))),
             # the ablations of the two-stage method (its streams: see config())
             **{n: (n, None) for n in ("no_w2", "pgd_mean", "stage1_only", "two_stage_basis4")}}
# a baseline scenario runs in a process group of its own: a rank left waiting in a collective
# that the other rank never joins (it stopped with an error) stops after this, and the next
# scenario starts on both ranks together
SCENARIO_TIMEOUT = timedelta(seconds=30)


def splits(dtype=torch.float64) -> ee.Splits:
    g = torch.Generator().manual_seed(0)
    parts = {}
    for name, n in SIZES.items():
        x = torch.randn(n, DIM, generator=g, dtype=torch.float64).to(dtype)
        y = torch.randint(0, C, (n,), generator=g)
        if name.startswith("forget"):
            y.fill_(1)
        parts[name] = TensorDataset(x, y)
    return ee.Splits(**parts)


def model(dtype=torch.float64) -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(DIM, 8), torch.nn.Tanh(), torch.nn.Linear(8, C)).to(dtype)


def config(recipe: str = "reference", micro_batch=None, **kw) -> ee.UnlearnConfig:
    cfg = ee.UnlearnConfig(recipe="reference", **{"log_every": 1, "eval_batch_size": 4, **kw}).with_recipe(recipe)
    cfg.stage1 = dataclasses.replace(cfg.stage1, lr=2e-2, remote_batch_size=13, forget_batch_size=5,
                                     epochs=1)                        # 3 steps (13, 13, 1)
    cfg.stage2 = dataclasses.replace(cfg.stage2, lr=5e-2, epochs=1, adjacent_batch_size=8,
                                     forget_batch_size=5, forget_batch_limit=3, remote_batch_size=13,
                                     remote_batch_limit=3, micro_batch=micro_batch)   # 3 steps
    return cfg


def baseline_case(case: str):
    """(method name, config) of the `BASELINES` case ``case``."""
    from entangle_ext.methods import get_method
    method, fields = BASELINES[case]
    if fields is None:
        return method, config()
    return method, get_method(method).Config(log_every=1, eval_batch_size=4, **fields)


def params_of(m: torch.nn.Module) -> torch.Tensor:
    """All parameters, flattened (full tensors of FSDP shards)."""
    return torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1)
                      for p in m.parameters()])


def summary(res) -> dict:
    """What the tests compare: parameters, λ, the report's numbers, the history."""
    rep = res.report
    return {"params": params_of(res.model), "lambda": rep.get("lambda_final"), "c0": rep.get("c0"),
            "steps": rep["steps"], "evals": rep["evals"], "history": res.history,
            "world_size": rep.get("world_size")}


# ----------------------------------------------------------------------------------- scenarios
def _shard(m, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (world,))
    for sub in m:
        if isinstance(sub, torch.nn.Linear):
            fully_shard(sub, mesh=mesh)
    return fully_shard(m, mesh=mesh)


def _ddp(m, group=None):
    return torch.nn.parallel.DistributedDataParallel(m, process_group=group)


def _own_group(fn):
    """``fn(group)`` with a new process group of both ranks (`SCENARIO_TIMEOUT`), destroyed after."""
    import torch.distributed as dist
    g = dist.new_group(timeout=SCENARIO_TIMEOUT)
    try:
        return fn(g)
    finally:
        gc.collect()
        dist.destroy_process_group(g)


class SignalledNet(torch.nn.Module):
    """`model()` whose k-th gradient-enabled forward on rank 1 sends SIGTERM to its own process."""

    def __init__(self, k: int):
        super().__init__()
        self.net, self.k, self.calls = model(), k, 0

    def forward(self, x):
        import signal
        import torch.distributed as dist
        if torch.is_grad_enabled():
            self.calls += 1
            if self.calls == self.k and dist.get_rank() == 1:
                os.kill(os.getpid(), signal.SIGTERM)
        return self.net(x)


def scenarios(out: str, world: int, one_process_ckpt: str):
    """name -> zero-argument function returning what to record (run inside every rank)."""
    def two_stage(wrap, cfg, sub, **kw):
        return lambda: summary(ee.unlearn(wrap(model()), splits(), cfg, progress=False,
                                          out_dir=os.path.join(out, sub), **kw))

    def baseline(case):
        def run(group):
            method, cfg = baseline_case(case)
            return summary(ee.unlearn(_ddp(model(), group), splits(), cfg, method=method, progress=False))
        return lambda: _own_group(run)

    def interrupted():   # rank 1 is signalled in Stage-1 step 1; both stop at the log point, step 2
        from entangle_ext.unlearn import RunInterrupted
        try:
            ee.unlearn(_ddp(SignalledNet(2)), splits(), config(log_every=2), progress=False,
                       out_dir=os.path.join(out, "interrupted"))
        except RunInterrupted as e:
            return {"stage": e.stage, "step": e.step, "signal": e.signal, "checkpoint": e.checkpoint}
        return {"stage": None}

    def refused():
        try:
            ee.unlearn(_ddp(model()), splits(), resume=one_process_ckpt, progress=False)
        except ValueError as e:
            return {"error": str(e)}
        return {"error": None}

    def moved_fsdp_checkpoint():
        """Rank 0 copies the FSDP run's Stage-1 step-2 checkpoint (file and .dcp directory) to
        another folder and renames the original .dcp away, so the resume below reads the shards
        only if it looks beside the file it was given (not at the path stored in it)."""
        import torch.distributed as dist
        src, dst = os.path.join(out, "fsdp", "checkpoints"), os.path.join(out, "fsdp_moved")
        if dist.get_rank() == 0:
            os.makedirs(dst)
            shutil.copy(os.path.join(src, "stage1_step000002.pt"), dst)
            shutil.copytree(os.path.join(src, "stage1_step000002.dcp"), os.path.join(dst, "stage1_step000002.dcp"))
            os.rename(os.path.join(src, "stage1_step000002.dcp"), os.path.join(src, "stage1_step000002.dcp.away"))
        dist.barrier()
        return {}

    ck = config(checkpoint_every=1)
    runs = {
        "ddp": two_stage(_ddp, ck, "ddp"),
        "ddp_resume": two_stage(_ddp, ck, "ddp_resume",
                                resume=os.path.join(out, "ddp", "checkpoints", "stage2_step000001.pt")),
        "fsdp": two_stage(lambda m: _shard(m, world), config("paper", micro_batch=3, checkpoint_every=1),
                          "fsdp"),
        "fsdp_moved": moved_fsdp_checkpoint,
        "fsdp_resume": two_stage(lambda m: _shard(m, world), config("paper", micro_batch=3), "fsdp_resume",
                                 resume=os.path.join(out, "fsdp_moved", "stage1_step000002.pt")),
        "ddp_float32": lambda: summary(ee.unlearn(_ddp(model(torch.float32)), splits(torch.float32),
                                                  config(), progress=False)),
        "refused": refused,
        "interrupted": interrupted,
    }
    runs.update({f"baseline_{n}": baseline(n) for n in BASELINES})
    return runs


def worker(rank: int, world: int, init_file: str, out: str, one_process_ckpt: str) -> None:
    """One rank: run every scenario, record each result (or its traceback) to out/{name}_{rank}.pt."""
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    run = importlib.import_module("entangle_ext.unlearn.run")
    writes = []
    real = run.write_report
    run.write_report = lambda *a, **k: (writes.append(rank), real(*a, **k))
    try:
        for name, fn in scenarios(out, world, one_process_ckpt).items():
            try:
                rec = fn()
            except Exception:   # recorded for the test to show; the other rank fails alike
                rec = {"traceback": traceback.format_exc()}
            torch.save(rec, os.path.join(out, f"{name}_{rank}.pt"))
        with open(os.path.join(out, f"writes_{rank}.json"), "w") as f:
            json.dump(writes, f)
        dist.barrier()   # both ranks are done with every collective before either tears down
    finally:
        gc.collect()     # the scenarios' models, meshes and pending works go while the group is alive
        dist.destroy_process_group()
    # Every record is on disk: leave without interpreter finalization, where gloo objects still
    # referenced could be destructed after their threads' state (seen once in CI as a SIGABRT,
    # "terminate called without an active exception", of a rank after a complete run).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
