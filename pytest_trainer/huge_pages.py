"""Huge pages for torch's large CPU tensors while a session runs its pipelines.

A model's vocabulary makes the largest tensors of a step: the logits of 8 x 512 tokens over Qwen's 152k tokens are
2.5 GB in fp32, and a training step allocates several of that size (the logits, their shifted copy, the log-softmax,
their gradients). torch's CPU allocator takes each from the kernel afresh, which maps and zeroes it 4 KiB page by
page. On 2 cores a training step of Qwen2.5's twin at that batch took 8.6-10.8 s, 2.5-3 s of it in user code and the
rest in the kernel.

torch maps its CPU allocations of 2 MiB and more with transparent huge pages where the environment variable
`THP_MEM_ALLOC_ENABLE` is 1 (read once, at torch's first CPU allocation in the process): the same step took 3.4-4.2
s, and the whole default suite of that script 90 s instead of 197 s. It changes how memory is mapped, not a value
computed, and nothing where the kernel has huge pages off (`/sys/kernel/mm/transparent_hugepage/enabled`).

The session sets the variable on Linux, where neither the environment nor a command under test (`--trainer-command=
"THP_MEM_ALLOC_ENABLE=0 ..."`) sets it: as pytest starts where scripts or commands are given, and before a marked test's
script runs otherwise. A user's own value (0 turns it off) is kept. The processes a stage starts (the distributed items)
inherit it. When the session ends, the environment is put back as it was. Where torch allocated before the variable was
set (a test of the user's own that ran first, a `trainer` fixture of the user's that built its model before the first
stage's set-up), it has no effect. PyTorch leaves it off by default because a process may hold a little more memory with
it: the twin's suite above peaked 0.6% higher.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

VARIABLE = "THP_MEM_ALLOC_ENABLE"


class HugePages:
    """The session's setting of `VARIABLE`: made once, and taken back at the end only where the session made it."""

    def __init__(
        self, environ: MutableMapping[str, str] = os.environ, platform: str = sys.platform, commanded: bool = False
    ) -> None:
        self._environ = environ
        self._platform = platform
        #: A command under test sets the variable itself: its value, not the session's, is the one to run with.
        self._commanded = commanded
        self.set_here = False

    def enable(self) -> None:
        """Ask torch for huge pages, unless the user said otherwise or the kernel is not Linux's."""
        if self.set_here or self._commanded or not self._platform.startswith("linux") or VARIABLE in self._environ:
            return
        self._environ[VARIABLE] = "1"
        self.set_here = True

    def restore(self) -> None:
        """Put the environment back as the session found it."""
        if self.set_here and self._environ.get(VARIABLE) == "1":
            del self._environ[VARIABLE]
        self.set_here = False
