"""The build itself: the native extension loaded, CUDA kernels present whenever torch has CUDA, and
the CUDA sources free of compiler warnings for sm_80 and sm_90."""
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import entangle_ext as ee
from _support import REPO_ROOT


def _flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def test_extension_loaded():
    assert ee.available(), ee.load_error()
    assert ee.built_torch_version() == torch.__version__


def test_cuda_kernels_built_whenever_torch_has_cuda():
    expected = torch.version.cuda is not None and not _flag("ENTANGLE_CPU_ONLY")
    assert ee.cuda_built() == expected, (
        f"torch {torch.__version__} (CUDA {torch.version.cuda}) but cuda_built()={ee.cuda_built()}")
    if expected:
        assert "9.0" in ee.cuda_arch_list() or ee.cuda_arch_list() not in ("", None)
        # The CUDA kernels are registered with the dispatcher even without a GPU.
        assert torch._C._dispatch_has_kernel_for_dispatch_key("entangle_ext::wasserstein2_1d", "CUDA")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("entangle_ext::wasserstein2_1d", "CPU")


def test_version():
    assert ee.__version__.count(".") == 2


# ------------------------------------------------------------------------------ nvcc warnings
# The CUDA sources compile without warnings for sm_80 and sm_90. Each csrc/cuda/*.cu is compiled
# to PTX per architecture (nvcc's front end and device compiler: the EDG and cicc diagnostics) and
# the PTX assembled with ptxas (its diagnostics); the host compiler pass, which only repeats the
# EDG front end's checks on the host code at great cost, is skipped. Warnings are counted only
# where the file named is ours (csrc/): torch's and CUDA's headers have their own.
ROOT = REPO_ROOT
CUDA_SOURCES = sorted((ROOT / "csrc" / "cuda").glob("*.cu"))
ARCHS = ("80", "90")
WARNING_FLAGS = ["-Xcudafe", "--display_error_number", "--Wdefault-stream-launch", "--Wreorder"]
_DIAG_FILE = re.compile(r"^(?P<file>[^\s(:][^(:]*?)(?:\((?P<l1>\d+)\)|:(?P<l2>\d+):(?:\d+:)?)")


def _cuda_toolkit():
    """(nvcc, ptxas) of the toolkit that setup.py builds with (`_build.locate_cuda_home`, called
    without leaving CUDA_HOME set), or None."""
    from entangle_ext import _build
    before = os.environ.get("CUDA_HOME")
    try:
        root = _build.locate_cuda_home()
    finally:
        if before is None:
            os.environ.pop("CUDA_HOME", None)
        else:
            os.environ["CUDA_HOME"] = before
    tools = [Path(root, "bin", n) for n in ("nvcc", "ptxas")] if root else []
    return tools if tools and all(t.exists() for t in tools) else None


def _nvcc_command(nvcc, src, arch, out):
    from torch.utils import cpp_extension
    includes = cpp_extension.include_paths("cpu")   # torch's headers; nvcc adds CUDA's own
    for entry in sys.path:                           # cuBLAS etc. from pip's nvidia wheels
        includes += [str(p) for p in (Path(entry) / "nvidia" / "cu13" / "include",
                                      Path(entry) / "nvidia" / "cu12" / "include") if p.is_dir()]
    return ([str(nvcc), "-ptx", f"-arch=sm_{arch}", "-std=c++20", "-O3", "-DENTANGLE_WITH_CUDA"]
            + list(cpp_extension.COMMON_NVCC_FLAGS) + WARNING_FLAGS + [f"-I{d}" for d in includes]
            + [str(src), "-o", str(out)])


def _our_warnings(output, ours):
    """Warning lines of compiler output that name a file under `ours`, plus every ptxas warning
    (ptxas assembles our translation unit only)."""
    found = []
    for line in output.splitlines():
        if "warning" not in line.lower():
            continue
        if line.startswith("ptxas"):
            found.append(line)
            continue
        m = _DIAG_FILE.match(line)
        if m and Path(m.group("file")).resolve().is_relative_to(ours):
            found.append(line)
    return found


def _compile(tools, src, arch, tmp):
    nvcc, ptxas = tools
    ptx = Path(tmp) / f"{src.stem}.sm_{arch}.ptx"
    front = subprocess.run(_nvcc_command(nvcc, src, arch, ptx), capture_output=True, text=True)
    out = front.stdout + front.stderr
    if front.returncode == 0:
        back = subprocess.run([str(ptxas), f"-arch=sm_{arch}", str(ptx), "-o", os.devnull],
                              capture_output=True, text=True)
        out += back.stdout + back.stderr
        if back.returncode != 0:
            return False, out
    return front.returncode == 0, out


@pytest.fixture(scope="module")
def nvcc_outputs(tmp_path_factory):
    tools = _cuda_toolkit()
    if tools is None or torch.version.cuda is None:
        pytest.skip("needs nvcc/ptxas and a CUDA build of torch (for the ATen CUDA headers)")
    tmp = tmp_path_factory.mktemp("nvcc")
    jobs = [(src, arch) for src in CUDA_SOURCES for arch in ARCHS]
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = pool.map(lambda job: _compile(tools, job[0], job[1], tmp), jobs)
        return {(src.name, arch): res for (src, arch), res in zip(jobs, results)}


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: f"sm_{a}")
@pytest.mark.parametrize("source", [p.name for p in CUDA_SOURCES])
def test_cuda_sources_compile_without_warnings(nvcc_outputs, source, arch):
    ok, output = nvcc_outputs[(source, arch)]
    assert ok, f"{source} does not compile for sm_{arch}:\n{output[-6000:]}"
    ours = _our_warnings(output, ROOT / "csrc")
    assert not ours, f"{source}, sm_{arch}: {len(ours)} warnings in our sources:\n" + "\n".join(ours)


def test_compile_without_warnings_check_catches_planted_warnings(tmp_path):
    tools = _cuda_toolkit()
    if tools is None or torch.version.cuda is None:
        pytest.skip("needs nvcc/ptxas and a CUDA build of torch")
    src = tmp_path / "planted.cu"
    src.write_text("__global__ void k(float* x) { int unused = 0; x[0] = 1.0f; }\n"
                   "void launch(float* x) { k<<<1, 1>>>(x); }\n")
    ok, output = _compile(tools, src, "90", tmp_path)
    assert ok, output
    ours = _our_warnings(output, tmp_path)
    assert any("unused" in w for w in ours), output          # EDG: declared but never referenced
    assert any("stream" in w.lower() for w in ours), output  # --Wdefault-stream-launch
    assert not _our_warnings(output, ROOT / "csrc")           # other files' warnings are not ours


def test_cuda_home_is_the_root_nvcc_reports_through_a_wrapper(tmp_path, monkeypatch):
    """A wrapper `nvcc` on PATH outside the toolkit (as on machines whose /usr/local/bin/nvcc is a
    shell script): CUDA_HOME is the root that nvcc's dry run reports, not the wrapper's parent."""
    from entangle_ext import _build
    root = tmp_path / "toolkit"
    (root / "include").mkdir(parents=True)
    (root / "include" / "cuda_runtime.h").write_text("")
    (root / "bin").mkdir()
    (root / "bin" / "nvcc").write_text("#!/bin/sh\necho '#$ TOP=" + str(root / "bin") + "/..' >&2\n")
    wrapper_dir = tmp_path / "wrapper" / "bin"
    wrapper_dir.mkdir(parents=True)
    (wrapper_dir / "nvcc").write_text(f"#!/bin/sh\nexec {root / 'bin' / 'nvcc'} \"$@\"\n")
    for f in (root / "bin" / "nvcc", wrapper_dir / "nvcc"):
        f.chmod(0o755)
    for var in ("CUDA_HOME", "CUDA_PATH"):   # set then deleted: monkeypatch restores what was there,
        monkeypatch.setenv(var, "")           # also after locate_cuda_home sets CUDA_HOME itself
        monkeypatch.delenv(var)
    monkeypatch.setenv("PATH", f"{wrapper_dir}:/usr/bin:/bin")
    assert _build.locate_cuda_home() == str(root)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("CUDA_HOME")
    if shutil.which("nvcc") is None:
        assert _build.locate_cuda_home() is None


def test_the_makefile_rebuilds_after_a_change_to_any_native_source():
    """`make build` / `make demo` rebuild only when a file of NATIVE_SRC is newer than their stamp;
    csrc/registration.cpp (and the csrc/cpu/*.h, csrc/cuda/*.cuh headers) were not in it, so a
    change there left the old extension in place."""
    text = (REPO_ROOT / "Makefile").read_text()
    line = re.search(r"^NATIVE_SRC\s*:=\s*\$\(wildcard ([^)]*)\)", text, re.M)
    assert line, "no NATIVE_SRC := $(wildcard ...) line in the Makefile"
    covered = {p for pattern in line.group(1).split() for p in REPO_ROOT.glob(pattern)}
    sources = {p for p in (REPO_ROOT / "csrc").rglob("*") if p.is_file()
               and p.suffix in (".h", ".cuh", ".cpp", ".cu", ".txt")}
    assert sources, "no native sources found under csrc/"
    assert sorted(str(p.relative_to(REPO_ROOT)) for p in sources - covered) == []


@pytest.mark.parametrize("value,want", [("1", True), (" On ", True), ("yes", True), ("", False), ("0", False),
                                        ("off", False), ("FALSE", False), ("maybe", None), ("2", None)])
def test_a_build_switch_takes_on_off_values_and_refuses_others(monkeypatch, value, want):
    """ENTANGLE_CPU_ONLY=maybe (or FORCE_CUDA=2, ENTANGLE_NO_JIT=maybe) was read as off without a
    word, so a CPU-only wish compiled the CUDA kernels and a no-JIT wish compiled at import."""
    from entangle_ext import _build
    monkeypatch.setenv("ENTANGLE_CPU_ONLY", value)
    if want is None:
        with pytest.raises(ValueError, match=rf"environment variable ENTANGLE_CPU_ONLY={value!r} is not a switch "
                                             r"value: set it to 1 \(also true/yes/on\) or 0"):
            _build.flag("ENTANGLE_CPU_ONLY")
    else:
        assert _build.flag("ENTANGLE_CPU_ONLY") is want
    monkeypatch.delenv("ENTANGLE_CPU_ONLY")
    assert _build.flag("ENTANGLE_CPU_ONLY") is False


class _Torch:
    """A stand-in for the torch module: its version and CUDA version."""
    def __init__(self, cuda):
        self.__version__, self.version = "2.14.1", type("V", (), {"cuda": cuda})()


@pytest.mark.parametrize("cuda", ["13.0", None])
def test_want_cuda_reads_both_switches_whatever_the_build(monkeypatch, tmp_path, cuda):
    """FORCE_CUDA=perhaps was not read with a CUDA torch and nvcc (it built the CUDA kernels
    without a word), nor under ENTANGLE_CPU_ONLY=1; ENTANGLE_CPU_ONLY=1 wins over FORCE_CUDA=1
    (``make demo`` sets it whatever the environment holds)."""
    from entangle_ext import _build
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").touch()
    monkeypatch.delenv("ENTANGLE_CPU_ONLY", raising=False)
    monkeypatch.setenv("FORCE_CUDA", "perhaps")
    with pytest.raises(ValueError, match="environment variable FORCE_CUDA='perhaps' is not a switch value"):
        _build.want_cuda(_Torch(cuda), str(tmp_path))
    monkeypatch.setenv("ENTANGLE_CPU_ONLY", "1")
    with pytest.raises(ValueError, match="FORCE_CUDA='perhaps'"):
        _build.want_cuda(_Torch(cuda), str(tmp_path))
    for force in ("1", "0"):
        monkeypatch.setenv("FORCE_CUDA", force)
        assert _build.want_cuda(_Torch(cuda), str(tmp_path)) is False
    monkeypatch.delenv("ENTANGLE_CPU_ONLY")
    assert _build.want_cuda(_Torch(cuda), str(tmp_path)) is (cuda is not None)
