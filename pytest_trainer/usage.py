"""What a command meant where it does something else: a newcomer's first slips, each answered with the command that
does what was meant. A training script given to pytest as a test file (pytest would import it and train), a
`--trainer-*` option misspelt, a `-k` expression that deselects every pipeline item.

Pure logic on the command's words and the script's text; the hooks that ask it are in `plugin`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

#: A test module defines tests.
_TESTS = re.compile(r"^\s*(async\s+)?(def\s+test|class\s+Test)", re.MULTILINE)
#: A training script builds a Trainer (any subclass: SFTTrainer, Seq2SeqTrainer, one of its own) and trains it.
_BUILDS = re.compile(r"Trainer\s*\(")
_TRAINS = re.compile(r"\.train\s*\(")
#: What every option's flag starts with.
_PREFIX = "--trainer-"
#: The words of a -k expression that are its grammar, not names.
_GRAMMAR = frozenset({"and", "or", "not"})


def training_script(path: Path) -> bool:
    """Whether a Python file builds and trains a Trainer and defines no test: a script, not a test module."""
    try:
        source = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return bool(_BUILDS.search(source) and _TRAINS.search(source) and not _TESTS.search(source))


def script_given(shown: str) -> str:
    """What to say of a training script given to pytest as a test file."""
    return (
        f"{shown} is a training script, not a test file: pytest would import it and run its training. "
        f"To test its pipeline: pytest --trainer-module={shown}"
    )


def misspelt(args: Sequence[str], flags: Sequence[str]) -> str | None:
    """What to say of the first `--trainer-*` word of `args` that names no option of `flags`, or None."""
    for arg in args:
        flag = arg.split("=", 1)[0]
        if not flag.startswith("--trainer") or flag in flags:
            continue
        # The names after the prefix all options share, or every misspelling would be near every option.
        names = {name.removeprefix(_PREFIX): name for name in flags}
        near = [
            names[name]
            for name in difflib.get_close_matches(re.sub(r"^--trainer[-_]?", "", flag), names, n=1, cutoff=0.6)
        ]
        if near:
            return f"{flag} is no option of pytest-trainer; did you mean {near[0]}? {arg.replace(flag, near[0], 1)}"
        return f"{flag} is no option of pytest-trainer; its options are {', '.join(flags)} (pytest --help lists them)"
    return None


def deselected(expression: str, names: Iterable[str], stages: Iterable[str]) -> str:
    """What to say where the -k `expression` deselected every pipeline item (`names`, of `stages`)."""
    shown = list(dict.fromkeys(names))
    words = [word for word in re.findall(r"[A-Za-z_]+", expression) if word not in _GRAMMAR]
    known = list(dict.fromkeys(stages))
    meant = expression
    for word in words:
        near = difflib.get_close_matches(word.lower(), known, n=1, cutoff=0.6)
        if near and word not in known:
            meant = re.sub(rf"\b{re.escape(word)}\b", near[0], meant)
    hint = f"; did you mean -k {meant!r}?" if meant != expression else ""
    return (
        f"pytest-trainer: -k {expression!r} deselected every pipeline item: they are named by stage and device, "
        f"{', '.join(shown[:6])}{', ...' if len(shown) > 6 else ''}{hint}"
    )
