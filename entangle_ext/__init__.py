"""entangle_ext: machine unlearning under retain-forget entanglement (Cheng et al., ICLR 2026).

Operators (CPU and CUDA kernels registered as ``torch.ops.entangle_ext.*``, with autograd):

* `wasserstein2_1d` - exact 1-D Wasserstein-2 between empirical distributions, by segmented sort.
* `project_orthogonal` / `project_orthogonal_` - fused low-rank orthogonal gradient projection
  g - V^T (V V^T)^+ V g (flat, or in place over a parameter list without flattening); its two
  passes `projection_gram` / `projection_apply_` and `projection_solve` for sharded gradients.
* `dual_update_` - in-place augmented-Lagrangian multiplier step (Stage 1), no host sync.
* `augmented_lagrangian_term` - the augmented-Lagrangian penalty term, fused forward/backward.

`AugmentedLagrangian` (entangle_ext.lagrangian) holds the Stage-1 multiplier state and schedule.

The run (docs/algorithm.md §2-§3, §11 for torch.distributed): `unlearn(model, splits, config)`,
`stage1`, `stage2`, `evaluate`, configured by `UnlearnConfig.preset(...)`; the baselines and
ablations of `entangle_ext.methods` through ``unlearn(..., method=name)`` and `compare` (several
methods and seeds from one original model, §10); the paper settings in `entangle_ext.settings`;
CLI `python -m entangle_ext` / `entangle-unlearn` (also under ``torchrun``; ``compare`` subcommand).
The exceptions a run raises for the caller to catch, `NonFiniteLossError` (a ValueError) and
`RunInterrupted` (a KeyboardInterrupt), `OutDirInUseError` (a ValueError: another live run
holds the out dir), `NonFiniteOutputError` (a ValueError: the per-sample scoring of the metrics and
`compare`, `per_sample`, met NaN/Inf logits),
`WriteError` (an OSError: a file could not be written), every warning class of the package
(`OutDirReusedWarning`, `MIAUndefinedWarning` of a metric without signal, `SelectionWarning` of
a ``select`` that kept no state, `OverlappingSplitsWarning`, `BatchLargerThanSplitWarning`,
`PlotSkippedWarning`, `DataDirWarning`, `CacheNotWrittenWarning`; filter them with
``warnings.filterwarnings("ignore", category=entangle_ext.X)``), and `available_methods` are
importable from here.

Note: ``entangle_ext.unlearn`` and ``entangle_ext.compare`` are the functions, which hide the
subpackage/module of the same name as attributes; import from those by name instead, e.g.
``from entangle_ext.unlearn import load_checkpoint`` or ``from entangle_ext.compare import method_config``.

Pure-PyTorch references of every operator are in `entangle_ext.reference`.
Build information: `cuda_built()`, `cuda_arch_list()`, `available()`, `load_error()`, `build_route()`
("ahead-of-time" or "first-import": a plain ``pip install .`` compiles at the first import), `build_path()`.
"""
from ._version import __version__
from ._ext import available, build_path, build_route, built_torch_version, cuda_arch_list, cuda_built, load_error
from . import reference
from .wasserstein import wasserstein2_1d
from .augmented_lagrangian import augmented_lagrangian_term, dual_update_
from .lagrangian import AugmentedLagrangian
from .projection import (project_orthogonal, project_orthogonal_, projection_apply_, projection_gram,
                         projection_solve)
from .unlearn import (NonFiniteLossError, OutDirInUseError, OutDirReusedWarning, RunInterrupted, SelectionWarning,
                      Splits, Stage1Config, Stage2Config,
                      UnlearnConfig, UnlearnResult, evaluate, stage1, stage2, unlearn)
from . import methods as _methods  # noqa: F401,E402  (importing it registers every method, from above the run)
from .compare import available_methods, compare
from .unlearn.mia import MIAUndefinedWarning
from .unlearn.disjoint import OverlappingSplitsWarning
from .unlearn.data import BatchLargerThanSplitWarning
from .unlearn.report import PlotSkippedWarning
from .unlearn.files import WriteError
from .unlearn.evaluate import NonFiniteOutputError
from .data.root import DataDirWarning
from .train import CacheNotWrittenWarning

__all__ = [
    "__version__", "available", "built_torch_version", "cuda_arch_list", "cuda_built", "load_error",
    "build_route", "build_path",
    "reference", "wasserstein2_1d", "project_orthogonal", "project_orthogonal_", "projection_gram",
    "projection_apply_", "projection_solve", "dual_update_",
    "augmented_lagrangian_term", "AugmentedLagrangian",
    "unlearn", "Splits", "UnlearnConfig", "Stage1Config", "Stage2Config", "UnlearnResult",
    "stage1", "stage2", "evaluate", "compare", "available_methods", "NonFiniteLossError", "RunInterrupted",
    "OutDirReusedWarning", "OutDirInUseError", "MIAUndefinedWarning", "SelectionWarning",
    "OverlappingSplitsWarning", "BatchLargerThanSplitWarning", "PlotSkippedWarning", "WriteError",
    "NonFiniteOutputError", "DataDirWarning", "CacheNotWrittenWarning",
]
