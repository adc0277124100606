"""The loud errors people hit with the Trainer, TRL and PEFT, each with its cause in the user's terms and a fix.

One table in two halves, each a module of rows: `script_rows` for the errors a script raises while it builds its
Trainer (the script runner asks it), `pipeline_rows` for the errors a part of the pipeline raises while a stage runs
it. `registry` holds what a row is. Adding an error is adding one row to its half.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_trainer.explanations.registry import PIPELINE, SCRIPT, Row


def table_rows() -> Sequence[Row]:
    """Every row, pipeline first: what the errors table of the docs lists."""
    from pytest_trainer.explanations import pipeline_rows, script_rows  # noqa: F401  (their rows register)

    return [*PIPELINE, *SCRIPT]
