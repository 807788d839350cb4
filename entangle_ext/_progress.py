"""Progress bars of every long loop (tqdm), one configuration: on a terminal tqdm's usual
updates; when stderr is not a terminal (a log file, CI, ``nohup``) at most one update every
``LOG_INTERVAL_S`` seconds, so a log gets a line per half minute instead of a flood of ``\\r``
updates. `progress_note` writes a one-line message beside the bars (e.g. why a loop stopped early)."""
from __future__ import annotations

import sys

LOG_INTERVAL_S = 30.0


def progress_bar(*, total: int, desc: str, enabled: bool, initial: int = 0, **kw):
    """A `tqdm.auto.tqdm` bar over ``total`` steps (``enabled`` False: a disabled bar with the same
    interface). Extra keywords go to tqdm."""
    from tqdm.auto import tqdm
    tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
    opts = dict(dynamic_ncols=True, leave=True) if tty else dict(mininterval=LOG_INTERVAL_S, maxinterval=LOG_INTERVAL_S,
                                                                   ncols=100, leave=True)
    return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, **{**opts, **kw})


def progress_note(message: str, *, enabled: bool) -> None:
    """One line on stderr beside the progress bars (``tqdm.write``: a bar still open is redrawn
    under it), e.g. why a loop ended before its budget; nothing when ``enabled`` is False (the
    flag of the bars it accompanies: progress off, or a rank other than 0)."""
    if enabled:
        from tqdm.auto import tqdm
        tqdm.write(message, file=sys.stderr)
