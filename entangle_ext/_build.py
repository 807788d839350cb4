"""How the native extension is compiled: the one home of its sources, flags and CUDA decision,
used by ``setup.py`` (ahead of time, ``pip install --no-build-isolation .``) and by `_jit` (at
the first import after a plain ``pip install .``).

Importable without torch (``setup.py`` loads this file by path, before it knows whether torch is
there); every function that needs torch takes it as an argument.

Switches (environment variables): ``ENTANGLE_CPU_ONLY=1`` (CPU kernels only), ``FORCE_CUDA=1``
(insist on the CUDA kernels), ``TORCH_CUDA_ARCH_LIST`` (default `DEFAULT_ARCH_LIST` without a
visible GPU), ``CUDA_HOME``, ``ENTANGLE_NO_OPENMP=1``, ``MAX_JOBS``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

__all__ = ["DEFAULT_ARCH_LIST", "BuildError", "flag", "locate_cuda_home", "read_sources", "want_cuda",
           "cuda_arch_list", "nvidia_include_dirs", "openmp_flags", "compile_flags"]

DEFAULT_ARCH_LIST = "8.0;9.0+PTX"
"""CUDA architectures compiled when no GPU is visible and TORCH_CUDA_ARCH_LIST is unset (A100,
H100/H200; PTX for newer GPUs)."""


class BuildError(RuntimeError):
    """The extension cannot be built as asked (e.g. FORCE_CUDA=1 with a CPU torch, a CUDA torch
    without nvcc); the message names the fix."""


FLAG_ON = ("1", "true", "yes", "on")
FLAG_OFF = ("", "0", "false", "no", "off")


def flag(name: str) -> bool:
    """The switch the environment variable ``name`` sets: True for 1/true/yes/on, False when unset,
    empty or 0/false/no/off (any case, surrounding blanks ignored).

    Raises:
        ValueError: any other value (e.g. ``ENTANGLE_CPU_ONLY=maybe``), naming the variable and the
            accepted values: read as "off", it would silently build or compile what it was set to
            prevent.
    """
    value = os.environ.get(name, "")
    word = value.strip().lower()
    if word in FLAG_ON:
        return True
    if word in FLAG_OFF:
        return False
    raise ValueError(f"environment variable {name}={value!r} is not a switch value: set it to 1 (also "
                     f"true/yes/on) or 0 (also false/no/off), or unset it")


def _nvcc_top(nvcc: str) -> Optional[Path]:
    """The toolkit root that ``nvcc`` itself reports (``#$ TOP=...`` of a dry run, which prints
    the real root even when ``nvcc`` on PATH is a wrapper script); None when it reports none."""
    try:
        out = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in (out.stdout + out.stderr).splitlines():
        key, _, value = line.removeprefix("#$ ").partition("=")
        if key.strip() == "TOP" and value.strip():
            return Path(value.strip().strip('"')).resolve()
    return None


def locate_cuda_home() -> Optional[str]:
    """Point CUDA_HOME at the real toolkit root (bin/nvcc and include/cuda_runtime.h) before
    torch.utils.cpp_extension guesses it: torch derives it from the first `nvcc` on PATH, and a
    wrapper script in a bin directory outside the toolkit gives a root without libcudart. The root
    is the one the first `nvcc` on PATH reports (`_nvcc_top`), else the directory above the
    resolved nvcc's bin/. Returns it, or None (no toolkit found)."""
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = shutil.which("nvcc")
    if not nvcc:
        return None
    for root in (_nvcc_top(nvcc), Path(os.path.realpath(nvcc)).parent.parent):
        if root is not None and (root / "include" / "cuda_runtime.h").exists() and (root / "bin" / "nvcc").exists():
            os.environ["CUDA_HOME"] = str(root)
            return str(root)
    return None


def read_sources(csrc: Path) -> List[str]:
    """The native sources listed in ``csrc/sources.txt`` (paths relative to the directory above
    ``csrc``; the one list, also read by CMakeLists.txt)."""
    lines = (Path(csrc) / "sources.txt").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def want_cuda(torch, cuda_home: Optional[str]) -> bool:
    """Whether to build the CUDA kernels: yes when ``torch`` is a CUDA build (torch.version.cuda)
    and a toolkit (nvcc) is found, whether or not a GPU is present; ENTANGLE_CPU_ONLY=1 says no.

    Raises:
        BuildError: FORCE_CUDA=1 with a CPU build of torch; a CUDA build of torch without nvcc
            (unless ENTANGLE_CPU_ONLY=1, which wins over FORCE_CUDA=1: ``make demo`` sets it).
        ValueError: a value of ENTANGLE_CPU_ONLY or FORCE_CUDA that is not a switch (`flag`; both
            are read whatever the other says: FORCE_CUDA=perhaps was not looked at with a CUDA torch).
    """
    cpu_only, force = flag("ENTANGLE_CPU_ONLY"), flag("FORCE_CUDA")
    if cpu_only:
        return False
    if torch.version.cuda is None:
        if force:
            raise BuildError(f"FORCE_CUDA=1 but the installed torch ({torch.__version__}) is a CPU-only build")
        return False
    if cuda_home is None or not Path(cuda_home, "bin", "nvcc").exists():
        raise BuildError(f"torch {torch.__version__} is a CUDA {torch.version.cuda} build but no CUDA toolkit "
                         "(nvcc) was found. Install the toolkit and set CUDA_HOME, or build the CPU kernels "
                         "only with ENTANGLE_CPU_ONLY=1.")
    return True


def cuda_arch_list(torch) -> str:
    """TORCH_CUDA_ARCH_LIST, set to `DEFAULT_ARCH_LIST` when unset and no GPU is visible (torch
    would otherwise target every architecture it knows, some of which nvcc 13 rejects)."""
    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
        os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_ARCH_LIST
    return os.environ.get("TORCH_CUDA_ARCH_LIST", "native")


def nvidia_include_dirs() -> List[str]:
    """Headers (cuBLAS, cuSPARSE, ...) that ATen/cuda/CUDAContext.h includes, which pip's nvidia
    wheels ship under site-packages/nvidia/cu13/include when the system toolkit lacks them."""
    dirs = []
    for entry in sys.path:
        for sub in ("nvidia/cu13/include", "nvidia/cu12/include"):
            p = Path(entry) / sub
            if p.is_dir():
                dirs.append(str(p))
    return dirs


def openmp_flags(torch) -> List[str]:
    """["-fopenmp"] when torch's ATen parallel backend is OpenMP (the Linux/Windows wheels), else []
    (e.g. macOS builds without libomp). ENTANGLE_NO_OPENMP=1 turns it off. at::parallel_for is an
    inline template: it runs threads inside our library only when our own translation units are
    compiled with OpenMP, as torch itself is."""
    if flag("ENTANGLE_NO_OPENMP") or sys.platform == "darwin":
        return []
    return ["-fopenmp"] if "OpenMP" in torch.__config__.parallel_info() else []


def _string_define(name: str, value: str, shell_escaped: bool) -> str:
    """``-DNAME="value"``: as setup.py's build passes it (quoted for us), or with the quotes and
    shell metacharacters escaped for torch.utils.cpp_extension.load, whose ninja file hands the
    flags to a shell as written."""
    if not shell_escaped:
        return f'-D{name}="{value}"'
    value = "".join("\\" + c if c in ";&|<>()$`\\\"' *?[]#~=%" else c for c in value)
    return f'-D{name}=\\"{value}\\"'


def compile_flags(torch, version: str, cuda: bool, arch: str = "", *,
                  shell_escaped: bool = False) -> Dict[str, List[str]]:
    """{"cxx": [...], "nvcc": [...], "ldflags": [...]} for the extension, with the build-information
    macros ENTANGLE_VERSION, ENTANGLE_TORCH_VERSION and (CUDA) ENTANGLE_CUDA_ARCH_LIST that
    csrc/registration.cpp reports (``shell_escaped``: see `_string_define`). nvcc: diagnostics
    numbered (to name them), plus the two warnings that guard the kernels' contracts (a launch
    without an explicit stream, reordered member initialisers; tests/build/test_build.py checks with
    the same flags)."""
    defines = [_string_define("ENTANGLE_VERSION", version, shell_escaped),
               _string_define("ENTANGLE_TORCH_VERSION", torch.__version__, shell_escaped)]
    if cuda:
        defines += ["-DENTANGLE_WITH_CUDA", _string_define("ENTANGLE_CUDA_ARCH_LIST", arch, shell_escaped)]
    omp = openmp_flags(torch)
    nvcc = ["-O3", "-lineinfo", "-Xcudafe", "--display_error_number", "--Wdefault-stream-launch",
            "--Wreorder"] + defines
    return {"cxx": ["-O3"] + omp + defines, "nvcc": nvcc if cuda else [], "ldflags": omp}
