"""Build script of entangle_ext (torch.utils.cpp_extension).

Build switches (environment variables):
  ENTANGLE_CPU_ONLY=1   build the CPU kernels only, even with a CUDA build of torch.
  FORCE_CUDA=1          build the CUDA kernels too (needs a CUDA build of torch and nvcc).
  TORCH_CUDA_ARCH_LIST  CUDA architectures; default "8.0;9.0+PTX" when no GPU is visible.
  MAX_JOBS              parallel compile jobs (ninja).
By default the CUDA kernels are built whenever the installed torch is a CUDA build
(torch.version.cuda is set), whether or not a GPU is present.
"""
import os
import shutil
import sys
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
VERSION = (ROOT / "entangle_ext" / "_version.py").read_text().split("\"")[1]

_NO_TORCH = """
entangle_ext: cannot import torch in the build environment.

This is a PyTorch C++/CUDA extension: it must be compiled against the very torch you will run it
with. pip's default isolated build creates a fresh environment without your torch (or with another
version), and a binary built there would not load. Install torch first, then build without isolation:

    pip install torch
    pip install --no-build-isolation .
"""



def _locate_cuda_home():
    """Point CUDA_HOME at the real toolkit root before torch.utils.cpp_extension guesses it.

    torch derives CUDA_HOME from the directory of the first `nvcc` on PATH; a wrapper script such as
    /usr/local/bin/nvcc then yields /usr/local, which has no libcudart, and linking fails.
    """
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return
    candidates = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(os.path.realpath(nvcc)).parent.parent)
    candidates.append(Path("/usr/local/cuda"))
    for root in candidates:
        if (root / "include" / "cuda_runtime.h").exists() and (root / "bin" / "nvcc").exists():
            os.environ["CUDA_HOME"] = str(root)
            return


_locate_cuda_home()

try:
    import torch
    from torch.utils import cpp_extension
except ImportError:  # pragma: no cover - exercised only by isolated builds
    sys.exit(_NO_TORCH)


def _flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def read_sources():
    lines = (ROOT / "csrc" / "sources.txt").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def want_cuda():
    if _flag("ENTANGLE_CPU_ONLY"):
        return False
    if torch.version.cuda is None:
        if _flag("FORCE_CUDA"):
            sys.exit("entangle_ext: FORCE_CUDA=1 but the installed torch "
                     f"({torch.__version__}) is a CPU-only build.")
        return False
    if cpp_extension.CUDA_HOME is None or not Path(cpp_extension.CUDA_HOME, "bin", "nvcc").exists():
        sys.exit(f"entangle_ext: torch {torch.__version__} is a CUDA {torch.version.cuda} build but no "
                 "CUDA toolkit (nvcc) was found. Install the toolkit and set CUDA_HOME, or build the "
                 "CPU kernels only with ENTANGLE_CPU_ONLY=1.")
    return True


def nvidia_include_dirs():
    """Headers (cuBLAS, cuSPARSE, ...) that ATen/cuda/CUDAContext.h includes, which pip's nvidia
    wheels ship under site-packages/nvidia/cu13/include when the system toolkit lacks them."""
    dirs = []
    for entry in sys.path:
        for sub in ("nvidia/cu13/include", "nvidia/cu12/include"):
            p = Path(entry) / sub
            if p.is_dir():
                dirs.append(str(p))
    return dirs


def openmp_flags():
    """["-fopenmp"] when torch's ATen parallel backend is OpenMP (the Linux/Windows wheels), else []
    (e.g. macOS builds without libomp). ENTANGLE_NO_OPENMP=1 turns it off."""
    if _flag("ENTANGLE_NO_OPENMP") or sys.platform == "darwin":
        return []
    info = torch.__config__.parallel_info()
    return ["-fopenmp"] if "OpenMP" in info else []


def extensions():
    sources = read_sources()
    cuda = want_cuda()
    cpp = [s for s in sources if s.endswith(".cpp")]
    cu = [s for s in sources if s.endswith(".cu")]
    defines = [
        f'-DENTANGLE_VERSION="{VERSION}"',
        f'-DENTANGLE_TORCH_VERSION="{torch.__version__}"',
    ]
    # OpenMP: at::parallel_for is an inline template, so it runs threads inside our .so only when
    # our own translation units are compiled with OpenMP, as torch itself is (libgomp with GCC).
    omp = openmp_flags()
    cxx = ["-O3"] + omp + defines
    if not cuda:
        return [cpp_extension.CppExtension("entangle_ext._C", cpp, extra_compile_args={"cxx": cxx},
                                           extra_link_args=omp)]
    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
        os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0;9.0+PTX"
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "native")
    defines += ["-DENTANGLE_WITH_CUDA", f'-DENTANGLE_CUDA_ARCH_LIST="{arch}"']
    cxx = ["-O3"] + omp + defines
    # Diagnostics numbered (to name them), plus two warnings that guard the kernels' contracts: a
    # launch without an explicit stream, reordered member initialisers. The same flags are used by
    # the warning check in tests/test_build.py.
    nvcc = ["-O3", "-lineinfo", "-Xcudafe", "--display_error_number", "--Wdefault-stream-launch",
            "--Wreorder"] + defines
    print(f"entangle_ext: building CPU + CUDA kernels (torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}, TORCH_CUDA_ARCH_LIST={arch})", flush=True)
    return [cpp_extension.CUDAExtension(
        "entangle_ext._C", cpp + cu,
        include_dirs=nvidia_include_dirs(),
        extra_compile_args={"cxx": cxx, "nvcc": nvcc}, extra_link_args=omp)]


setup(
    name="entangle_ext",
    version=VERSION,
    packages=find_packages(include=["entangle_ext", "entangle_ext.*"]),
    ext_modules=extensions(),
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
)
