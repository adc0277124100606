"""Small built subjects for the checks' unit tests: a split fed as stored, and the pipeline's facts a split check reads.

`row`, `answer` and `text_row` build trained rows as `asked.view.rows_of` reads them off a collated batch, and `asked`
the view of them with the tokenizer's facts given (no tokenizer: no chat template to render). `StoredSplit` stands
where `fed_data.FedSplit` does for a `datasets.Dataset` without a transform: the table is every
row, row i is dataset row i. `Facts` stands where `pipeline.Pipeline` does for a check that reads the task and the
label column only: no trainer, no model (the model's facts read as unknown, as `model_facts` reads a model it cannot).
What a real Trainer and model add is held by the end-to-end tests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from pytest_trainer import tables
from pytest_trainer.asked.view import Asked, Row
from pytest_trainer.tasks import CHOICE, CLASS, POSITIONS, TOKEN_CLASS, Task
from pytest_trainer.tasks import IGNORE_INDEX as X

TEXT_CLASSES = Task("text classification", CLASS, "input_ids", classes=3)
TOKEN_CLASSES = Task(
    "token classification", TOKEN_CLASS, "input_ids", classes=5, auto_class="AutoModelForTokenClassification"
)
CHOICES = Task("multiple choice", CHOICE, "input_ids", nested=True)
QUESTIONS = Task("question answering", POSITIONS, "input_ids", positions=("start_positions", "end_positions"))


@dataclass
class StoredSplit:
    """A split fed as stored: every row of `table`, each its own dataset row."""

    table: pa.Table
    description: str = "training"
    given: Any = None
    transformed: bool = False
    removed: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, description: str = "training", **columns: Sequence[Any]) -> StoredSplit:
        return cls(pa.table({name: list(values) for name, values in columns.items()}), description)

    @property
    def whole(self) -> pa.Table:
        return self.table.select(tables.scalar_columns(self.table.schema))

    def row(self, position: int) -> int:
        return int(position)

    def column(self, name: str) -> tuple[pa.Table, Callable[[int], int]]:
        return self.table, int


@dataclass
class Facts:
    """What a split check reads of the pipeline, where it is only the task and the label column."""

    task: Task
    label: str | None = "labels"
    trainer: Any = None
    model: Any = None
    sources: list[Any] = field(default_factory=list)
    cuts: bool = False

    def label_column(self, table: pa.Table) -> str | None:
        return self.label if self.label in table.column_names else None


# ---- trained rows ----------------------------------------------------------------------------------------------

PAD, BOS, EOS, END_OF_TURN = 0, 1, 2, 3


def row(ids: Sequence[int], labels: Sequence[int], prompt: Sequence[bool] | None = None, **more: Any) -> Row:
    return Row(np.array(ids), np.array(labels), None if prompt is None else np.array(prompt, dtype=bool), **more)


def answer(prompt: Sequence[int], text: Sequence[int], end: Sequence[int] = (EOS,), trained_end: bool = True) -> Row:
    """A row of `prompt` (left out of the loss), the answer `text`, then `end` (trained or not)."""
    ids = [*prompt, *text, *end]
    labels = [X] * len(prompt) + list(text) + (list(end) if trained_end else [X] * len(end))
    return row(ids, labels)


def text_row(ids: Sequence[int], trained: Sequence[bool] | None = None) -> Row:
    """A plain language-modelling row: every token its own label, unless `trained` says otherwise."""
    keep = trained if trained is not None else [True] * len(ids)
    return row(ids, [token if kept else X for token, kept in zip(ids, keep, strict=True)])


def asked(rows: list[Row], **facts: Any) -> Asked:
    """The view of `rows`, with BOS, EOS and PAD the tokenizer's special tokens unless `facts` say otherwise."""
    facts.setdefault("bos", BOS)
    facts.setdefault("eos", EOS)
    facts.setdefault("pad", PAD)
    return Asked(rows, **facts)


def batch(**arrays: Sequence[Sequence[int]]) -> Mapping[str, np.ndarray]:
    return {key: np.array(value) for key, value in arrays.items()}
