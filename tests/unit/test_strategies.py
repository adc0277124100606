"""Where the lengths property looks past the split's longest row: far between, and always at the limit."""

from __future__ import annotations

import pytest

from pytest_trainer.strategies import far_lengths


@pytest.mark.parametrize(
    ("longest", "limit", "expected"),
    [
        (57, 512, [114, 228, 456, 512]),  # MiniLM's 512 positions beside MNLI rows of at most 57 tokens
        (20, 64, [40, 64]),
        (40, 64, [64]),  # doubling would pass the limit at once: the limit alone
        (64, 64, []),  # the rows already reach the limit
        (80, 64, []),
        (1, 8, [2, 4, 8]),
    ],
)
def test_far_lengths_double_from_the_longest_row_up_to_the_limit(longest: int, limit: int, expected: list[int]) -> None:
    assert far_lengths(longest, limit) == expected
