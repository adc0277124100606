"""`pytest_trainer.tables` on what only the heavy libraries make: tensors and a `datasets.Dataset`.

Pinned: `from_columns` keeps what Arrow can hold (tensors of one shape, half precision, ragged rows) and names what it
cannot; `stored`/`stored_rows` read the rows as stored, not through a transform. The pure column facts are in
tests/unit/test_tables.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from datasets import Dataset

from pytest_trainer import tables

# ---- from_columns ---------------------------------------------------------------------------------------------


def test_from_columns_keeps_tensors_of_one_shape_as_fixed_size_lists() -> None:
    rows = [torch.arange(6).reshape(2, 3) + 10 * row for row in range(4)]
    table, opaque = tables.from_columns({"pixel_values": rows})
    assert opaque == []
    column = table.column("pixel_values")
    assert tables.depth(column.type) == 2
    assert column.to_pylist() == [row.tolist() for row in rows]


def test_from_columns_keeps_half_precision_tensors_as_floats() -> None:
    rows = [torch.full((3,), 0.5, dtype=torch.bfloat16), torch.full((3,), 1.5, dtype=torch.bfloat16)]
    table, opaque = tables.from_columns({"values": rows})
    assert opaque == []
    assert table.column("values").to_pylist() == [[0.5] * 3, [1.5] * 3]


def test_from_columns_keeps_ragged_rows_as_lists() -> None:
    columns: dict[str, list[Any]] = {
        "input_ids": [torch.tensor([1, 2, 3]), torch.tensor([4])],
        "label": [0, 1],
        "text": ["a b c", "d"],
        "mask": [np.array([1, 1, 1]), np.array([1])],
    }
    table, opaque = tables.from_columns(columns)
    assert opaque == []
    assert table.column("input_ids").to_pylist() == [[1, 2, 3], [4]]
    assert table.column("mask").to_pylist() == [[1, 1, 1], [1]]
    assert table.column("label").to_pylist() == [0, 1]
    assert tables.is_text(table.column("text").type)
    assert tables.row_lengths(table, "input_ids").tolist() == [3, 1]


def test_from_columns_names_the_columns_arrow_cannot_hold_and_keeps_the_others() -> None:
    columns: dict[str, list[Any]] = {"input_ids": [[1, 2], [3]], "mixed": [1, "one"], "objects": [object(), object()]}
    table, opaque = tables.from_columns(columns)
    assert sorted(opaque) == ["mixed", "objects"]
    assert table.column_names == ["input_ids"]


def test_from_columns_of_nothing_arrow_can_hold_is_an_empty_table() -> None:
    table, opaque = tables.from_columns({"objects": [object()]})
    assert table.num_columns == 0
    assert opaque == ["objects"]


# ---- stored rows of a datasets.Dataset ------------------------------------------------------------------------


def dataset_with_a_transform() -> Dataset:
    data = Dataset.from_dict({"input_ids": [[i] * (1 + i % 3) for i in range(10)], "label": list(range(10))})

    def transform(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return {"label": [value * 100 for value in batch["label"]]}

    data.set_transform(transform)
    return data


def test_stored_reads_at_most_limit_rows_as_stored_without_the_transform() -> None:
    table = tables.stored(dataset_with_a_transform(), 4)
    assert table.num_rows == 4
    assert table.column("label").to_pylist() == [0, 1, 2, 3]
    assert table.column("input_ids").to_pylist()[2] == [2, 2, 2]


def test_stored_rows_reads_the_rows_and_columns_asked_for_without_the_transform() -> None:
    table = tables.stored_rows(dataset_with_a_transform(), rows=[7, 2], columns=["label"])
    assert table.column_names == ["label"]
    assert table.column("label").to_pylist() == [7, 2]


def test_stored_rows_reads_every_row_when_none_are_named() -> None:
    assert tables.stored_rows(dataset_with_a_transform()).column("label").to_pylist() == list(range(10))
