"""The paper-scale GPU run's scripts on CPU: data staging splits and reassembles byte-exactly and
refuses a damaged or missing part before any work; the --dry-run of the paper script runs the whole
code path (needs cifar100.npz; skips without it) and predicts the H200 time; the prepared GPU
session (machine start, gpu_check.sh, staging, the paper run, one rerun of the shorter script)
fits one 15-minute device lease."""
import hashlib
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _support import REPO_ROOT

ROOT = REPO_ROOT
STAGE = ROOT / "scripts" / "gpu_stage_data.sh"
PAPER = ROOT / "scripts" / "gpu_paper_cifar100.sh"
CHECK = ROOT / "scripts" / "gpu_check.sh"

LEASE_S = 900            # device time of one session, machine start included
MACHINE_START_S = 150    # "~2-3 min"
STAGE_CALL_S = 15        # one carried part per call: transfer + a trivial command
CARRY_MIB = 64           # what one device call carries, working tree included


def _env(**kw):
    return {**os.environ, "PYTHON": sys.executable, **kw}


def _run(cmd, **kw):
    return subprocess.run(["bash", *map(str, cmd)], capture_output=True, text=True, cwd=ROOT, **kw)


def _default(script: Path, name: str) -> int:
    m = re.search(rf"^{name}=\$\{{{name}:-(\d+)\}}", script.read_text(), re.M)
    assert m, f"{name} default not found in {script.name}"
    return int(m.group(1))


def test_scripts_parse():
    for s in (STAGE, PAPER):
        assert _run(["-n", s]).returncode == 0, s


def test_staging_round_trip_and_damaged_or_missing_parts_are_refused(tmp_path):
    src = tmp_path / "cifar100.npz"
    src.write_bytes(os.urandom(3 * 2**20 + 12345))   # 3 MiB + a bit: 4 parts of 1 MiB
    stage = tmp_path / "stage"
    r = _run([STAGE, "--part-mib", "1", src, stage], env=_env())
    assert r.returncode == 0, r.stderr
    parts = sorted(stage.glob("cifar100.npz.part*"))
    assert [p.name[-2:] for p in parts] == ["00", "01", "02", "03"]
    assert all(p.stat().st_size <= 2**20 for p in parts)
    assert b"".join(p.read_bytes() for p in parts) == src.read_bytes()
    manifest = (stage / "cifar100.npz.sha256").read_text().splitlines()
    assert manifest[0] == f"{hashlib.sha256(src.read_bytes()).hexdigest()}  cifar100.npz"
    assert len(manifest) == 1 + len(parts)

    # bad part sizes are refused with a message
    for bad in ("0", "61", "x"):
        r = _run([STAGE, "--part-mib", bad, src, stage], env=_env())
        assert r.returncode == 2 and "--part-mib" in r.stderr

    # a damaged part: refused before any Python work, naming the checksum
    damaged = bytearray(parts[1].read_bytes())
    damaged[100] ^= 0xFF
    parts[1].write_bytes(bytes(damaged))
    out = tmp_path / "out"
    r = _run([PAPER, "--dry-run", out], env=_env(STAGE_DIR=str(stage)))
    assert r.returncode == 2 and "checksum" in r.stderr, r.stderr
    assert not (out / "paper_cifar100.json").exists()
    # a missing part: named
    parts[1].unlink()
    r = _run([PAPER, "--dry-run", out], env=_env(STAGE_DIR=str(stage)))
    assert r.returncode == 2 and "cifar100.npz.part01" in r.stderr, r.stderr
    # no manifest at all (a GPU run; a dry run would stage the data file it finds instead)
    r = _run([PAPER, out], env=_env(STAGE_DIR=str(tmp_path / "empty")))
    assert r.returncode == 2 and "stage the data first" in r.stderr


def test_staging_reassembly_catches_a_part_swapped_with_a_consistent_manifest(tmp_path):
    """Every part matching its own line is not enough: the whole-file checksum catches parts
    concatenated in another order (here: a manifest whose part lines were reordered)."""
    src = tmp_path / "cifar100.npz"
    src.write_bytes(os.urandom(2 * 2**20 + 7))
    stage = tmp_path / "stage"
    assert _run([STAGE, "--part-mib", "1", src, stage], env=_env()).returncode == 0
    m = stage / "cifar100.npz.sha256"
    lines = m.read_text().splitlines()
    m.write_text("\n".join([lines[0], lines[2], lines[1], *lines[3:]]) + "\n")
    r = _run([PAPER, "--dry-run", tmp_path / "out"], env=_env(STAGE_DIR=str(stage)))
    assert r.returncode == 2 and "is not the manifest's" in r.stderr, r.stderr


def _cifar100():
    sys.path.insert(0, str(ROOT))
    from entangle_ext.data.cifar100 import find_cifar100
    p = find_cifar100()
    if p is None or not str(p).endswith(".npz"):
        pytest.skip("cifar100.npz not found (ENTANGLE_DATA or the checkout's shared/data)")
    return Path(p)


def test_paper_dry_run_runs_the_whole_path_and_predicts_the_h200_time(tmp_path):
    pytest.importorskip("torchvision")   # the setting's ResNet-18 (the CPU-build CI venv has none)
    data = _cifar100()
    out = tmp_path / "out"
    r = _run([PAPER, "--dry-run", out], env=_env(), timeout=960)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "matches the manifest" in r.stdout
    res = json.loads((out / "paper_cifar100.json").read_text())
    assert res["mode"] == "dry-run"
    assert set(res["runs"]) == {"original", "two_stage", "no_w2"}
    for name in ("two_stage", "no_w2"):
        run = res["runs"][name]
        assert run["steps"] == {"stage1": 1, "stage2": 1}, run["steps"]
        assert set(run["timings_s"]) >= {"stage1", "stage2"}
        for v in run["held_out"].values():
            assert 0.0 <= v <= 100.0
    # 1 train image per fine class, 1 held-out: the three splits of the paper's protocol
    assert res["split_sizes"] == {"forget": 1, "adjacent": 4, "remote": 95}
    assert res["runs"]["two_stage"]["n_held_out"] == {"forget": 1, "adjacent": 4, "remote": 95}
    pred = res["prediction"]
    # full-scale work: 10 epochs over 50 000 images; Stage 1 ceil(47 500 / 128) steps; Stage 2
    # 6 epochs of ceil(2 000 / 128) steps
    assert pred["full_scale_images"]["original"]["train"] == 10 * 50_000
    assert pred["full_scale_images"]["steps"] == {"stage1": math.ceil(47_500 / 128), "stage2": 6 * 16}
    assert all(v > 0 for v in pred["measured_rates_here"].values())
    assert 0 < pred["predicted_s_h200"]["total"] <= _default(PAPER, "CAP_PAPER"), pred["predicted_s_h200"]
    assert "predicted H200 time" in r.stdout
    text = (out / "paper_cifar100.txt").read_text()
    assert "90.00/80.00/85.33" in text and "2.33/78.17/81.10" in text and "14.33/87.00/80.55" in text
    assert data.exists()


def test_the_prepared_gpu_session_fits_one_lease():
    """Machine start + gpu_check.sh (its caps) + one call per data part + the paper run (its cap)
    + one rerun of the shorter of the two scripts <= the session's device time; each part fits
    one call beside the working tree."""
    text = CHECK.read_text()
    caps = {n: _default(CHECK, n) for n in re.findall(r"^(CAP_[A-Z0-9_]+)=", text, re.M)}
    check_s = sum(v * (4 if n == "CAP_SANITIZER" else 1) for n, v in caps.items())
    assert "for tool in memcheck racecheck synccheck initcheck" in text   # the 4 sanitizer runs
    paper_s = _default(PAPER, "CAP_PAPER")
    part_mib = int(re.search(r"^PART_MIB=(\d+)", STAGE.read_text(), re.M).group(1))
    cifar_bytes = 167_459_909           # shared/data/cifar100.npz (the README's 167.5 MB)
    n_parts = math.ceil(cifar_bytes / (part_mib * 2**20))
    total = MACHINE_START_S + check_s + n_parts * STAGE_CALL_S + paper_s + min(check_s, paper_s)
    assert total <= LEASE_S, dict(check=check_s, paper=paper_s, parts=n_parts, total=total)
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if tracked.returncode == 0:   # in a git checkout: the tracked files travel with every call
        files = [ROOT / f for f in tracked.stdout.decode().split("\0") if f]
        tree = sum(f.stat().st_size for f in files if f.is_file())
        assert tree + part_mib * 2**20 <= CARRY_MIB * 2**20, tree
