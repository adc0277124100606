"""Run the user's script where `python train.py` runs it: at the base of a data-stack chunk of CPython.

Since 3.11, CPython keeps the frames of Python calls on a stack made of chunks (16 KiB, more for a large frame), and
frees a chunk as soon as its first frame returns. A hot recursion that goes back and forth over a chunk's end (dill
pickling a tokenizer's vocabulary to fingerprint a `datasets.map`, say) then allocates and frees a chunk on every
call: the same code runs 5 to 15 times slower at about one depth in twenty. Under pytest a script starts some fifty
frames deep, wherever pytest's stack happens to end; a direct run starts it at the base of the first chunk.

`call_at_base` calls through one frame sized so that it opens a 32 KiB chunk of its own and leaves what it calls
exactly the room the script's first frame has in a direct run: 2044 slots of 8 bytes before the chunk's end. From
there every call of the script falls where it falls in a direct run, whatever depth pytest called it from. Where the
layout is not CPython's (3.10 and older, other interpreters), it calls directly.
"""

from __future__ import annotations

import functools
import platform
import sys
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: CPython's frame header in slots ((sizeof(_PyInterpreterFrame) - 1) / 8 in 3.11 to 3.13).
FRAME_SPECIALS = 9
#: A chunk's own header before its first slot (previous, size, top).
CHUNK_HEADER = 3
#: Slots of the chunk the trampoline frame opens: 32 KiB, the next size up from a 16 KiB chunk.
CHUNK_SLOTS = 32 * 1024 // 8
#: Slots a direct run leaves its script's first frame: the first chunk (16 KiB) less its header and one skipped slot.
DIRECT_RUN_ROOM = 16 * 1024 // 8 - CHUNK_HEADER - 1


def call_at_base(function: Callable[..., T], *args: Any) -> T:
    """`function(*args)`, with its frame where the first frame of a direct run would be."""
    trampoline = _trampoline()
    return trampoline(function, *args) if trampoline is not None else function(*args)


@functools.cache
def _trampoline() -> Callable[..., Any] | None:
    """A function whose frame fills a fresh 32 KiB chunk up to DIRECT_RUN_ROOM slots before its end (see module doc).

    Its size is set by unused local variables: never assigned, they cost no time, only the slots they reserve.
    """
    if platform.python_implementation() != "CPython" or sys.version_info < (3, 11):
        return None
    wanted = CHUNK_SLOTS - CHUNK_HEADER - DIRECT_RUN_ROOM
    padding = wanted
    for _ in range(4):
        source = "def call_at_base(function, *args):\n    return function(*args)\n" + "".join(
            f"    _{index} = None\n" for index in range(padding)
        )
        namespace: dict[str, Any] = {}
        exec(compile(source, "<pytest-trainer: a frame the size of a direct run's stack>", "exec"), namespace)
        code = namespace["call_at_base"].__code__
        size = code.co_nlocals + len(code.co_cellvars) + len(code.co_freevars) + code.co_stacksize + FRAME_SPECIALS
        if size == wanted:
            return namespace["call_at_base"]  # type: ignore[no-any-return]
        padding += wanted - size
    return None
