"""The signals that stop a run like Ctrl-C, and their names (one home for the stage loop, the
comparison's worker supervisor and the commands).

SIGINT (Ctrl-C), SIGTERM (a kill, a scheduler's preemption) and SIGHUP (a closed terminal), where
the platform has them: the stage loop defers them to a step boundary and checkpoints, the commands
exit with 128 + the signal's number, the comparison holds them while it stops its workers.
"""
from __future__ import annotations

import signal

STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


def signal_name(signum: int) -> str:
    """``"SIGTERM"`` for 15 (the platform's name), ``"signal N"`` for a number it does not name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
