"""Former name of `entangle_ext.augmented_lagrangian`, kept only for code that still imports it.

New code imports the operators from `entangle_ext` (or `entangle_ext.augmented_lagrangian`).
"""
from .augmented_lagrangian import augmented_lagrangian_term, dual_update_

__all__ = ["dual_update_", "augmented_lagrangian_term"]
