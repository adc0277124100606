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


def stored(dataset: Any, limit: int) -> pa.Table:
    """The stored rows of a `datasets.Dataset` as an Arrow table (at most `limit` rows), without any transform."""
    rows = dataset if len(dataset) <= limit else dataset.select(range(limit))
    table = rows.with_format("arrow")[:]
    return table if isinstance(table, pa.Table) else pa.table(table)


def stored_rows(dataset: Any, rows: list[int] | None = None, columns: list[str] | None = None) -> pa.Table:
    """Rows of a `datasets.Dataset` (all of them when `rows` is None) as stored, without any transform.

    Only `columns` are read when given: an image column left out is never copied.
    """
    if columns is not None:
        dataset = dataset.select_columns(columns)
    if rows is not None and rows != list(range(len(dataset))):
        dataset = dataset.select(rows)
    table = dataset.with_format("arrow")[:]
    return table if isinstance(table, pa.Table) else pa.table(table)


def spread(count: int, limit: int) -> list[int]:
    """`limit` row indices evenly spaced over `count` rows, the first and the last included (every row when `limit`
    is 0 or at least `count`): deterministic, and a split sorted by class still shows every class."""
    if not limit or limit >= count:
        return list(range(count))
    if limit == 1:
        return [0]
    return [index * (count - 1) // (limit - 1) for index in range(limit)]


def scalar_columns(schema: pa.Schema) -> list[str]:
    """Columns of one number per row (class ids, scores, flags): cheap to read over a whole split."""
    return [
        field.name
        for field in schema
        if pa.types.is_integer(field.type) or pa.types.is_floating(field.type) or pa.types.is_boolean(field.type)
    ]


def from_columns(columns: dict[str, list[Any]]) -> tuple[pa.Table, list[str]]:
    """Samples as produced by a transform or a `__getitem__` (tensors, arrays, lists), as an Arrow table.

    Arrays of one shape become fixed-size lists without a copy through Python; a column Arrow cannot
    hold (objects, mixed types) is left out and named in the second value.
    """
    arrays, opaque = {}, []
    for name, values in columns.items():
        try:
            arrays[name] = _column(values)
        except pa.ArrowException:
            opaque.append(name)
    return pa.table(arrays) if arrays else pa.table({}), opaque


def _column(values: list[Any]) -> pa.Array:
    as_arrays = [_array(value) for value in values]
    shapes = {array.shape for array in as_arrays if array is not None}
    if as_arrays and all(array is not None for array in as_arrays) and len(shapes) == 1 and next(iter(shapes)):
        stacked = np.stack(as_arrays)  # type: ignore[arg-type]
        if stacked.dtype.kind in "biuf":
            array: pa.Array = pa.array(stacked.reshape(-1))
            for size in reversed(stacked.shape[1:]):
                array = pa.FixedSizeListArray.from_arrays(array, size)
            return array
    return pa.array([_plain(value) for value in values])


def _array(value: Any) -> np.ndarray | None:
    if hasattr(value, "detach"):  # a torch tensor
        return value.detach().cpu().float().numpy() if value.dtype.is_floating_point else value.detach().cpu().numpy()
    return value if isinstance(value, np.ndarray) else None


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _nested(column_type: pa.DataType) -> bool:
    return (
        pa.types.is_list(column_type) or pa.types.is_large_list(column_type) or pa.types.is_fixed_size_list(column_type)
    )


def is_list(column_type: pa.DataType) -> bool:
    return _nested(column_type)


def depth(column_type: pa.DataType) -> int:
    """How many list levels a column has: 0 for scalars, 1 for token ids, 2 for choices x tokens."""
    levels = 0
    while _nested(column_type):
        column_type, levels = column_type.value_type, levels + 1
    return levels


def is_text(column_type: pa.DataType) -> bool:
    while _nested(column_type):
        column_type = column_type.value_type
    return pa.types.is_string(column_type) or pa.types.is_large_string(column_type)


def is_numeric(column_type: pa.DataType) -> bool:
    while _nested(column_type):
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


def outer_lengths(table: pa.Table, column: str) -> np.ndarray:
    """Length of each row's outermost list (the number of choices of a choices x tokens column)."""
    array = table.column(column).combine_chunks()
    return pa.compute.list_value_length(array).fill_null(0).to_numpy(zero_copy_only=False)


def row_lengths(table: pa.Table, column: str) -> np.ndarray:
    """The longest innermost sequence of each row (one per row, also under a choices axis)."""
    _, counts, ends = _unnest(table, column)
    if not ends:
        return np.ones(table.num_rows, dtype=np.int64)
    for level_ends in reversed(ends[:-1]):  # fold each outer level: a row's length is its longest sequence
        starts = np.concatenate([[0], level_ends[:-1]])
        counts = np.array(
            [counts[start:end].max(initial=0) for start, end in zip(starts, level_ends, strict=True)], dtype=np.int64
        )
    return counts


def _unnest(table: pa.Table, column: str) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Innermost values, innermost list lengths, and the cumulative lengths of each nesting level."""
    array = table.column(column).combine_chunks()
    counts = np.ones(len(array), dtype=np.int64)
    ends: list[np.ndarray] = []
    while _nested(array.type):
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
