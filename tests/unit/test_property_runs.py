"""`search.search` leaves garbage collection as it found it (what it freezes while hypothesis runs is thawed after), and
tries an explicit example first, whose failure gives way to the smallest drawn example that fails too."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from hypothesis import strategies as st

from pytest_trainer.property_runs import search


@pytest.fixture
def thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_nothing_stays_frozen_after_a_search_that_passes_or_fails(thawed: None) -> None:
    seen: list[int] = []
    search(st.integers(0, 9), seen.append, "test_search::passes", 5)
    assert seen and gc.get_freeze_count() == 0

    def fails(value: int) -> None:
        assert value < 5

    with pytest.raises(AssertionError):
        search(st.integers(0, 9), fails, "test_search::fails", 50)
    assert gc.get_freeze_count() == 0


def test_what_someone_else_froze_stays_frozen(thawed: None) -> None:
    kept = [object()]
    gc.freeze()
    frozen = gc.get_freeze_count()
    search(st.integers(0, 9), lambda value: None, "test_search::frozen", 5)
    # Still frozen (a few of those objects died meanwhile, which takes them out of the count); thawed would be 0.
    assert gc.get_freeze_count() > frozen - 1000 and kept


class Failed(Exception):
    pass


def fails_from(threshold: int, seen: list[int] | None = None) -> object:
    def check(value: int) -> None:
        if seen is not None:
            seen.append(value)
        if value >= threshold:
            raise Failed(value)

    return check


def test_an_explicit_example_is_tried_first_and_counts_among_the_examples() -> None:
    seen: list[int] = []
    search(st.integers(0, 5), fails_from(1000, seen), "unit::explicit-first", 10, explicit=[500])
    assert seen[0] == 500
    assert len(seen) <= 10


def test_a_failing_explicit_example_gives_way_to_the_smallest_drawn_failure() -> None:
    with pytest.raises(Failed) as raised:
        search(st.integers(0, 200), fails_from(10), "unit::explicit-shrunk", 50, explicit=[150])
    assert raised.value.args == (10,)


def test_a_failing_explicit_example_stands_when_no_drawn_example_fails() -> None:
    with pytest.raises(Failed) as raised:
        search(st.integers(0, 5), fails_from(100), "unit::explicit-alone", 10, explicit=[150])
    assert raised.value.args == (150,)
