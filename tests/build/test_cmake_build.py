"""The CMake build for C++ users compiles the same sources into a library that registers the ops.

Builds CPU-only (a CUDA CMake build needs a full toolkit with cuDNN/nvrtc libraries) into a temporary
directory, loads the library into a fresh Python process with torch.ops.load_library, and checks the
operator against the reference. Skipped when cmake is not installed.
"""
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from _support import REPO_ROOT

ROOT = REPO_ROOT


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed")
def test_cmake_cpu_library_registers_operators(tmp_path):
    build = tmp_path / "build"
    cfg = subprocess.run(
        ["cmake", "-S", str(ROOT), "-B", str(build), "-DENTANGLE_WITH_CUDA=OFF",
         "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}"],
        capture_output=True, text=True)
    assert cfg.returncode == 0, cfg.stdout[-2000:] + cfg.stderr[-2000:]
    bld = subprocess.run(["cmake", "--build", str(build), "-j2"], capture_output=True, text=True)
    assert bld.returncode == 0, bld.stdout[-3000:] + bld.stderr[-3000:]
    libs = list(build.glob("libentangle_ext_ops*.so"))
    assert libs, list(build.iterdir())
    script = textwrap.dedent(f"""
        import torch
        torch.ops.load_library({str(libs[0])!r})
        u = torch.tensor([2.0, 0.0, 1.0], dtype=torch.float64)
        v = torch.tensor([3.0, 0.0], dtype=torch.float64)
        # (w2 (S,), dW2/du, dW2/dv) at the input positions; the two flags ask for both gradients
        w, du, dv = torch.ops.entangle_ext.wasserstein2_1d(u, v, torch.tensor([0, 3]), torch.tensor([0, 2]),
                                                           -1, True, True)
        want = 1 / 6 + 4 / 6 + 1 / 3
        assert abs(float(w[0]) - want) < 1e-12, float(w[0])
        assert torch.allclose(du, torch.tensor([-2 / 3, 0.0, -1 / 3], dtype=torch.float64), atol=1e-12), du
        assert torch.allclose(dv, torch.tensor([4 / 3, -1 / 3], dtype=torch.float64), atol=1e-12), dv
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr
