"""Time limits for the script and each stage, so a hung pipeline fails with its name instead of hanging CI.

SIGALRM on the main thread (where pytest and xdist workers run tests): the handler raises between
Python bytecodes, so a Python loop or a sleep is stopped at once and a long native operation as
soon as it returns. An alarm set by someone else (pytest-timeout's signal method) is put back
with the time it had left.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: Default of --trainer-timeout, in seconds: generous, a stage on a small model takes seconds.
TIMEOUT = 600.0


@contextmanager
def time_limit(seconds: float, expired: Callable[[], BaseException]) -> Iterator[None]:
    """Run the block; after `seconds`, raise `expired()` inside it. No limit for 0 or where signals cannot."""
    if seconds <= 0 or not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: object) -> None:
        raise expired()

    started = time.monotonic()
    previous_handler = signal.signal(signal.SIGALRM, on_alarm)
    previous_delay, previous_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_delay:
            left = max(previous_delay - (time.monotonic() - started), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, previous_interval)
