"""Stage 1 (augmented Lagrangian, docs/algorithm.md §2) and Stage 2 (W-PGD, docs/algorithm.md §3):
the two stage functions and what they share, defined in ``stage1_al.py``, ``stage2_wpgd.py`` and
``stage_common.py`` beside this file and re-exported here.

Each stage is a step function run by `StageLoop` (progress bar, logging, checkpoints, resume,
interrupts). Both keep the model in eval mode (BatchNorm statistics frozen, dropout off) and never
read device values back to the host inside a step: logged scalars stay on the device and are read
every ``log_every`` steps, which is also when non-finite losses are detected. Precision
(float16/bfloat16 models, ``amp``): see ``entangle_ext/unlearn/precision.py``. Under several ranks
(``torchrun``; DDP, FSDP or a plain replicated module) the same steps run on each rank's part of
every global batch with the reductions of ``entangle_ext/unlearn/distributed.py`` (docs/algorithm.md
§11).
"""
from __future__ import annotations

from .loop import NonFiniteLossError, StageResult
from .losses import per_sample_ce, trainable_params
from .stage1_al import stage1
from .stage2_wpgd import stage2
from .stage_common import reference_losses, remote_loss_c0

__all__ = ["stage1", "stage2", "remote_loss_c0", "reference_losses", "NonFiniteLossError",
           "StageResult", "trainable_params", "per_sample_ce"]
