"""`search.search` leaves garbage collection as it found it: what it freezes while hypothesis runs is thawed after."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from hypothesis import strategies as st

from pytest_trainer.search import search


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
