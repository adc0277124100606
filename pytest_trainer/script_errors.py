"""Errors a script raises while it builds its Trainer, explained in the terms of fine-tuning libraries.

`loading` asks `explain` for a cause and a fix before it falls back to the library's own message: those messages
say what failed, not what to write instead. The errors and their explanations are rows of `explanations.SCRIPT`.
"""

from __future__ import annotations

from pytest_trainer import explanations
from pytest_trainer.explanations import TRL_FORMATS, linear_module_names

__all__ = ["TRL_FORMATS", "explain", "linear_module_names"]


def explain(error: BaseException) -> tuple[str, str] | None:
    """(cause, fix) for an error of PEFT, TRL or the Trainer met while building it, else None."""
    found = explanations.explain_script(error)
    return (found.cause, found.fix) if found is not None else None
