"""Time limits for the script and each stage (`pytest_trainer.timeouts`): a hung block fails with its name.

Pinned: a block that outlives its limit is stopped with the error `expired()` makes; a block within it runs to its end
and leaves no alarm behind; no limit for 0, which leaves any alarm as it is; an alarm someone else set (pytest-timeout's signal method) is put back with
the time it had left.
"""

from __future__ import annotations

import signal
import time

import pytest

from pytest_trainer.timeouts import time_limit


class Hung(Exception):
    pass


def test_a_block_past_its_limit_is_stopped_with_the_error_it_names() -> None:
    with pytest.raises(Hung), time_limit(0.05, lambda: Hung("the collate stage did not finish")):
        while True:
            time.sleep(0.01)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_block_within_its_limit_runs_to_its_end_and_leaves_no_alarm() -> None:
    with time_limit(5, lambda: Hung()):
        ran = sum(range(1000))
    assert ran == 499500
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_limit_of_0_is_no_limit_and_leaves_an_alarm_set_by_someone_else_alone() -> None:
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: None)
    try:
        signal.setitimer(signal.ITIMER_REAL, 30)
        with time_limit(0, lambda: Hung()):
            left, _ = signal.getitimer(signal.ITIMER_REAL)
            assert 25 < left <= 30
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_an_alarm_set_by_someone_else_is_put_back_with_the_time_it_had_left() -> None:
    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30)
        with time_limit(5, lambda: Hung()):
            time.sleep(0.01)
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 25 < left <= 30
        assert fired == []
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
