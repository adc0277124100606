"""The objects that live as long as the session, kept out of the garbage collector's way.

Importing torch and transformers leaves about a million objects alive for good, and a loaded Trainer more. Each full
collection walks all of them (about a quarter of a second with a 22M-parameter model loaded): the ones their own
imports trigger, the ones the items' allocations trigger, pytest's own at the end of the run, and Python's as it
exits. `gc.freeze` moves the objects alive at a moment out of every later collection; garbage made afterwards is
collected as before.

A session freezes only when nothing was frozen before it (a process that manages the collector itself is left to it),
and thaws what it froze when it ends, so that a run inside a longer-lived process (pytester's in-process runs) leaves
nothing uncollectable behind. At exit, what is still alive is frozen once more: Python's last collections would only
walk objects that go with the process.
"""

from __future__ import annotations

import atexit
import gc
import importlib
from collections.abc import Iterator
from contextlib import contextmanager

_exit_registered = False


class Freezer:
    """One session's freezes: none when the collector was already frozen as the session began."""

    def __init__(self) -> None:
        self.owned = gc.get_freeze_count() == 0
        self.froze = False

    def import_quietly(self, *modules: str) -> None:
        """Import `modules` with the collector off, then freeze what they made: their import makes next to no garbage,
        and each collection it would set off walks everything imported so far."""
        if not self.owned:
            for module in modules:
                importlib.import_module(module)
            return
        enabled = gc.isenabled()
        gc.disable()
        try:
            for module in modules:
                importlib.import_module(module)
        finally:
            if enabled:
                gc.enable()
        self._freeze()

    def freeze(self) -> None:
        """Leave every object alive now out of later collections (the libraries, the script, its Trainer).

        The garbage made since the last freeze is collected first, so that none of it is frozen alive (a failed
        script's traceback, the tensors of an earlier script's stages): a collection that walks only the objects made
        since then.
        """
        if self.owned:
            gc.collect()
            self._freeze()

    def _freeze(self) -> None:
        global _exit_registered
        gc.freeze()
        self.froze = True
        if not _exit_registered:
            atexit.register(gc.freeze)
            _exit_registered = True

    def thaw(self) -> None:
        """Make what this session froze collectable again (the session is over; the process may go on)."""
        if self.froze:
            gc.unfreeze()
            self.froze = False


@contextmanager
def frozen() -> Iterator[None]:
    """Leave the objects alive now out of collection while the block runs, and put them back after; objects someone
    else froze stay frozen."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
