"""torch CPU thread count of a run: one home for the default (`default_threads`: an environment
variable's, a setting's own, or the physical cores) and for setting it for a block of code and
restoring it afterwards (`torch_threads`). Used by the command line and the demo."""
from __future__ import annotations

import contextlib
import os
import warnings
from typing import Optional

import torch

__all__ = ["physical_cores", "default_threads", "torch_threads", "check_thread_count", "MAX_THREADS"]

#: The most torch CPU threads a run may ask for. Far more than any CPU has; well under where
#: the OpenMP runtime can no longer map the threads' stacks (``torch.set_num_threads(100000)``
#: broke later imports with "failed to map segment from shared object" and crashed at exit).
MAX_THREADS = 1024


def check_thread_count(n, what: str = "the thread count") -> int:
    """``n`` when it is an integer (not a bool) in [1, `MAX_THREADS`]; else ValueError naming
    ``what`` (e.g. "--threads")."""
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_THREADS:
        raise ValueError(f"{what} must be an integer in [1, {MAX_THREADS}] (torch CPU threads; this process may "
                         f"run on {_usable_cpus()} CPU(s)), got {n!r}")
    return n


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def physical_cores() -> int:
    """Physical CPU cores this process may run on (distinct (package, core) pairs of
    /proc/cpuinfo among the CPUs of its affinity mask; where that is unavailable, the usable
    logical CPUs). At least 1."""
    try:
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        cpus = set(range(os.cpu_count() or 1))
    cores, cpu, pkg = set(), None, "0"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, val = (x.strip() for x in line.partition(":"))
                if k == "processor":
                    cpu, pkg = int(val), "0"
                elif k == "physical id":
                    pkg = val
                elif k == "core id" and cpu in cpus:
                    cores.add((pkg, val))
    except (OSError, ValueError):
        cores = set()
    return max(1, min(len(cores) or len(cpus), len(cpus)))


def default_threads(preferred: Optional[int] = None) -> int:
    """The torch CPU thread count for a run whose caller chose none: the one a thread-count
    environment variable (OMP_NUM_THREADS, MKL_NUM_THREADS) already set, else ``preferred`` (a
    setting's own, `entangle_ext.settings.Setting.threads`; digits: 1, its tiny MLP runs fastest on
    one thread), else `physical_cores`."""
    if any(os.environ.get(v) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")):
        return torch.get_num_threads()
    return preferred if preferred is not None else physical_cores()


@contextlib.contextmanager
def torch_threads(n: int):
    """``torch.set_num_threads(n)`` for the body; the previous count is restored on exit (also
    when it raises). Raises ValueError unless n is an integer in [1, `MAX_THREADS`]
    (`check_thread_count`); warns (RuntimeWarning) when n exceeds the CPUs this process may run
    on (e.g. ``--threads 256`` on 2 cores ran digits 6x slower than 1)."""
    check_thread_count(n)
    usable = _usable_cpus()
    if n > usable:
        warnings.warn(f"{n} torch threads on {usable} usable CPU(s): more threads than CPUs only adds contention "
                      f"(every step slows down); use at most {usable}", RuntimeWarning, stacklevel=3)
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)
