"""A dataset as an Arrow table, and whole-column facts about it (value ranges, lengths, text).

Checks run over every row with Arrow and NumPy, so a bad row 163 is found as fast as a bad row 0,
and the row index is kept to name it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute


def as_table(dataset: Any, limit: int) -> pa.Table:
    """The rows of a `datasets` dataset, or of any dataset of dicts, as an Arrow table (at most `limit` rows)."""
    import datasets

    if isinstance(dataset, datasets.Dataset):
        rows = dataset if len(dataset) <= limit else dataset.select(range(limit))
        table = rows.with_format("arrow")[:]
        return table if isinstance(table, pa.Table) else pa.table(table)
    if isinstance(dataset, datasets.IterableDataset):
        return pa.Table.from_pylist([_plain(row) for row in dataset.take(limit)])
    count = min(len(dataset), limit)
    return pa.Table.from_pylist([_plain(dataset[index]) for index in range(count)])


def _plain(row: Any) -> dict[str, Any]:
    return {key: value.tolist() if hasattr(value, "tolist") else value for key, value in dict(row).items()}


def is_list(column_type: pa.DataType) -> bool:
    return pa.types.is_list(column_type) or pa.types.is_large_list(column_type)


def is_text(column_type: pa.DataType) -> bool:
    while pa.types.is_list(column_type) or pa.types.is_large_list(column_type):
        column_type = column_type.value_type
    return pa.types.is_string(column_type) or pa.types.is_large_string(column_type)


def is_numeric(column_type: pa.DataType) -> bool:
    while pa.types.is_list(column_type) or pa.types.is_large_list(column_type):
        column_type = column_type.value_type
    return pa.types.is_integer(column_type) or pa.types.is_floating(column_type) or pa.types.is_boolean(column_type)


def flatten(table: pa.Table, column: str) -> tuple[np.ndarray, Callable[[int], int]]:
    """All values of a (possibly nested) list column, and a function from a value's index to its row."""
    values, _, ends = _unnest(table, column)
    return values, _row_finder(ends)


def lengths(table: pa.Table, column: str) -> tuple[np.ndarray, Callable[[int], int]]:
    """Length of every innermost sequence of a list column, and a function from its index to its row."""
    _, counts, ends = _unnest(table, column)
    return counts, _row_finder(ends[:-1])


def _unnest(table: pa.Table, column: str) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Innermost values, innermost list lengths, and the cumulative lengths of each nesting level."""
    array = table.column(column).combine_chunks()
    counts = np.ones(len(array), dtype=np.int64)
    ends: list[np.ndarray] = []
    while pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        counts = pa.compute.list_value_length(array).fill_null(0).to_numpy(zero_copy_only=False)
        ends.append(np.cumsum(counts))
        array = array.flatten()
    return array.to_numpy(zero_copy_only=False), counts, ends


def _row_finder(ends: list[np.ndarray]) -> Callable[[int], int]:
    def row_of(index: int) -> int:
        for level_ends in reversed(ends):
            index = int(np.searchsorted(level_ends, index, side="right"))
        return index

    return row_of
