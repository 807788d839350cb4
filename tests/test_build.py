"""The build itself: the native extension loaded, CUDA kernels present whenever torch has CUDA."""
import os

import torch

import entangle_ext as ee


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
