"""The table of known errors: a row is a pattern of a library's message and a function that tells its cause.

Two halves: `PIPELINE` (errors a part of the pipeline raises while a stage runs it, rows in `pipeline_rows`) and
`SCRIPT` (errors the script raises while it builds its Trainer, rows in `script_rows`). A row's function reads what
it needs and returns the cause and the fix, or None where the facts do not match, so the error keeps its own message.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Explained:
    """A cause in the user's terms, the fix, and lines shown below them."""

    cause: str
    fix: str
    details: tuple[str, ...] = ()


#: What a pipeline row returns: its own explanation, a failure the pipeline's checks found, or None.
Found = Explained | Exception | None


@dataclass(frozen=True)
class Row:
    """One loud error: the message it is known by, and how to tell its cause."""

    name: str
    #: The message users see (shown in the errors table of the docs).
    seen: str
    pattern: re.Pattern[str]
    explain: Callable[..., Any]
    #: The stage where it surfaces, for the table.
    stage: str = ""


PIPELINE: list[Row] = []
SCRIPT: list[Row] = []


def row(
    table: list[Row], name: str, seen: str, pattern: str, stage: str
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as a row of `table`."""

    def register(explain: Callable[..., Any]) -> Callable[..., Any]:
        table.append(Row(name, seen, re.compile(pattern), explain, stage))
        return explain

    return register


def first(table: list[Row], error: BaseException, *facts: Any) -> Any:
    """What the first row whose pattern matches and whose facts agree returns, else None."""
    message = str(error)
    for known in table:
        match = known.pattern.search(message)
        if match is not None:
            found = known.explain(match, error, *facts)
            if found is not None:
                return found
    return None
