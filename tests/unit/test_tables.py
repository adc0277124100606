"""Whole-column facts about a dataset as an Arrow table (`pytest_trainer.tables`), on built columns.

Pinned: `spread` picks evenly spaced rows, first and last included, every row when asked for all, the same rows every
time; lengths and values of ragged and nested list columns, each mapped back to the row that holds it (empty and
missing rows included, over several chunks); the type predicates; `scalar_columns`. `from_columns` on tensors and
`stored` on a `datasets.Dataset` are in tests/e2e/test_tables.py.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_trainer import tables

# ---- spread ---------------------------------------------------------------------------------------------------


@given(count=st.integers(0, 500), limit=st.integers(0, 600))
def test_spread_picks_distinct_rows_in_order_within_the_split(count: int, limit: int) -> None:
    rows = tables.spread(count, limit)
    assert rows == sorted(set(rows))
    assert all(0 <= row < count for row in rows)
    assert len(rows) == (count if not limit else min(limit, count))


@given(count=st.integers(2, 500), limit=st.integers(2, 500))
def test_spread_includes_the_first_and_the_last_row(count: int, limit: int) -> None:
    rows = tables.spread(count, limit)
    assert rows[0] == 0
    assert rows[-1] == count - 1


@given(count=st.integers(2, 500), limit=st.integers(2, 500))
def test_spread_rows_are_evenly_spaced(count: int, limit: int) -> None:
    rows = tables.spread(count, limit)
    gaps = np.diff(rows)
    assert gaps.max() - gaps.min() <= 1


@pytest.mark.parametrize(("count", "limit"), [(10, 0), (10, 10), (10, 11), (0, 5), (1, 1)])
def test_spread_keeps_every_row_when_the_limit_is_zero_or_covers_the_split(count: int, limit: int) -> None:
    assert tables.spread(count, limit) == list(range(count))


def test_spread_gives_the_same_rows_every_time() -> None:
    assert tables.spread(1000, 37) == tables.spread(1000, 37)


def test_spread_of_a_split_sorted_by_class_shows_every_class() -> None:
    labels = [label for label in range(4) for _ in range(250)]  # 1000 rows, sorted by class
    assert {labels[row] for row in tables.spread(len(labels), 4)} == {0, 1, 2, 3}


def test_spread_of_one_row_is_the_first() -> None:
    assert tables.spread(50, 1) == [0]


# ---- ragged and nested list columns ---------------------------------------------------------------------------


def ragged() -> pa.Table:
    return pa.table({"ids": [[1, 2, 3], [4], [5, 6]]})


def choices() -> pa.Table:
    """Two rows of two choices each: choices x tokens."""
    return pa.table({"ids": [[[1, 2], [3, 4, 5]], [[6], [7, 8]]]})


def test_row_lengths_of_a_ragged_column() -> None:
    assert tables.row_lengths(ragged(), "ids").tolist() == [3, 1, 2]


def test_lengths_of_a_ragged_column_map_back_to_their_rows() -> None:
    counts, row_of = tables.lengths(ragged(), "ids")
    assert counts.tolist() == [3, 1, 2]
    assert [row_of(index) for index in range(3)] == [0, 1, 2]


def test_flatten_gives_every_value_and_the_row_it_is_in() -> None:
    values, row_of = tables.flatten(ragged(), "ids")
    assert values.tolist() == [1, 2, 3, 4, 5, 6]
    assert [row_of(index) for index in range(6)] == [0, 0, 0, 1, 2, 2]


def test_flatten_skips_empty_and_missing_rows_when_it_names_a_row() -> None:
    table = pa.table({"ids": [[1], [], None, [2, 3]]})
    values, row_of = tables.flatten(table, "ids")
    assert values.tolist() == [1, 2, 3]
    assert [row_of(index) for index in range(3)] == [0, 3, 3]
    assert tables.row_lengths(table, "ids").tolist() == [1, 0, 0, 2]


def test_flatten_names_rows_across_chunks() -> None:
    table = pa.concat_tables([pa.table({"ids": [[1, 2], [3]]}), pa.table({"ids": [[4], [5, 6, 7]]})])
    assert table.column("ids").num_chunks == 2
    values, row_of = tables.flatten(table, "ids")
    assert values.tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert row_of(3) == 2
    assert row_of(6) == 3


def test_flatten_names_the_row_of_a_value_under_a_choices_axis() -> None:
    values, row_of = tables.flatten(choices(), "ids")
    assert values.tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [row_of(index) for index in range(8)] == [0, 0, 0, 0, 0, 1, 1, 1]


def test_lengths_under_a_choices_axis_are_per_choice_and_map_to_their_rows() -> None:
    counts, row_of = tables.lengths(choices(), "ids")
    assert counts.tolist() == [2, 3, 1, 2]
    assert [row_of(index) for index in range(4)] == [0, 0, 1, 1]


def test_row_lengths_under_a_choices_axis_are_each_row_s_longest_choice() -> None:
    assert tables.row_lengths(choices(), "ids").tolist() == [3, 2]


def test_row_lengths_count_a_row_without_choices_as_zero() -> None:
    table = pa.table({"ids": [[[1, 2]], []]})
    assert tables.row_lengths(table, "ids").tolist() == [2, 0]


def test_outer_lengths_count_each_row_s_choices() -> None:
    table = pa.table({"ids": [[[1, 2], [3, 4, 5]], [[6]], [[7], [8], [9]]]})
    assert tables.outer_lengths(table, "ids").tolist() == [2, 1, 3]


def test_scalar_column_has_one_value_per_row() -> None:
    table = pa.table({"label": [0, 2, 1]})
    assert tables.row_lengths(table, "label").tolist() == [1, 1, 1]
    values, row_of = tables.flatten(table, "label")
    assert values.tolist() == [0, 2, 1]
    assert row_of(2) == 2


def test_lengths_of_a_fixed_size_list_column() -> None:
    table = pa.table({"ids": pa.FixedSizeListArray.from_arrays(pa.array(range(6)), 3)})
    assert tables.row_lengths(table, "ids").tolist() == [3, 3]
    assert tables.flatten(table, "ids")[1](4) == 1


# ---- types ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("column_type", "levels"),
    [
        (pa.int64(), 0),
        (pa.list_(pa.int32()), 1),
        (pa.large_list(pa.int64()), 1),
        (pa.list_(pa.float32(), 4), 1),
        (pa.list_(pa.list_(pa.int64())), 2),
        (pa.list_(pa.list_(pa.list_(pa.float32()))), 3),
    ],
)
def test_depth_counts_list_levels(column_type: pa.DataType, levels: int) -> None:
    assert tables.depth(column_type) == levels


@pytest.mark.parametrize(
    "column_type", [pa.string(), pa.large_string(), pa.list_(pa.string()), pa.list_(pa.list_(pa.large_string()))]
)
def test_text_columns_are_text_at_any_depth(column_type: pa.DataType) -> None:
    assert tables.is_text(column_type)
    assert not tables.is_numeric(column_type)


@pytest.mark.parametrize(
    "column_type",
    [
        pa.int8(),
        pa.int64(),
        pa.uint16(),
        pa.float16(),
        pa.float64(),
        pa.bool_(),
        pa.list_(pa.int64()),
        pa.list_(pa.list_(pa.float32()), 2),
    ],
)
def test_number_columns_are_numeric_at_any_depth(column_type: pa.DataType) -> None:
    assert tables.is_numeric(column_type)
    assert not tables.is_text(column_type)


@pytest.mark.parametrize("column_type", [pa.binary(), pa.struct([("bytes", pa.binary())]), pa.null()])
def test_other_columns_are_neither_text_nor_numeric(column_type: pa.DataType) -> None:
    assert not tables.is_text(column_type)
    assert not tables.is_numeric(column_type)


def test_scalar_columns_are_those_of_one_number_or_flag_per_row() -> None:
    schema = pa.schema(
        [
            ("label", pa.int64()),
            ("score", pa.float32()),
            ("keep", pa.bool_()),
            ("text", pa.string()),
            ("input_ids", pa.list_(pa.int64())),
            ("image", pa.struct([("bytes", pa.binary())])),
        ]
    )
    assert tables.scalar_columns(schema) == ["label", "score", "keep"]
