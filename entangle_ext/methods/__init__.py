"""Unlearning methods for comparison (docs/algorithm.md §10): the baselines Retrain, FT, GA,
NegGrad+, RL, ℓ1-sparse, SalUn, SCRUB, SSD, GDR-GMA, MUNBa and DELETE, and the two-stage family
(two_stage and the ablations no_w2, pgd_mean, stage1_only, two_stage_basis4), one registry.

    import entangle_ext
    from entangle_ext.methods import available_methods, get_method
    result = entangle_ext.unlearn(model, splits, method="salun", setting="cifar100")   # paper_code preset
    available_methods()                              # every name
    get_method("scrub").presets["celeba"]["original"]   # field overrides of SCRUBConfig()
"""
from .base import (HPARAMS, METHODS, MethodConfig, TrainConfig, UnlearningMethod, available_methods,
                   get_method, register_method)
from ..unlearn.run import run_method
# importing the method modules registers them, in this order
from . import retrain, ft, ga, neggrad_plus, rl, l1_sparse, salun, scrub, ssd, gdr, munba, delete  # noqa: F401,E402
from . import two_stage  # noqa: F401,E402

__all__ = ["METHODS", "HPARAMS", "MethodConfig", "TrainConfig", "UnlearningMethod", "available_methods",
           "get_method", "register_method", "run_method"]
