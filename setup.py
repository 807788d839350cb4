"""Build script of entangle_ext. Two routes, chosen by whether torch is importable here:

* ahead of time (``pip install --no-build-isolation .``, ``make build``): torch is importable,
  so the native extension ``entangle_ext._C`` is compiled now against that torch
  (torch.utils.cpp_extension);
* at the first import (plain ``pip install .``): pip's isolated build environment has no torch
  (and must not compile against another one than the user's), so the package ships its C++/CUDA
  sources as ``entangle_ext/_csrc`` and `entangle_ext._jit` compiles them against the installed
  torch on the first ``import entangle_ext``, into a versioned cache directory.

Both routes ship the sources. Build switches (environment variables) are listed in
entangle_ext/_build.py, the one home of the sources, flags and the CUDA decision.
"""
import importlib.util
import shutil
import sys
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
VERSION = (ROOT / "entangle_ext" / "_version.py").read_text().split("\"")[1]


def _load_build_module():
    """entangle_ext/_build.py by path: importing the package would import torch."""
    spec = importlib.util.spec_from_file_location("_entangle_build", ROOT / "entangle_ext" / "_build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


B = _load_build_module()
CUDA_HOME = B.locate_cuda_home()   # before torch.utils.cpp_extension reads it

try:
    import torch
    from torch.utils import cpp_extension
except ImportError:   # pip's isolated build: ship the sources, compile at the first import
    torch = None
    print("entangle_ext: torch is not importable in this build environment (pip's build isolation); "
          "installing the sources: the kernels are compiled against your torch at the first "
          "`import entangle_ext` (or build now with `pip install --no-build-isolation .`)", flush=True)


class BuildPyWithSources(build_py):
    """build_py that also copies csrc/ into the package as entangle_ext/_csrc (for `_jit`)."""

    def run(self):
        super().run()
        dest = Path(self.build_lib) / "entangle_ext" / "_csrc"
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(ROOT / "csrc", dest)


def extensions():
    if torch is None:
        return []
    try:
        cuda = B.want_cuda(torch, cpp_extension.CUDA_HOME)
    except B.BuildError as e:
        sys.exit(f"entangle_ext: {e}")
    sources = B.read_sources(ROOT / "csrc")
    cpp = [s for s in sources if s.endswith(".cpp")]
    if not cuda:
        f = B.compile_flags(torch, VERSION, cuda=False)
        return [cpp_extension.CppExtension("entangle_ext._C", cpp, extra_compile_args={"cxx": f["cxx"]},
                                           extra_link_args=f["ldflags"])]
    arch = B.cuda_arch_list(torch)
    f = B.compile_flags(torch, VERSION, cuda=True, arch=arch)
    print(f"entangle_ext: building CPU + CUDA kernels (torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}, TORCH_CUDA_ARCH_LIST={arch})", flush=True)
    return [cpp_extension.CUDAExtension(
        "entangle_ext._C", cpp + [s for s in sources if s.endswith(".cu")],
        include_dirs=B.nvidia_include_dirs(),
        extra_compile_args={"cxx": f["cxx"], "nvcc": f["nvcc"]}, extra_link_args=f["ldflags"])]


cmdclass = {"build_py": BuildPyWithSources}
if torch is not None:
    cmdclass["build_ext"] = cpp_extension.BuildExtension.with_options(use_ninja=True)

setup(
    name="entangle_ext",
    version=VERSION,
    packages=find_packages(include=["entangle_ext", "entangle_ext.*"]),
    ext_modules=extensions(),
    cmdclass=cmdclass,
)
