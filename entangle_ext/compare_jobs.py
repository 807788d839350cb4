"""``entangle-unlearn compare --jobs N``: the (method, seed) runs of one comparison on N worker
processes that share its per-run cache (`entangle_ext.compare`: ``<out>/cache/<method>/seed<k>.json``).

The parent writes a task list under ``<out>/jobs/<its pid>-<random>/`` and starts N copies of the same
command with ``--worker <that dir>`` (each with ``max(1, threads // N)`` torch threads; N is capped
at the number of (method, seed) runs). A worker loads the data and
the cached original model once, then repeatedly claims the next task whose prerequisite is done
(a claim is a file created with ``O_EXCL``, so two workers never take the same task) and runs
``compare`` on that one (method, seed) with ``write_tables=False``. The first task of a seed scores
the original model alone (its row of the table, which every other `compare` call of that seed
then reads from the cache); every other task of the seed waits for that one only. No run waits for
Retrain: the records hold no gap metrics and their cache keys do not name Retrain's (the parent
adds "avg_gap" / "forget_quality" / "forget_ks" from the records when it assembles the table), so
the keys are those of a one-process comparison and the second worker is not idle while Retrain
trains. The parent then assembles the table from the cache (the records
its workers wrote carry the queue's name as `compare`'s ``session``, so the table does not list
them as cached: only results that existed before the command are). A worker that
fails stops the others; finished runs stay cached (rerunning the command goes on from there). The
queue directory is removed with the workers' logs when every worker succeeded, and kept otherwise
(a failure, an interrupt, a killed parent).
A worker stops when its parent is gone (killed, or its terminal closed): on Linux the kernel sends
it SIGTERM (``PR_SET_PDEATHSIG``), elsewhere it notices between tasks.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from ._signals import STOP_SIGNALS, signal_name

__all__ = ["ORIGINAL", "plan_tasks", "work", "run_workers", "worker_command", "die_with_parent", "WorkerFailed",
           "ParentExited"]

TASKS = "tasks.json"


class WorkerFailed(RuntimeError):
    """A worker process exited with a non-zero code (the message names its log)."""


class ParentExited(RuntimeError):
    """The ``compare --jobs`` process that started this worker is gone: the worker stops."""


def _load_queue(queue: Path):
    """(tasks, parent pid or None) of ``queue/tasks.json`` (a bare task list has no parent)."""
    data = json.loads((queue / TASKS).read_text())
    if isinstance(data, list):
        return data, None
    return data["tasks"], data.get("parent")


def _check_parent(parent: Optional[int]) -> None:
    if parent is not None and os.getppid() != parent:
        raise ParentExited(f"the compare process {parent} that started this worker has exited; stopping")


def die_with_parent(queue: Path) -> bool:
    """In a worker: ask the kernel for SIGTERM when the parent named in ``queue/tasks.json`` exits
    (Linux ``prctl(PR_SET_PDEATHSIG)``; returns False elsewhere, where `work` still checks between
    tasks). Raises `ParentExited` when the parent is already gone."""
    _, parent = _load_queue(Path(queue))
    armed = False
    if sys.platform.startswith("linux"):
        try:
            armed = ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0) == 0   # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            armed = False
    _check_parent(parent)   # after arming: a parent that died before it is caught here
    return armed


def _name(task: Dict) -> str:
    return f"{task['method']}.seed{task['seed']}"


ORIGINAL = "original"   # the task that scores the original model of a seed (not a method)


def plan_tasks(methods: Sequence[str], seeds: Sequence[int]) -> List[Dict]:
    """The tasks of a comparison, in the order workers take them: for each seed, the scoring of
    the original model (method `ORIGINAL`) comes first; then every method (Retrain first, the
    longest run of most comparisons) for each seed, each naming its seed's original task under
    ``"after"`` (its `compare` call reads that row from the cache instead of scoring it again).

    Returns: ``[{"method": str, "seed": int, "after": {"method", "seed"} or None}, ...]``.
    Raises: ValueError for no methods or no seeds.
    """
    methods, seeds = list(methods), list(seeds)
    if not methods or not seeds:
        raise ValueError(f"plan_tasks needs methods and seeds, got {methods} and {seeds}")
    ordered = (["retrain"] if "retrain" in methods else []) + [m for m in methods if m != "retrain"]
    heads = [{"method": ORIGINAL, "seed": s, "after": None} for s in seeds]
    rest = [{"method": m, "seed": s, "after": {"method": ORIGINAL, "seed": s}} for m in ordered for s in seeds]
    return heads + rest


def work(queue: Path, run_task: Callable[[str, int], None], *, poll_s: float = 1.0) -> int:
    """The loop of one worker: claim the next ready task of ``queue`` (prerequisite done, nobody
    else's claim), ``run_task(method, seed)``, mark it done; return the number of tasks this worker
    ran once every task is claimed. Exceptions of ``run_task`` propagate (the claim stays: the
    parent then stops the other workers). Raises `ParentExited` (before claiming a task or while
    waiting for one) when the parent named in ``queue/tasks.json`` is gone, so a worker never waits
    for a prerequisite that nobody will finish."""
    queue = Path(queue)
    tasks, parent = _load_queue(queue)
    claimed, done = queue / "claimed", queue / "done"
    ran = 0
    while True:
        _check_parent(parent)
        waiting = False
        for t in tasks:
            if (claimed / _name(t)).exists():
                continue
            waiting = True
            if t["after"] is not None and not (done / _name(t["after"])).exists():
                continue
            try:
                os.close(os.open(claimed / _name(t), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                continue
            run_task(t["method"], int(t["seed"]))
            (done / _name(t)).touch()
            ran += 1
            break
        else:
            if not waiting:
                return ran
            time.sleep(poll_s)


@contextlib.contextmanager
def _signals_deferred():
    """Hold SIGINT/SIGTERM/SIGHUP while the workers are stopped (POSIX), so a second Ctrl-C or
    kill cannot cut the cleanup short and leave one running; they are delivered on exit."""
    block = getattr(signal, "pthread_sigmask", None)
    if block is None:
        yield
        return
    old = block(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        block(signal.SIG_SETMASK, old)


def _exit_text(code: int) -> str:
    if code < 0:
        name = signal_name(-code)
        return f"was killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    return f"exited with code {code}"


def _stop_workers(procs, grace_s: float = 30.0) -> None:
    """Terminate the workers still running, wait for all of them together up to ``grace_s``,
    then kill the rest."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _tail(path: Path, lines: int = 6) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


_WARNING_LINE = re.compile(r": warning: |^\S.*:\d+: \w*Warning: ")


def warning_lines(logs: Sequence[Path]) -> List[str]:
    """The warning lines of the workers' logs, each once, in first-seen order: the package's own
    one-line ``<prog>: warning: <message>`` form and Python's ``<file>:<line>: <Category>: <message>``
    first line of another library's warning (its source line left out)."""
    seen: Dict[str, None] = {}
    for log in logs:
        try:
            text = Path(log).read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if _WARNING_LINE.search(line):
                seen.setdefault(line.rstrip(), None)
    return list(seen)


def run_workers(commands: Sequence[Sequence[str]], tasks: List[Dict], queue: Path, *, progress: bool = True,
                poll_s: float = 2.0, env: Optional[Dict[str, str]] = None) -> None:
    """Start one process per command (each is handed ``--worker queue`` by the caller), show a tqdm
    bar over the finished tasks and wait for all of them.

    Args:
        commands: argv lists, one per worker. tasks: `plan_tasks` output (written to
            ``queue/tasks.json`` with this process's pid as the workers' parent). queue: a
            directory of this invocation alone (emptied first; removed when every worker exited
            with 0, kept otherwise); ``queue/worker<k>.log`` holds worker k's output, whose
            warning lines (`warning_lines`) are printed to stderr, each once, before the logs
            are removed.
    Raises:
        WorkerFailed: a worker exited with a non-zero code (the others are terminated; the message
            names the log and quotes its last lines).
        KeyboardInterrupt: after terminating the workers.
    """
    from ._progress import progress_bar

    queue = Path(queue)
    shutil.rmtree(queue, ignore_errors=True)
    (queue / "claimed").mkdir(parents=True)
    (queue / "done").mkdir()
    (queue / TASKS).write_text(json.dumps({"parent": os.getpid(), "tasks": tasks}))
    procs, logs = [], []
    try:
        for k, cmd in enumerate(commands):   # (not under _signals_deferred: children inherit the mask)
            logs.append(queue / f"worker{k}.log")
            with open(logs[-1], "w") as log:
                procs.append(subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=env))
        with progress_bar(total=len(tasks), desc=f"compare ({len(procs)} workers)", enabled=progress) as bar:
            while True:
                n = sum(1 for _ in (queue / "done").iterdir())
                bar.update(n - bar.n)
                codes = [p.poll() for p in procs]
                bad = [(k, c) for k, c in enumerate(codes) if c not in (None, 0)]
                if bad:
                    k, c = bad[0]
                    raise WorkerFailed(f"compare worker {k} {_exit_text(c)}; its log {logs[k]} ends with:\n"
                                       f"{_tail(logs[k])}")
                if all(c == 0 for c in codes):
                    break
                time.sleep(poll_s)
    finally:
        with _signals_deferred():
            _stop_workers(procs)
    for line in warning_lines(logs):   # the logs go next: what the workers warned must not go with them
        print(line, file=sys.stderr)
    shutil.rmtree(queue, ignore_errors=True)   # reached only when every worker succeeded
    try:
        queue.parent.rmdir()   # <out>/jobs, when no other invocation's queue is in it
    except OSError:
        pass


def worker_command(args, variant: str, methods: Sequence[str], threads: int, queue: Path) -> List[str]:
    """The argv of one worker: the parent's comparison flags (from its parsed ``args``), the
    variant it resolved, ``--threads threads``, ``--no-progress`` and ``--worker queue``."""
    cmd = [sys.executable, "-m", "entangle_ext", "compare", "--setting", args.setting, "--variant", variant,
           "--methods", ",".join(methods), "--seeds", str(args.seeds), "--first-seed", str(args.first_seed),
           "--hparams", args.hparams, "--out", str(args.out_dir), "--model-seed", str(args.model_seed),
           "--budget", repr(args.budget), "--threads", str(threads), "--no-progress", "--worker", str(queue)]
    for flag, value in (("--data-root", args.data_root), ("--weights", args.weights),
                        ("--model-path", args.model_path), ("--relearn-steps", args.relearn_steps),
                        ("--mia-max-samples", args.mia_max_samples), ("--device", args.device)):
        if value is not None:
            cmd += [flag, str(value)]
    if args.no_relearn:
        cmd.append("--no-relearn")
    if getattr(args, "amp", "preset") != "preset":
        cmd += ["--amp", args.amp]
    return cmd
