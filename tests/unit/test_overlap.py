"""Rows repeated between two splits (`overlap`), on token ids: the hash of a row, the pairs found, many rows at once.
The end-to-end runs (splits as the Trainer feeds them) are in tests/e2e/test_overlapping_splits.py.
"""

from __future__ import annotations

import numpy as np

from pytest_trainer import overlap


def rows(*sequences: list[int]) -> overlap.Rows:
    lengths = [len(sequence) for sequence in sequences]
    return overlap.Rows(
        np.array([token for sequence in sequences for token in sequence], dtype=np.int64),
        np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
    )


def test_equal_rows_hash_equal_and_order_matters() -> None:
    hashed = rows([5, 6, 7], [7, 6, 5], [5, 6, 7], [], [5, 6], [5, 6, 7, 0]).hashes
    assert hashed[0] == hashed[2]
    assert len({int(hashed[index]) for index in (0, 1, 4, 5)}) == 4
    assert hashed[3] == 0


def test_overlap_pairs_each_evaluation_row_with_its_training_row() -> None:
    training = rows([1, 2, 3, 4, 5, 6, 7, 8, 9], [2, 3], [4, 4, 4, 4, 4, 4, 4, 4])
    evaluation = rows([9, 9], [2, 3], [], [4, 4, 4, 4, 4, 4, 4, 4], [1, 2, 3, 4, 5, 6, 7, 8])
    found = overlap.between(training, evaluation)
    assert found.pairs == [(1, 1), (3, 2)]
    assert (found.rows, found.short, found.long) == (5, 1, 1)


def test_overlap_over_many_rows_finds_exactly_the_copied_ones() -> None:
    generator = np.random.default_rng(0)
    training = [list(generator.integers(0, 50, generator.integers(1, 40))) for _ in range(5000)]
    evaluation = [list(generator.integers(0, 50, generator.integers(1, 40))) for _ in range(500)]
    copied = [3, 77, 499]
    for row in copied:
        evaluation[row] = training[row * 7]
    found = overlap.between(rows(*training), rows(*evaluation))
    assert [row for row, _ in found.pairs if len(evaluation[row]) > 2] == copied
