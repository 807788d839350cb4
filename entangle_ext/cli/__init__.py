"""Command line: run a registered setting end to end (original model → unlearning method → report).

    entangle-unlearn --setting digits --out runs/digits                  # the two-stage method
    entangle-unlearn --setting digits --method salun --out runs/salun    # a baseline, its paper_code preset
    entangle-unlearn --setting digits --method scrub --hparams original --set epochs=3 --out runs/scrub
    entangle-unlearn --setting digits --method no_w2 --out runs/no_w2    # an ablation of the method
    entangle-unlearn --setting digits --forget 5 --set stage2.lr=1e-3 --out runs/digits5
    python -m entangle_ext --setting cifar100 --variant reduced --out runs/cifar
    python -m entangle_ext --setting cifar100 --data-root path/to/cifar100.npz --out runs/cifar \\
        --superclasses fish,flowers,insects --max-train-per-class 100 --original-epochs 5 --epochs 2
    python -m entangle_ext --setting tinyimagenet --weights vit_b_32.pth --out runs/tin   # also celeba
    python -m entangle_ext --setting toxigen --model-path path/to/hf_model_dir --out runs/toxigen
    torchrun --nproc_per_node 4 -m entangle_ext --setting cifar100 --out runs/cifar   # 4 ranks, global batches

The settings, their variants and options come from the registry `entangle_ext.settings`; the flags
below are mapped onto it by the tables `OPTION_FLAGS` and `STAGE_FLAGS` (``entangle_ext/cli/config.py``),
and ``--set KEY=VALUE`` reaches any other field of the chosen method's config; a setting flag the
setting does not take (e.g. ``--weights`` with digits) is refused, naming the settings that take it. ``--method`` is any
name of `entangle_ext.available_methods()` and runs through ``entangle_ext.unlearn(...,
method=NAME)`` with the config its ``resolve_config`` gives it (``entangle_ext/unlearn/method.py``;
the same config ``from entangle_ext.compare import method_config`` names; docs/algorithm.md §10); the stage flags (``--alpha``, ``--epochs``, ...) configure the two-stage
family only. The whole configuration (method, flag values, options, device, resume and
original-model files) is checked before any data is loaded or model trained: bad input prints one
``entangle-unlearn: error: ...`` line and exits with code 2 (so does a single-valued flag given twice
with two values, ``--seed 1 --seed 2``: `common.Parser`, the parser of both commands).

Reusing an ``--out`` that holds a run without ``--resume`` replaces it, after a one-line
warning (the old run's report, plots, selected model and checkpoints are removed); an ``--out`` that another live run is writing (its lock ``OUT/.entangle_ext.lock`` is
held) is refused with a one-line error naming that run (exit code 2). ``--resume`` continues a
run with the same ``--method``, data and configuration: another method, or another configuration
without ``--allow-config-change``, is refused before any data is loaded; other data once the data
is known (the same checks as ``entangle_ext.unlearn``). The resumed run keeps its own original
model (its evaluations are in the checkpoint): another one, made by other ``--original`` /
``--original-epochs`` / ``--set train.*`` / ``--seed`` flags or trained anew elsewhere, gets a warning
and no original-model entry in report.json. ``--original`` with ``--original-epochs`` or ``--set
train.*`` (which would train the model it loads) exits 2.

Writes ``report.json`` (with a "run" section: method, hparams, setting, variant, options,
original-model file and the split fingerprint), ``history.json``, ``forget_loss_hist.png``, ``checkpoints/`` and the cached
original model ``original_*.pt`` (its name hashes everything that produced it, see
`entangle_ext.settings.prepare`; ``--original PATH`` uses a given file instead) under ``--out``.

Modules: ``run.py`` (one run: the flags above), ``compare.py`` (``entangle-unlearn compare``), ``config.py``
(flags → the method's config) and ``common.py`` (devices, one-line errors, signals).
"""
from __future__ import annotations

import sys

from .common import default_device, device_arg, exit_on_bad_input
from .config import OPTION_FLAGS, STAGE_FLAGS, parse_overrides
from .run import build_parser

__all__ = ["main", "build_parser", "exit_on_bad_input", "OPTION_FLAGS", "STAGE_FLAGS", "default_device",
           "device_arg", "parse_overrides"]


def main(argv=None) -> int:
    """Entry point of ``entangle-unlearn`` / ``python -m entangle_ext`` (the console script
    ``entangle_ext.cli:main``): ``compare ...`` runs ``entangle_ext/cli/compare.py``, anything else
    one run (``entangle_ext/cli/run.py``). ``argv``: the arguments (None: ``sys.argv[1:]``).
    Returns the exit code: 0 success; 2 bad input (one ``entangle-unlearn: error: ...`` line on
    stderr, before any training when the flags are at fault); 128 + the signal's number when
    interrupted (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP; the resume command is printed)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["compare"]:
        from .compare import main as compare_main
        return compare_main(argv[1:])
    from .run import main as run_main
    return run_main(argv)


if __name__ == "__main__":
    sys.exit(main())
