"""The GPU check's own machinery, on CPU: the script parses (and passes shellcheck when installed),
the summary reads logs and benchmark JSON right, and the per-test timeout of conftest.py fails a
slow test and ends a run stuck in native code."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from _support import REPO_ROOT

ROOT = REPO_ROOT
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_summary  # noqa: E402


def test_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    if shutil.which("shellcheck"):
        res = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout


def _work_dir(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    (work / "env.txt").write_text("mode: gpu\ndate: 2026-01-01T00:00:00Z\ngpu: NVIDIA H200, 580.1, "
                                  "143771 MiB, 9.0\ntorch: 2.11.0+cu130\ntorch_cuda: 13.0\n")
    steps = [("build", "0", "80", "110", "build", ""),
             ("tests_cuda", "1", "40", "50", "tests", ""),
             ("tests_other", "124", "40", "40", "tests", "timed out"),
             ("sanitizer_memcheck", "1", "15", "20", "tests", ""),
             ("sanitizer_racecheck", "skip", "0", "0", "tests", "compute-sanitizer not found"),
             ("bench_w2", "0", "12", "20", "bench", "")]
    (work / "steps.tsv").write_text("".join("\t".join(s) + "\n" for s in steps))
    (work / "build.log").write_text(
        "/x/csrc/cuda/projection.cu(12): warning #177-D: variable \"t\" was declared but never "
        "referenced\n/usr/include/torch/a.h(3): warning #1: not ours\n")
    (work / "tests_cuda.log").write_text(
        "..F.s [100%]\nFAILED tests/test_x.py::test_bad - AssertionError\n"
        "1 failed, 3 passed, 1 skipped in 2.50s\n")
    (work / "tests_other.log").write_text("..s. [ 10%]\ntests/test_y.py .F [ 20%]\n")
    (work / "sanitizer_memcheck.log").write_text(
        "========= Invalid __global__ read of size 4 bytes\n=========     at k()\n"
        "========= ERROR SUMMARY: 2 errors\n")
    (out / "bench_w2.json").write_text(json.dumps({"rows": [
        {"case": "64x512", "ratio": 6.0}, {"case": "4096x128", "speedup": 4.0},
        {"case": "ragged64(64-1024)", "speedup": 7.5}, {"case": "1x1048576", "speedup": 3.2}]}))
    (out / "bench_projection.json").write_text(json.dumps({"meta": {"copy_GBps": 4000.0}, "results": [
        {"workload": "flat P=11.2M", "k": 2, "P": 11200000, "fused_GBps": 3000.0},
        {"workload": "flat P=125M", "k": 8, "P": 125000000, "fused_GBps": 1000.0}]}))
    return work, out


def test_summary_reads_steps_logs_and_benchmarks(tmp_path):
    work, out = _work_dir(tmp_path)
    text = gpu_summary.summarize(work, out)
    summary = json.loads((out / "summary.json").read_text())
    assert (out / "summary.txt").read_text() == text and len(text.splitlines()) <= 40
    steps = {s["name"]: s for s in summary["steps"]}
    assert steps["build"]["status"] == "ok" and "1 compiler warnings in csrc/" in steps["build"]["text"]
    assert summary["details"]["build"]["warning_sites"] == ["csrc/cuda/projection.cu:12"]
    assert steps["tests_cuda"]["status"] == "FAILED"
    assert summary["details"]["tests_cuda"] == {"failed": 1, "passed": 3, "skipped": 1,
                                                "failures": ["FAILED tests/test_x.py::test_bad"]}
    other = summary["details"]["tests_other"]
    assert steps["tests_other"]["status"] == "timed out" and other["incomplete_at"] == "20%"
    assert (other["passed"], other["failed"], other["skipped"]) == (4, 1, 1)
    assert summary["details"]["sanitizer_memcheck"]["errors"] == 2
    assert "Invalid __global__ read" in steps["sanitizer_memcheck"]["text"]
    assert steps["sanitizer_racecheck"]["status"] == "skipped"
    checks = {c["name"]: c for c in summary["benchmarks"]}
    assert checks["W2 fwd+bwd 64x512: speed-up vs composite"]["ok"] is True
    assert checks["W2 fwd+bwd 4096x128: speed-up vs composite"]["ok"] is False
    assert checks["W2 fwd+bwd ragged: speed-up vs composite"]["value"] == 7.5
    k2 = checks["projection k=2 P=11.2M: fraction of copy bandwidth"]
    assert k2["value"] == pytest.approx(0.75) and k2["ok"] is True
    assert checks["projection k=8 P=125M: fraction of copy bandwidth"]["ok"] is False
    assert checks["projection k=2 P=125M: fraction of copy bandwidth"]["value"] is None
    assert "bench_unlearn: no JSON" in checks
    assert set(summary["failed_steps"]) == {"tests_cuda", "tests_other", "sanitizer_memcheck"}
    assert len(summary["below_target"]) == 2
    assert "BELOW" in text and "75%" in text


_TIMEOUT_TESTS = textwrap.dedent("""
    import signal, time

    def test_slow():
        time.sleep(30)

    def test_fast():
        pass

    def test_stuck_in_native_code():   # the alarm cannot interrupt it: the process is ended
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(60)
""")


def test_per_test_timeout_of_conftest(tmp_path):
    for name in ("conftest.py", "_support.py"):   # (the conftest imports _support)
        shutil.copy(ROOT / "tests" / name, tmp_path / name)
    (tmp_path / "test_t.py").write_text(_TIMEOUT_TESTS)
    env = dict(os.environ, ENTANGLE_TEST_TIMEOUT_GRACE="2")
    env.pop("ENTANGLE_TEST_TIMEOUT", None)
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-p", "no:timeout", "--test-timeout", "1", "test_t.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "F." in out, out                                   # slow failed, fast passed
    assert "Timeout (0:00:03)" in out and "test_stuck_in_native_code" in out, out
