"""The two-stage unlearning method (docs/algorithm.md §2, §3): `unlearn`, `stage1`, `stage2`,
`evaluate`, their configuration, checkpoints and the shared stage loop."""
from .checkpoint import load_checkpoint, seed_everything
from .config import PRESETS, RECIPES, Stage1Config, Stage2Config, UnlearnConfig
from .data import Splits
from .disjoint import OverlappingSplitsWarning
from .data import BatchLargerThanSplitWarning
from .curves import SelectionWarning
from .entry import OutDirReusedWarning, UnlearnResult, unlearn
from .evaluate import evaluate
from .lock import OutDirInUseError
from .loop import NonFiniteLossError, RunInterrupted, StageLoop, StageResult
from .report import format_table, plot_forget_histograms
from .stage1_al import stage1
from .stages import stage2

__all__ = ["unlearn", "Splits", "UnlearnConfig", "Stage1Config", "Stage2Config", "UnlearnResult",
           "stage1", "stage2", "evaluate", "format_table", "plot_forget_histograms",
           "NonFiniteLossError", "RunInterrupted", "OutDirReusedWarning", "OutDirInUseError",
           "StageResult", "StageLoop",
           "load_checkpoint", "seed_everything", "PRESETS", "RECIPES", "OverlappingSplitsWarning",
           "BatchLargerThanSplitWarning", "SelectionWarning"]
