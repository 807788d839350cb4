"""Both install routes from a clean copy of the repository into a fresh venv that has only torch
(the CPU build, for speed): plain ``pip install .`` (the kernels compile at the first import,
once, under a file lock) and ``pip install --no-build-isolation .`` (compiled ahead of time).
Slow (two compilations, ~8 min on 2 cores): runs when ENTANGLE_TEST_INSTALL=1 (``.ci/run`` sets
it); ENTANGLE_TEST_INSTALL_TORCH chooses the torch (default torch==2.13.0, the CPU build)."""
import os
import shutil
import subprocess
import sys
import time

import pytest
from _support import REPO_ROOT

ROOT = REPO_ROOT
TORCH_SPEC = os.environ.get("ENTANGLE_TEST_INSTALL_TORCH", "torch==2.13.0")

pytestmark = pytest.mark.skipif(os.environ.get("ENTANGLE_TEST_INSTALL") != "1",
                                reason="builds fresh venvs (~8 min): set ENTANGLE_TEST_INSTALL=1 (.ci/run does)")

USE = """
import sys, torch, entangle_ext as ee
u, v = torch.tensor([[0.0, 1.0, 3.0]]), torch.tensor([[1.0, 2.0, 5.0]])
got = ee.wasserstein2_1d(u, v)
want = ee.reference.wasserstein2_1d(u, v)
assert torch.allclose(got, want), (got, want)
print("ROUTE", ee.build_route(), "PATH", ee.build_path(), "CUDA", ee.cuda_built(), "W2", float(got[0]))
"""


def _run(cmd, env=None, timeout=1200, cwd=None):
    """``cmd`` (run outside the checkout: ``python -c`` would import its entangle_ext/)."""
    p = subprocess.run(cmd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout,
                       cwd=cwd or ROOT.parent)
    assert p.returncode == 0, f"{cmd[:4]} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """(python of a fresh venv with only torch and pip, a clean copy of the tracked files)."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    _run([sys.executable, "-m", "venv", str(tmp / "venv")])
    py = str(tmp / "venv" / "bin" / "python")
    _run([py, "-m", "pip", "install", "-q", TORCH_SPEC])
    return py, src, tmp


def test_plain_pip_install_compiles_once_at_the_first_import(venv):
    py, src, tmp = venv
    _run([py, "-m", "pip", "install", "-q", str(src)])          # was: stopped, asking for --no-build-isolation
    listed = _run([py, "-m", "pip", "show", "-f", "entangle_ext"]).stdout
    assert "entangle_ext/_csrc/sources.txt" in listed and "_C." not in listed   # sources shipped, no binary
    env = {"ENTANGLE_JIT_DIR": str(tmp / "jit"), "MAX_JOBS": "2"}
    # two first imports at once: one compiles, the other waits for it under the lock
    procs = [subprocess.Popen([py, "-c", USE], env={**os.environ, **env}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT.parent) for _ in range(2)]
    outs = [p.communicate(timeout=1200) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    errs = "".join(e for _, e in outs)
    assert errs.count("compiling the CPU kernels") == 1 and "waiting for another process" in errs, errs
    for out, _ in outs:
        assert "ROUTE first-import" in out and str(tmp / "jit") in out and "W2 " in out
    t = time.perf_counter()
    again = _run([py, "-c", USE], env=env)
    assert "compiling" not in again.stderr and "ROUTE first-import" in again.stdout
    assert time.perf_counter() - t < 60   # loaded from the cache, not compiled again


def test_no_compiler_is_a_clear_error_not_a_crash(venv):
    py, src, tmp = venv
    code = ("import warnings, torch\nwith warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n    import entangle_ext as ee\n"
            "assert ee.build_route() is None and 'no C++ compiler' in ee.load_error(), ee.load_error()\n"
            "assert any('no C++ compiler' in str(x.message) for x in w)\n"
            "try:\n    ee.wasserstein2_1d(torch.ones(3), torch.ones(3))\nexcept RuntimeError as e:\n"
            "    assert 'entangle_ext.reference' in str(e); print('RAISED')\n")
    out = _run([py, "-c", code], env={"ENTANGLE_JIT_DIR": str(tmp / "jit_nocxx"), "CXX": "/nonexistent/c++"})
    assert "RAISED" in out.stdout


def test_no_build_isolation_compiles_ahead_of_time(venv):
    py, src, tmp = venv
    _run([py, "-m", "pip", "install", "-q", "setuptools>=64", "wheel", "ninja"])
    _run([py, "-m", "pip", "install", "-q", "--no-build-isolation", "--force-reinstall", "--no-deps", str(src)],
         env={"MAX_JOBS": "2"})
    out = _run([py, "-c", USE], env={"ENTANGLE_JIT_DIR": str(tmp / "jit_unused")})
    assert "ROUTE ahead-of-time" in out.stdout and "site-packages/entangle_ext/_C" in out.stdout
    assert not (tmp / "jit_unused").exists()
