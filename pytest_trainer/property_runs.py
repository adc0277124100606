"""Run a hypothesis property inside a pipeline item.

Deterministic in CI (derandomized when the CI variable is set), no deadline (slow CPUs must not
flake), and one example-database key per script and property, so a failure found once is replayed
first on the next run.

Where the examples can be checked together (`check_all`: a few batched forward passes instead of one
per example, False when the pipeline fails them; an exception of its own is a bug of the plugin and
propagates), they are drawn first and checked at once; only when that fails does the search run again,
example by example from the same seed, to find the failing example and shrink it. Checked together,
examples that each pass might still fail (two rows nothing pads, say): then the search example by
example decides, and finds nothing.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence
from typing import Any

from pytest_trainer import gc_freezer


def search(
    strategy: Any,
    check: Callable[[Any], None],
    key: str,
    examples: int,
    check_all: Callable[[list[Any]], bool] | None = None,
    explicit: Sequence[Any] = (),
) -> None:
    """Try `check` on examples of `strategy`; on failure, raise its exception for the smallest example found.

    `explicit` examples are tried first, whatever is drawn, and count among the `examples` (of which at least one is
    drawn). One that fails is not shrunk: the drawn examples are then searched alone, and the smallest of them that
    fails is raised instead, if one does.
    """
    try:
        _search(strategy, check, key, examples, check_all, explicit)
    except Exception:
        if not explicit:
            raise
        _search(strategy, check, key, examples, check_all, ())
        raise


def _search(
    strategy: Any,
    check: Callable[[Any], None],
    key: str,
    examples: int,
    check_all: Callable[[list[Any]], bool] | None,
    explicit: Sequence[Any],
) -> None:
    from hypothesis import HealthCheck, example, given, seed, settings

    handle: list[Callable[[Any], Any]] = [check]

    @settings(
        max_examples=max(1, examples - len(explicit)),
        deadline=None,
        derandomize=bool(os.environ.get("CI")),
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        report_multiple_bugs=False,
    )
    @given(strategy)
    def prop(item: Any) -> None:
        handle[0](item)

    for value in explicit:
        prop = example(value)(prop)
    prop.hypothesis.inner_test._hypothesis_internal_add_digest = key.encode()  # type: ignore[attr-defined]
    with gc_freezer.frozen():  # hypothesis collects garbage once per thread: not over what torch and the script made
        if check_all is not None:
            seed(random.SystemRandom().getrandbits(64))(prop)  # both passes draw the same examples; random untouched
            drawn: list[Any] = []
            handle[0] = drawn.append
            prop()
            if check_all(drawn):
                return
            handle[0] = check  # the search example by example tells what fails, and why
        prop()
