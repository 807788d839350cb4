"""``entangle-unlearn compare``: every method on a registered setting, over seeds, in one table.

    entangle-unlearn compare --setting digits --methods all --seeds 3 --out runs/compare_digits
    python -m entangle_ext compare --setting cifar100 --variant reduced --methods retrain,two_stage,salun

Trains (or loads from ``--out``) the setting's original model with `entangle_ext.settings.prepare`,
then runs `entangle_ext.compare` and prints the markdown table: every method gets the setting's
``--hparams`` preset (docs/algorithm.md §10), the two-stage family the variant's config, and Retrain
a fresh model of the setting trained with the variant's recipe (`entangle_ext.settings`).
``--out`` holds ``comparison.md``, ``comparison.json``, ``comparison.png``, the cached original model
and ``cache/`` (one file per finished (method, seed) run: rerunning the same command resumes where
it stopped; a run made with another ``--budget`` is replaced, as there is one file per method and
seed). ``--jobs N`` runs N (method, seed) runs at a time in worker processes sharing that cache
(`entangle_ext.compare_jobs`; on a CPU, e.g. one worker per core; the queue and the workers' logs
under ``<out>/jobs/`` are removed when every worker succeeded, their warnings printed once each
first, and kept after a failure or interrupt);
``--budget F`` scales every method's epochs by one common factor (``from entangle_ext.compare
import scale_budget``). One live comparison per ``--out``: it is locked (``OUT/.entangle_ext.lock``,
released when the process ends however it ends) and a second comparison, or an
``entangle-unlearn`` run, into a locked dir is refused with a one-line error.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from .._paths import expand_user
from ..threads import check_thread_count
from ..unlearn.files import WriteError
from .common import (Parser, fail, interrupt_exit_code, one_line_warnings, resolve_device, seed_arg, sigterm_interrupts,
                     stop_signals)

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    from ..compare_report import BOLD_BAND
    from ..unlearn.method import HPARAMS, available_methods
    from ..settings import SETTINGS

    variants = sorted({v.name for s in SETTINGS.values() for v in s.variants})
    ap = Parser(prog="entangle-unlearn compare", description="Compare unlearning methods on a "
                "registered setting: mean ± std over seeds (docs/algorithm.md §10).")
    ap.add_argument("--setting", choices=list(SETTINGS), required=True)
    ap.add_argument("--variant", choices=variants, default=None, help="size of the setting (reduced, cpu, lite0 = CPU runs)")
    ap.add_argument("--methods", default="all", help="'all' (default: every method, "
                    f"{len(available_methods())} runs a seed) or a comma list of: " + ", ".join(available_methods())
                    + " (entangle_ext.available_methods())")
    ap.add_argument("--seeds", type=int, default=3, help="number of seeds (default 3; 0 .. N-1, shifted by "
                    "--first-seed)")
    ap.add_argument("--first-seed", type=seed_arg, default=0, help="the first seed of the runs (default 0); every "
                    "seed, up to first + N - 1, is an integer in [-2**63, 2**64 - 1] (torch.manual_seed's range)")
    ap.add_argument("--hparams", choices=HPARAMS, default="paper_code",
                    help="presets: paper_code (the paper's released code; the reference recipe of the two-stage "
                    "family) or original (the baseline authors' defaults; the paper's own recipe)")
    ap.add_argument("--out", type=expand_user, default=None, help="output dir (default runs/compare_<setting>)")
    ap.add_argument("--data-root", type=expand_user, default=None, help="data file or directory (default: $ENTANGLE_DATA, "
                    "the user cache dir, then ../shared/data of a source checkout)")
    ap.add_argument("--weights", type=expand_user, default=None, help="tinyimagenet / celeba: local ViT-B/32 state dict")
    ap.add_argument("--model-path", type=expand_user, default=None, help="toxigen: local Hugging Face model dir")
    ap.add_argument("--model-seed", type=seed_arg, default=0, help="seed of the data selection and original model, "
                    "an integer in [-2**63, 2**64 - 1] (default 0)")
    ap.add_argument("--relearn-steps", type=int, default=None, help="cap of the relearn-time fine-tuning (not with "
                    "--no-relearn)")
    ap.add_argument("--no-relearn", action="store_true", help="skip relearn time")
    ap.add_argument("--mia-max-samples", type=int, default=None, help="cap on the MIA attack's members and "
                    "non-members each (default: all)")
    ap.add_argument("--device", default=None, help="cpu, cuda, cuda:N or mps (default: cuda when available)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads, >= 1 (default: the setting's "
                    "own, else OMP_NUM_THREADS, else the physical cores); the previous count is restored")
    ap.add_argument("--budget", type=float, default=1.0, help="common factor (> 0) of every method's epochs, "
                    "rounded up to whole epochs (default 1 = the presets); said under the table")
    ap.add_argument("--jobs", type=int, default=1, help="(method, seed) runs at a time, each in its own worker "
                    "process with max(1, threads // jobs) torch threads, sharing the per-run cache; at most "
                    "one per run (default 1)")
    ap.add_argument("--bold-band", type=float, default=BOLD_BAND, help="bold only among the methods whose "
                    "adjacent and remote held-out accuracy stay within ± this many points of the original's "
                    f"(default {BOLD_BAND:g}); stated under the table")
    ap.add_argument("--amp", choices=["preset", "none", "bf16", "auto"], default="preset",
                    help="autocast of every method's unlearning runs: preset = the variant's (cifar100/cpu: auto, "
                         "bf16 where the CPU has bfloat16 matrix units; else none), none = the model's dtype")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)   # internal: a --jobs worker's queue dir
    return ap


def _methods(spec: str):
    """The method names of ``--methods`` ('all' or a comma list), checked before any data is loaded
    (``check_method_names`` of the compare module, its message naming the flag)."""
    from ..compare import available_methods, check_method_names

    known = available_methods()
    parts = [m.strip() for m in spec.split(",")]
    if spec.strip() != "all" and any(parts) and not all(parts):
        raise ValueError(f"--methods {spec!r} has an empty entry: give method names separated by single commas "
                         "(or 'all')")
    names = known if spec.strip() == "all" else [m for m in parts if m]
    try:
        return check_method_names(names, known=known)
    except ValueError as e:
        raise ValueError(f"--{e}") from None   # "--methods ..."


def _check_flags(args, out: str) -> None:
    """The flags that need no data, checked before anything is loaded or trained (ValueError)."""
    from ..compare import check_budget
    from ..unlearn.fields import SEED_MAX

    if args.seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
    if args.threads is not None:
        check_thread_count(args.threads, "--threads")
    if args.relearn_steps is not None and args.relearn_steps < 1:
        raise ValueError(f"--relearn-steps must be >= 1, got {args.relearn_steps}")
    if args.no_relearn and args.relearn_steps is not None:
        raise ValueError(f"--relearn-steps {args.relearn_steps} caps the relearn-time fine-tuning, which --no-relearn "
                         "skips: give one of them")
    last = args.first_seed + args.seeds - 1
    if last > SEED_MAX:
        raise ValueError(f"--first-seed {args.first_seed} with --seeds {args.seeds} runs seeds up to {last}, past "
                         f"{SEED_MAX} (torch.manual_seed's range): give a smaller --first-seed")
    if args.mia_max_samples is not None and args.mia_max_samples < 1:
        raise ValueError(f"--mia-max-samples must be >= 1, got {args.mia_max_samples}")
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    if not (math.isfinite(args.bold_band) and args.bold_band >= 0):
        raise ValueError(f"--bold-band must be a finite number of points >= 0, got {args.bold_band}")
    try:
        check_budget(args.budget)
    except (ValueError, TypeError) as e:
        raise ValueError(f"--{e}") from None   # "--budget must be ..."
    if not str(out).strip():
        raise ValueError("--out is empty: give an output directory (or leave the flag out for "
                         "runs/compare_<setting>)")
    if Path(out).exists() and not Path(out).is_dir():
        raise ValueError(f"--out {out} exists and is not a directory")


def _plan(args, out: str):
    """(device, setting, variant, data options, model options, methods, threads), everything
    checked before any data is loaded (ValueError / TypeError / FileNotFoundError / ImportError)."""
    from ..compare import method_spec
    from ..settings import get_setting
    from ..threads import default_threads
    from .config import check_option_flags

    _check_flags(args, out)
    device = resolve_device(args.device)
    setting = get_setting(args.setting)
    opts = {"weights": args.weights, "model_path": args.model_path}
    check_option_flags(setting, opts)   # e.g. --weights with digits: refused, as by entangle-unlearn
    data = {k: v for k, v in opts.items() if v is not None and k in setting.data_options}
    model = {k: v for k, v in opts.items() if v is not None and k in setting.model_options}
    variant = setting.variant(args.variant, given=set(data) | set(model))
    methods = _methods(args.methods)
    for m in methods:   # each method's preset and budget-scaled config, as compare will build them
        method_spec(m, setting=args.setting, variant=variant.name, hparams=args.hparams, budget=args.budget)
    threads = args.threads or default_threads(setting.threads)
    return device, setting, variant, data, model, methods, threads


def amp_configs(names, args, variant: str):
    """{method: its `method_config` (else its ``--hparams`` preset) with ``amp`` = ``--amp``} for
    ``names``; None when ``--amp preset`` (each method's own)."""
    if args.amp == "preset":
        return None
    from ..compare_specs import method_config
    from ..unlearn.method import get_method
    amp = None if args.amp == "none" else args.amp
    out = {}
    for m in names:
        cfg = method_config(m, setting=args.setting, variant=variant, hparams=args.hparams)
        cfg = get_method(m).config_for(args.setting, args.hparams) if cfg is None else cfg
        out[m] = dataclasses.replace(cfg, amp=amp)
    return out


def _compare(args, out: str, device, variant, data, model, methods, threads):
    """The comparison itself (this process, or ``--jobs`` workers and then this process's table);
    None for a ``--worker`` process."""
    from ..compare import compare
    from ..compare_jobs import ORIGINAL, die_with_parent, plan_tasks, run_workers, work, worker_command
    from ..settings import prepare
    from ..unlearn.disjoint import disjoint_scope
    from ..unlearn.lock import out_dir_lock
    from ..unlearn.original_eval import original_eval_scope

    with contextlib.ExitStack() as stack:
        # one disjoint_scope for prepare and every compare call of this process (a worker's tasks
        # too): identical rows in two splits warn once per process
        stack.enter_context(disjoint_scope())
        stack.enter_context(original_eval_scope())   # θ0 evaluated once per seed by every task of this process
        if args.worker is not None:
            die_with_parent(Path(args.worker))   # SIGTERM when the parent exits (Linux)
        else:   # one live comparison per --out (its workers share the parent's lock)
            stack.enter_context(out_dir_lock(out))
        run = prepare(args.setting, variant.name, data_root=args.data_root, seed=args.model_seed, device=device,
                      cache_dir=out, progress=not args.no_progress, data=data, model=model)
        relearn = False if args.no_relearn else ({"max_steps": args.relearn_steps} if args.relearn_steps else None)
        seeds = list(range(args.first_seed, args.first_seed + args.seeds))
        kw = dict(setting=args.setting, variant=variant.name, hparams=args.hparams, out_dir=out, device=device,
                  model_fn=run.fresh_model, relearn=relearn, mia_max_samples=args.mia_max_samples,
                  budget=args.budget)
        if args.worker is not None:   # one (method, seed) at a time from the parent's queue
            def one(m, s):   # the ORIGINAL task scores the original's row alone (no method)
                names = [] if m == ORIGINAL else [m]
                return compare(run.model, run.splits, names, [s], write_tables=False, progress=False,
                               configs=amp_configs(names, args, variant.name), session=Path(args.worker).name,
                               **kw)
            work(Path(args.worker), one)
            return None
        tasks = plan_tasks(methods, seeds)
        jobs = min(args.jobs, len(methods) * len(seeds))   # one worker per (method, seed) run at most
        session = None   # the workers' records carry their queue's name: computed now, not "cached"
        if jobs > 1:
            (Path(out) / "jobs").mkdir(parents=True, exist_ok=True)   # this invocation's own queue:
            queue = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=Path(out) / "jobs"))
            args.out_dir = out
            cmds = [worker_command(args, variant.name, methods, max(1, threads // jobs), queue)
                    for _ in range(jobs)]
            session = queue.name
            run_workers(cmds, tasks, queue, progress=not args.no_progress)
        return compare(run.model, run.splits, methods, seeds, progress=not args.no_progress, band=args.bold_band,
                       configs=amp_configs(methods, args, variant.name), session=session, **kw)


def main(argv=None) -> int:
    """Entry point of ``entangle-unlearn compare``. Returns the exit code: 0 success; 2 bad input
    (one ``entangle-unlearn compare: error: ...`` line on stderr: a ValueError / TypeError /
    FileNotFoundError / missing package; flags are checked before any data is loaded); 1 a
    ``--jobs`` worker failed (its log is named) or a file could not be written (`WriteError`,
    one line naming the file); 128 + the signal's number when interrupted (130 Ctrl-C, 143
    SIGTERM, 129 SIGHUP; rerunning the same command resumes from the per-run cache)."""
    from ..compare_jobs import ParentExited, WorkerFailed
    from ..threads import torch_threads

    args = build_parser().parse_args(argv)
    out = args.out if args.out is not None else f"runs/compare_{args.setting}"
    t0 = time.perf_counter()
    try:
        device, setting, variant, data, model, methods, threads = _plan(args, out)
    except (ValueError, TypeError, FileNotFoundError, ImportError) as e:
        return fail(e, "entangle-unlearn compare")
    # SIGTERM / SIGHUP (a kill, a closed terminal) stop like Ctrl-C: --jobs workers are terminated
    try:
        with one_line_warnings("entangle-unlearn compare"), torch_threads(threads), \
                sigterm_interrupts(*stop_signals()):
            res = _compare(args, out, device, variant, data, model, methods, threads)
    except (ValueError, TypeError, FileNotFoundError, ImportError) as e:
        return fail(e, "entangle-unlearn compare")
    except (WorkerFailed, ParentExited, WriteError) as e:   # a failed write: disk full, file-size limit
        print(f"entangle-unlearn compare: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        done = len(list(Path(out, "cache").glob("*/seed*.json")))   # (the runs' records, ResultCache.path)
        kept = f"{done} finished run(s) are cached in {out}/cache: rerun the same command to go on from there" \
            if done else "no run had finished, so none is cached: rerun the same command to start again"
        print(f"\nentangle-unlearn compare: interrupted; {kept}", file=sys.stderr)
        return interrupt_exit_code(e)
    if res is None:   # a --worker process
        return 0
    print(f"{args.setting} ({variant.name}: {variant.summary}), {len(res.seeds)} seed(s)\n")
    print(res.table)
    wrote = ", ".join(str(res.paths[k]) for k in ("markdown", "json", "png") if k in res.paths)   # no png: no matplotlib
    print(f"\nwrote {wrote} ({time.perf_counter() - t0:.0f} s)")
    return 0
