"""The table of known errors (`pytest_trainer.explanations`) as data: every row documented, and its pattern
matching the message it shows.

Pinned: the table holds every pipeline row, then every script row; names are distinct; each row shows its message and
the stage it surfaces in (script rows: while the script loads); a row's pattern matches the message it shows where that
message is the library's literal one. The rows fed the real errors the real libraries raise are in
tests/e2e/test_explanation_rows.py.
"""

from __future__ import annotations

import re

import pytest

from pytest_trainer import explanations
from pytest_trainer.explanations.registry import PIPELINE, SCRIPT, Row
from pytest_trainer.stages import registry

#: Rows whose `seen` text is cut short of the part of the message their pattern needs (the README shows the start
#: of the message only); their patterns are checked against the libraries' real messages in the end-to-end tests.
SEEN_CUT_SHORT = {
    "load_best_model_at_end with save and eval at different times",
    "load_best_model_at_end with save steps not a multiple of eval steps",
}


# ---- the table itself -----------------------------------------------------------------------------------------


ROWS = explanations.table_rows()


def message_of(seen: str) -> str:
    """The message as `str(error)` gives it: the seen text without its leading exception type."""
    return re.sub(r"^\w+(Error|Exception): ", "", seen)


def test_table_holds_every_pipeline_row_then_every_script_row() -> None:
    assert list(ROWS) == [*PIPELINE, *SCRIPT]
    assert PIPELINE and SCRIPT


def test_row_names_are_distinct() -> None:
    names = [row.name for row in ROWS]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_every_row_shows_its_message_and_the_stage_it_surfaces_in(row: Row) -> None:
    assert row.name.strip()
    assert row.seen.strip()
    assert row.stage in registry()


@pytest.mark.parametrize("row", SCRIPT, ids=lambda row: row.name)
def test_script_rows_surface_while_the_script_loads(row: Row) -> None:
    assert row.stage == "load"


@pytest.mark.parametrize(
    "row", [row for row in ROWS if row.pattern.pattern and row.name not in SEEN_CUT_SHORT], ids=lambda row: row.name
)
def test_a_row_s_pattern_matches_the_message_it_shows(row: Row) -> None:
    assert row.pattern.search(message_of(row.seen)), f"{row.pattern.pattern!r} misses {row.seen!r}"


def test_rows_whose_seen_text_is_cut_short_are_still_in_the_table_and_still_cut_short() -> None:
    by_name = {row.name: row for row in ROWS}
    for name in SEEN_CUT_SHORT:
        assert name in by_name, f"{name!r} is no longer a row: drop it from SEEN_CUT_SHORT"
        assert not by_name[name].pattern.search(message_of(by_name[name].seen)), (
            f"{name!r} now matches its seen text: drop it from SEEN_CUT_SHORT"
        )
