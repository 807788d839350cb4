"""What the command lines (``entangle_ext/cli/run.py``, ``entangle_ext/cli/compare.py``, ``python_examples/``)
share: the device and seed flags, the parser that refuses a flag given twice with two values,
the one-line bad-input exit, SIGTERM/SIGHUP as Ctrl-C and the
exit code of an interrupted command (128 + the signal's number)."""
from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import zipfile
from typing import Optional

import torch

from .._signals import STOP_SIGNALS, signal_name

__all__ = ["PROG", "Parser", "command_prefix", "resolve_device", "device_arg", "seed_arg", "default_device", "fail",
           "sigterm_interrupts", "stop_signals", "SignalInterrupt", "interrupt_exit_code", "exit_on_bad_input",
           "one_line_warnings"]

PROG = "entangle-unlearn"

_GIVEN = "_single_flags_given"   # the namespace attribute `_StoreOnce` keeps during a parse (then removed)


class _StoreOnce(argparse.Action):
    """argparse's "store" action (a single-valued flag) that refuses a second, different value
    (``--seed 1 --seed 2``): one ``PROG: error: ...`` line naming the flag and both values, exit
    code 2, as `parse_overrides` refuses ``--set`` twice. The same value twice is accepted."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, _GIVEN, None)
        if given is None:
            given = {}
            setattr(namespace, _GIVEN, given)
        if self.dest in given and given[self.dest] != values:
            flag = next((o for o in self.option_strings if o.startswith("--")), self.option_strings[0])
            parser.exit(2, f"{parser.prog}: error: {flag} {_shown(given[self.dest])} and {flag} {_shown(values)} "
                           "set one flag to two values; give it once\n")
        given[self.dest] = values
        setattr(namespace, self.dest, values)


def _shown(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


class Parser(argparse.ArgumentParser):
    """The commands' ArgumentParser: a single-valued flag (action "store", the default) given twice
    with two different values is refused (one ``PROG: error: ...`` line naming the flag and both
    values, exit code 2) instead of silently taking the last; flags meant to repeat
    (``action="append"``, e.g. ``--set``) and switches (``store_true``) are unchanged."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    def parse_known_args(self, args=None, namespace=None):
        ns, rest = super().parse_known_args(args, namespace)
        vars(ns).pop(_GIVEN, None)
        return ns, rest


def command_prefix() -> list:
    """How to start this program again from a shell, for the commands the CLI prints: ``[PROG]``
    when the ``PROG`` found on PATH is the one beside this Python (its venv is active), else
    ``[sys.executable, "-m", "entangle_ext"]`` (works whether or not the venv is active)."""
    import os
    import shutil
    import sys
    found = shutil.which(PROG)
    here = os.path.join(os.path.dirname(sys.executable), PROG)
    if found and os.path.realpath(found) == os.path.realpath(here):
        return [PROG]
    return [sys.executable, "-m", "entangle_ext"]


def resolve_device(spec: Optional[str], label: Optional[str] = None) -> torch.device:
    """The run's device; ValueError for a malformed or unavailable one (the message starts with
    ``label``, by default ``--device SPEC``)."""
    if spec is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    quoted = f"--device {spec!r}" if label is None else label
    label = f"--device {spec}" if label is None else label
    try:
        d = torch.device(spec)
    except RuntimeError:
        raise ValueError(f"{quoted} is not a device; use cpu, cuda, cuda:N or mps") from None
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{label}: CUDA is not available here (torch {torch.__version__}, "
                             f"built for CUDA {torch.version.cuda}); use --device cpu")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise ValueError(f"{label}: only {torch.cuda.device_count()} CUDA device(s) here")
    elif d.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"{label}: MPS is not available here; use --device cpu")
    elif d.type != "cpu":
        raise ValueError(f"{label}: unsupported device type {d.type!r}; use cpu, cuda, cuda:N or mps")
    return d


def device_arg(spec: str) -> str:
    """``type=`` of an argparse ``--device`` option (the package CLI and ``python_examples/``).

    Args:
        spec: the command-line text, e.g. ``cpu``, ``cuda``, ``cuda:1`` or ``mps``.

    Returns:
        ``spec`` normalised by `torch.device` (``str``), when it names a device this machine has.

    Raises:
        argparse.ArgumentTypeError: a malformed device string, an unsupported device type, or CUDA /
            MPS / a CUDA index this machine lacks; argparse turns it into one
            ``PROG: error: argument --device: ...`` line and exit code 2.
    """
    try:
        return str(resolve_device(spec, label=repr(spec)))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def seed_arg(text: str) -> int:
    """``type=`` of the seed options (``--seed``; ``compare``'s ``--first-seed`` and ``--model-seed``).

    Args:
        text: the command-line text: an integer written in digits, e.g. ``0``, ``-1`` or ``5000000000``.

    Returns:
        the seed (``int``), in [-2**63, 2**64 - 1] (torch.manual_seed's range, that of a run
        config's ``seed``); the data loaders take every seed of it (`entangle_ext.data.seeds`).

    Raises:
        argparse.ArgumentTypeError: text that is not an integer in digits (``5e9``, ``1.5``) or a
            seed outside that range; argparse turns it into one ``PROG: error: argument --seed: ...``
            line and exit code 2.
    """
    from ..unlearn.fields import SEED_MAX, SEED_MIN
    try:
        seed = int(text)
    except ValueError:
        import decimal
        try:
            d = decimal.Decimal(text.strip())
            hint = f" (write {int(d)})" if d.is_finite() and d == d.to_integral_value() else ""
        except decimal.InvalidOperation:
            hint = ""
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer written in digits{hint}; a seed is an "
                                         f"integer in [{SEED_MIN}, {SEED_MAX}]") from None
    if not SEED_MIN <= seed <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"{seed} is outside [{SEED_MIN}, {SEED_MAX}] (torch.manual_seed's range)")
    return seed


def default_device() -> str:
    """``"cuda"`` when torch sees a CUDA device, else ``"cpu"``: the default of ``--device``."""
    return str(resolve_device(None))


def fail(e: BaseException, prog: str = PROG) -> int:
    """One ``PROG: error: ...`` line on stderr; returns the bad-input exit code 2."""
    print(f"{prog}: error: {e}", file=sys.stderr)
    return 2


class SignalInterrupt(KeyboardInterrupt):
    """The KeyboardInterrupt `sigterm_interrupts` raises for signal number ``signum`` (kept as the
    attribute ``signum``, an int), so the command can exit with that signal's code."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(signal_name(self.signum))


def interrupt_exit_code(exc: BaseException) -> int:
    """The exit code of a command that the KeyboardInterrupt ``exc`` stopped: 128 + the number of
    the signal behind it, the shell's convention (130 for SIGINT / Ctrl-C, 143 SIGTERM, 129 SIGHUP).
    The signal is read from ``exc.signum`` (`SignalInterrupt`) or ``exc.signal``, a signal's name
    (`entangle_ext.RunInterrupted`); a KeyboardInterrupt with neither (Python's own Ctrl-C, one
    raised in code) gives 130."""
    signum = getattr(exc, "signum", None)
    name = getattr(exc, "signal", None)
    if not isinstance(signum, int) and isinstance(name, str) and name in signal.Signals.__members__:
        signum = int(signal.Signals[name])
    return 128 + (signum if isinstance(signum, int) else int(signal.SIGINT))


@contextlib.contextmanager
def sigterm_interrupts(*signums):
    """``signums`` (default SIGTERM) raise `SignalInterrupt`, a KeyboardInterrupt, in the body
    (like Ctrl-C), so a killed run ends the same way; the previous handlers are restored. A signal
    the process ignores (``nohup`` sets SIGHUP to SIG_IGN) stays ignored. A no-op outside the main
    thread."""
    def handler(signum, frame):
        raise SignalInterrupt(signum)

    signums = signums or (signal.SIGTERM,)
    before = {}
    try:
        for s in signums:
            if signal.getsignal(s) is not signal.SIG_IGN:
                before[s] = signal.signal(s, handler)
    except ValueError:   # not the main thread
        pass
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def stop_signals() -> tuple:
    """SIGTERM and SIGHUP where the platform has them: what the commands stop on like Ctrl-C (a
    kill, a closed terminal)."""
    return tuple(s for s in STOP_SIGNALS if s != signal.SIGINT)


@contextlib.contextmanager
def exit_on_bad_input(prog: str):
    """For scripts built on the package (``python_examples/``): inside the block, bad input, i.e. a
    ValueError, TypeError, FileNotFoundError or other OSError, ImportError (a missing optional package
    such as Pillow or torchvision) or a corrupt archive (`zipfile.BadZipFile`), prints one
    ``PROG: error: ...`` line on stderr and exits with code 2 (`SystemExit`), as `main` does."""
    try:
        yield
    except (ValueError, TypeError, OSError, ImportError, zipfile.BadZipFile) as e:
        raise SystemExit(fail(e, prog)) from None


@contextlib.contextmanager
def one_line_warnings(prog: str = PROG):
    """The package's own warnings to the user print as one ``<prog>: warning: <message>`` line (a
    category defined in entangle_ext, e.g. `OutDirReusedWarning`, `MIAUndefinedWarning`,
    `BatchLargerThanSplitWarning`, or any warning raised from the package's own files, e.g. the
    thread-count one), not Python's two lines with a source path; other libraries' warnings print
    as usual. For the body of a command (``entangle-unlearn``, its ``compare``)."""
    import os
    import warnings
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    before = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        ours = category.__module__.startswith("entangle_ext") or os.path.abspath(filename).startswith(package)
        if ours:
            print(f"{prog}: warning: {message}", file=sys.stderr if file is None else file)
        else:
            before(message, category, filename, lineno, file, line)
    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = before
