"""Run a hypothesis property inside a pipeline item.

Deterministic in CI (derandomized when the CI variable is set), no deadline (slow CPUs must not
flake), and one example-database key per script and property, so a failure found once is replayed
first on the next run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def search(strategy: Any, check: Callable[[Any], None], key: str, examples: int) -> None:
    """Try `check` on examples of `strategy`; on failure, raise its exception for the smallest example found."""
    from hypothesis import HealthCheck, given, settings

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=bool(os.environ.get("CI")),
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        report_multiple_bugs=False,
    )
    @given(strategy)
    def prop(example: Any) -> None:
        check(example)

    prop.hypothesis.inner_test._hypothesis_internal_add_digest = key.encode()  # type: ignore[attr-defined]
    prop()
