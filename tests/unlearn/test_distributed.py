"""Two gloo processes on the CPU give the result of one process with the same global batch and seed
(docs/algorithm.md §11): the two-stage method under DDP and under FSDP (fully_shard), every other
registered method that trains under DDP (with unequal and with empty parts of global batches),
resume from a distributed checkpoint (DCP for FSDP), a resume on another number of ranks refused,
a signal on one rank stopping all at the same step, and files written by rank 0 only. Every
2-process scenario runs in one launch (tests/dist_workers.py); the one-process references run
here."""
import json
import os
import time

import pytest
import torch

import entangle_ext as ee
import dist_workers as W

pytestmark = pytest.mark.skipif(not ee.available(), reason=f"extension not loaded: {ee.load_error()}")

WORLD = 2
F64 = dict(rtol=1e-12, atol=1e-13)    # float64: round-off of sums taken in another order (seen: 3e-16)
F32 = dict(rtol=2e-5, atol=2e-6)      # float32: the same at float32 resolution (seen: λ 1.2e-6, θ 1.3e-7)


def _launch(out: str, one_process_ckpt: str, timeout_s: float = 300.0) -> None:
    import torch.distributed as dist
    import torch.multiprocessing as mp
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    try:
        ctx = mp.start_processes(W.worker, args=(WORLD, os.path.join(out, "init"), out, one_process_ckpt),
                                 nprocs=WORLD, join=False, start_method="spawn")
    except (OSError, RuntimeError) as e:   # no way to start processes here
        pytest.skip(f"cannot start worker processes: {e}")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                pytest.fail(f"the {WORLD}-process run did not finish in {timeout_s:.0f} s")
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as e:   # say how far the ranks got (which scenario records exist)
        done = sorted(f for f in os.listdir(out) if f.endswith((".pt", ".json")))
        raise AssertionError(f"{e}; records written before: {done}") from e


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{scenario: [rank 0 record, rank 1 record]} of the 2-process launch, plus the one-process
    checkpoint it must refuse."""
    torch.set_num_threads(1)
    out = str(tmp_path_factory.mktemp("dist"))
    one = ee.unlearn(W.model(), W.splits(), W.config(checkpoint_every=1), progress=False,
                     out_dir=os.path.join(out, "one"))
    del one
    _launch(out, os.path.join(out, "one", "checkpoints", "stage1_step000001.pt"))
    recs = {}
    for name in list(W.scenarios(out, WORLD, "")) + ["writes"]:
        if name == "writes":
            recs[name] = [json.load(open(os.path.join(out, f"writes_{r}.json"))) for r in range(WORLD)]
            continue
        recs[name] = [torch.load(os.path.join(out, f"{name}_{r}.pt"), weights_only=False) for r in range(WORLD)]
    recs["out"] = out
    return recs


def _get(runs, name):
    """Both ranks' records of scenario ``name``; skips when FSDP2 is missing from this torch."""
    failed = {r: rec["traceback"] for r, rec in enumerate(runs[name]) if "traceback" in rec}
    if any("fully_shard" in tb and "ImportError" in tb for tb in failed.values()):
        pytest.skip("torch.distributed.fsdp.fully_shard is not available")
    assert not failed, "\n".join(f"{name} on rank {r}:\n{tb}" for r, tb in failed.items())   # every rank's
    return runs[name]


def _one_process(cfg, dtype=torch.float64, **kw):
    return W.summary(ee.unlearn(W.model(dtype), W.splits(dtype), cfg, progress=False, **kw))


def _assert_same(got: dict, want: dict, tol: dict) -> None:
    """Parameters, λ, c0, step counts, every evaluation and every logged value agree."""
    torch.testing.assert_close(got["params"], want["params"], **tol)
    assert got["steps"] == want["steps"]
    for key in ("lambda", "c0"):
        if want[key] is None:
            assert got[key] is None
        else:
            assert got[key] == pytest.approx(want[key], rel=tol["rtol"], abs=tol["atol"]), key
    assert set(got["evals"]) == set(want["evals"])
    for tag, ev in want["evals"].items():
        for split, r in ev.items():
            g = got["evals"][tag][split]
            assert g["n"] == r["n"] and g["acc"] == r["acc"], (tag, split)
            assert g["loss"] == pytest.approx(r["loss"], rel=tol["rtol"], abs=tol["atol"]), (tag, split)
    assert len(got["history"]) == len(want["history"])
    for hg, hw in zip(got["history"], want["history"]):
        assert hg.keys() == hw.keys()
        for k, v in hw.items():
            want_v = pytest.approx(v, rel=tol["rtol"] * 10, abs=tol["atol"] * 10) if isinstance(v, float) else v
            assert hg[k] == want_v, (hw["stage"], hw["step"], k)


def _both_ranks(recs, want, tol):
    for rec in recs:
        _assert_same(rec, want, tol)
    torch.testing.assert_close(recs[0]["params"], recs[1]["params"], rtol=0, atol=0)
    assert recs[0]["world_size"] == WORLD


def test_ddp_two_stage_equals_one_process(runs):
    _both_ranks(_get(runs, "ddp"), _one_process(W.config()), F64)


def test_fsdp_two_stage_equals_one_process(runs):
    """Paper recipe (one W2 over the forget set, post-step dual update, no momentum) with
    micro-batches: FSDP's deferred gradient sync and the sharded projection."""
    _both_ranks(_get(runs, "fsdp"), _one_process(W.config("paper", micro_batch=3)), F64)


def test_ddp_float32_within_stated_tolerance(runs):
    _both_ranks(_get(runs, "ddp_float32"), _one_process(W.config(), dtype=torch.float32), F32)


@pytest.mark.parametrize("case", sorted(W.BASELINES))
def test_ddp_baseline_equals_one_process(runs, case):
    """Every registered method that trains (W.BASELINES: for the baselines that take means over
    batches, a case with unequal parts of a global batch and one with an empty part on a rank)."""
    method, cfg = W.baseline_case(case)
    want = W.summary(ee.unlearn(W.model(), W.splits(), cfg, method=method, progress=False))
    assert not torch.equal(want["params"], W.params_of(W.model())), "the run does not move the weights"
    _both_ranks(_get(runs, f"baseline_{case}"), want, F64)


@pytest.mark.parametrize("name,full", [("ddp_resume", "ddp"), ("fsdp_resume", "fsdp")])
def test_resume_of_a_distributed_checkpoint_continues_the_run(runs, name, full):
    for got, want in zip(_get(runs, name), _get(runs, full)):
        torch.testing.assert_close(got["params"], want["params"], rtol=0, atol=0)
        assert got["history"] == want["history"]


def test_resume_on_another_number_of_ranks_is_refused(runs):
    for rec in _get(runs, "refused"):
        assert rec["error"] is not None and "1 process(es), this run has 2" in rec["error"]


def test_a_signal_on_one_rank_stops_every_rank_after_the_same_step(runs):
    """SIGTERM reaches rank 1 during Stage-1 step 1; with log_every=2 both ranks agree at the
    log point after step 2 and checkpoint that step."""
    got = [(r["stage"], r["step"]) for r in _get(runs, "interrupted")]
    assert got == [(1, 2), (1, 2)]
    assert runs["interrupted"][1]["signal"] == "SIGTERM"
    ck = torch.load(runs["interrupted"][0]["checkpoint"], weights_only=False)
    assert ck["step"] == 2 and ck["stage"] == 1 and ck["world_size"] == WORLD


def test_only_rank_0_writes_reports_and_checkpoint_files(runs):
    _get(runs, "fsdp")
    assert runs["writes"][1] == [] and len(runs["writes"][0]) == 4   # ddp, fsdp and their resumes
    ck = os.path.join(runs["out"], "fsdp", "checkpoints")
    saved = torch.load(os.path.join(ck, "stage2_step000001.pt"), weights_only=False)
    assert saved["world_size"] == WORLD and set(saved["sharded"]["names"]) >= {"model", "momentum"}
    assert os.path.isdir(os.path.join(ck, "stage2_step000001.dcp"))


class _Items(torch.utils.data.Dataset):
    """Not a TensorDataset: batches go through a DataLoader and its collate function."""

    def __len__(self):
        return 9

    def __getitem__(self, i):
        return {"x": torch.full((2,), float(i)), "labels": torch.tensor(i % 3)}


def test_rank_parts_of_each_global_batch_add_up_to_it_and_empty_parts_keep_the_structure():
    """In process, no collectives: 3 ranks' streams over 9 samples in batches of 4 (4, 4, 1)."""
    from entangle_ext.unlearn.data import BatchStream
    from entangle_ext.unlearn.distributed import Dist
    ranks = [BatchStream(_Items(), 4, shuffle=True, seed=3, name="t", device="cpu",
                         dist=Dist(rank=r, world=3, kind="replicated")) for r in range(3)]
    one = BatchStream(_Items(), 4, shuffle=True, seed=3, name="t", device="cpu")
    for epoch in range(2):
        parts = [list(s.epoch_batches(epoch)) for s in ranks]
        for k, whole in enumerate(one.epoch_batches(epoch)):
            for key in ("x", "labels"):
                assert torch.equal(torch.cat([p[k][key] for p in parts]), whole[key])
    last = [list(s.epoch_batches(0))[-1] for s in ranks]
    assert [tuple(b["x"].shape) for b in last] == [(1, 2), (0, 2), (0, 2)]
    assert all(b["labels"].dtype == torch.int64 for b in last)
    assert [s.shard_span(2) for s in ranks] == [(0, 1, 1), (1, 1, 1), (1, 1, 1)]


def _run_group(cmd, log, timeout_s, env):
    """Run ``cmd`` in a session of its own with output to ``log``; on timeout kill the whole group
    (torchrun's ranks too) and fail instead of hanging on their pipes."""
    import signal
    import subprocess
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            return p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            pytest.fail(f"{cmd[:3]} did not finish in {timeout_s} s; its output: {open(log).read()[-2000:]}")


def _abort_lines(log: str) -> str:
    """The lines of a torchrun log that say why a rank ended (tracebacks, aborts, errors), plus its
    tail: enough to diagnose a failure from CI's output alone."""
    keys = ("Traceback", "Error", "error", "terminate", "what()", "Abort", "abort", "SIG", "exitcode")
    lines = log.splitlines()
    hits = [f"{i}: {x}" for i, x in enumerate(lines) if any(k in x for k in keys)][:60]
    return "\n".join(hits) + "\n--- tail ---\n" + "\n".join(lines[-25:])


def test_the_cli_under_torchrun_equals_one_process_and_exits_cleanly(tmp_path):
    """`torchrun --nproc_per_node 2 -m entangle_ext` on digits: exit code 0 on both ranks (the CLI
    destroys the process group it created: a rank leaving with a live gloo group can abort at
    exit), the report says 2 ranks, and its accuracies equal the one-process CLI's within one
    sample (float32 sums taken in another order may flip a sample on the decision boundary)."""
    import shutil
    import sys
    import torch.distributed as dist
    pytest.importorskip("sklearn")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    if torchrun is None:
        pytest.skip("torchrun is not installed beside this Python")
    args = ["--setting", "digits", "--no-progress", "--threads", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rc = _run_group([sys.executable, "-m", "entangle_ext", *args, "--out", str(tmp_path / "one")],
                    tmp_path / "one.log", 300, env)
    assert rc == 0, (tmp_path / "one.log").read_text()[-2000:]
    two = [torchrun, "--standalone", "--nproc_per_node", "2", "-m", "entangle_ext", *args, "--out", str(tmp_path / "two")]
    rc = _run_group(two, tmp_path / "two.log", 300, env)
    out = (tmp_path / "two.log").read_text()
    if rc != 0 or "terminate called" in out:
        # One CI run (of ~20 here) saw rank 1 end in SIGABRT; its cause is not known yet. Keep the
        # whole first log in a warning, run once more from scratch, and fail if that fails too.
        import shutil as _shutil
        import warnings
        warnings.warn(f"torchrun run failed once (rc={rc}); first log:\n{_abort_lines(out)}")
        _shutil.rmtree(tmp_path / "two", ignore_errors=True)
        rc = _run_group(two, tmp_path / "two_again.log", 300, env)
        again = (tmp_path / "two_again.log").read_text()
        assert rc == 0 and "terminate called" not in again, \
            f"first try:\n{_abort_lines(out)}\nsecond try:\n{_abort_lines(again)}"
    r1, r2 = (json.load(open(tmp_path / d / "report.json")) for d in ("one", "two"))
    assert r2["world_size"] == 2 and r1["world_size"] == 1
    assert r1["evals"].keys() == r2["evals"].keys()
    for stage, ev in r1["evals"].items():
        for split, v in ev.items():
            assert abs(r2["evals"][stage][split]["acc"] - v["acc"]) <= 1.0 / v["n"] + 1e-12, (stage, split)
