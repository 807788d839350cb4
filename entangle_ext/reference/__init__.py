"""Pure-PyTorch reference implementations of every entangle_ext operator.

They are the float64 oracles of the tests and the documented fallback when the native extension is
not built: same arguments (the kernel-only ``max_seqlen``, ``validate``, ``check_finite`` taken and
ignored; ``process_group`` None only) and results as the operators, plain PyTorch ops, no compiled code.
"""
from .wasserstein import wasserstein2_1d, wasserstein2_1d_sorted
from .augmented_lagrangian import augmented_lagrangian_term, dual_update_
from .projection import (project_orthogonal, project_orthogonal_, project_orthogonal_flat_composite,
                         project_orthogonal_loop, projection_apply_, projection_gram, projection_solve)

__all__ = ["wasserstein2_1d", "wasserstein2_1d_sorted", "augmented_lagrangian_term", "dual_update_",
           "project_orthogonal", "project_orthogonal_", "project_orthogonal_flat_composite",
           "project_orthogonal_loop", "projection_gram", "projection_apply_", "projection_solve"]
