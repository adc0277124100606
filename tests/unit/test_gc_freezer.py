"""A session freezes the objects that outlive it only when nothing else manages the collector, and thaws them."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator

import pytest

from pytest_trainer import gc_freezer

DEFAULT_THRESHOLDS = gc.get_threshold()


@pytest.fixture(autouse=True)
def nothing_frozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_session_freezes_what_is_alive_and_thaws_it() -> None:
    freezer = gc_freezer.Freezer()
    kept = [object() for _ in range(10)]
    freezer.freeze()
    assert gc.get_freeze_count() >= len(kept)
    freezer.thaw()
    assert gc.get_freeze_count() == 0


def test_a_session_leaves_a_freeze_it_did_not_make() -> None:
    gc.freeze()
    freezer = gc_freezer.Freezer()
    freezer.freeze()
    freezer.import_quietly("json")
    freezer.thaw()
    # Still frozen (a frozen object that dies leaves the count, so it may be a little lower); thawed would be 0.
    assert gc.get_freeze_count() > 0


def test_libraries_are_imported_with_the_collector_off_and_frozen() -> None:
    seen: list[str] = []

    def during(phase: str, info: dict[str, int]) -> None:
        seen.append(phase)  # a collection while the import runs

    sys.modules.pop("wave", None)  # so that the import runs again
    freezer = gc_freezer.Freezer()
    gc.callbacks.append(during)
    try:
        gc.set_threshold(1)  # any allocation would collect, were the collector on
        freezer.import_quietly("wave")
    finally:
        gc.set_threshold(*DEFAULT_THRESHOLDS)
        gc.callbacks.remove(during)
    assert seen == []
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0
    freezer.thaw()


def test_a_block_runs_with_the_objects_alive_frozen_and_puts_them_back() -> None:
    with gc_freezer.frozen():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    gc.freeze()
    with gc_freezer.frozen():
        pass
    assert gc.get_freeze_count() > 0  # the outer freeze stands


def test_garbage_made_before_a_freeze_is_collected_not_frozen_alive() -> None:
    class Node:
        pass

    freezer = gc_freezer.Freezer()
    node = Node()
    node.self = node  # type: ignore[attr-defined]  # a cycle: only the collector frees it
    dead = weakref.ref(node)
    del node
    freezer.freeze()
    try:
        assert dead() is None
    finally:
        freezer.thaw()
