"""The two-stage unlearning driver of method.md: `unlearn`, `stage1`, `stage2`, `evaluate`."""
from .config import PRESETS, RECIPES, Stage1Config, Stage2Config, UnlearnConfig
from .data import Splits
from .driver import UnlearnResult, load_checkpoint, seed_everything, unlearn
from .evaluate import evaluate, format_table, plot_forget_histograms
from .stages import NonFiniteLossError, StageResult, stage1, stage2

__all__ = ["unlearn", "Splits", "UnlearnConfig", "Stage1Config", "Stage2Config", "UnlearnResult",
           "stage1", "stage2", "evaluate", "format_table", "plot_forget_histograms",
           "NonFiniteLossError", "StageResult", "load_checkpoint", "seed_everything", "PRESETS",
           "RECIPES"]
