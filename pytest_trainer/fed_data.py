"""The data as the Trainer feeds it: the one view of each split that every check reads.

What the model is fed is not what is stored. A split's samples are what its dataloader reads:
after the Trainer drops the columns the model's forward does not take, and after the dataset's own
transform (`set_transform`, `with_transform`) or a torch Dataset's `__getitem__`.

Two tables answer, both Arrow:

- `table`: the samples as fed, of rows spread evenly over the whole split (all of them when the
  split is small, and for a stored split up to `STORED_ROWS`; through a transform, as many as
  --trainer-sample keeps, since transforming is the costly part). Its row `i` is dataset row
  `row(i)`; `len(split)` is its row count and `samples(indices)` takes positions in it.
- `whole`: the one-number-per-row columns (class ids above all) that are fed as stored, read from
  the stored table over every row of the split, row `i` being dataset row `i`. A transform's
  column counts as fed as stored when its values on the sampled rows equal, row for row, those
  of a stored column; a computed column is never read from storage.

A label that appears only in the last rows of a split sorted by class is so found without running
the transform over every row.

`Batches` makes the batches the model is fed: the first of the Trainer's own train dataloader, drawn by the
trainer's family with a fixed seed, and batches of chosen training samples made by the Trainer's own collator.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from pytest_trainer import diagnosis, tables
from pytest_trainer.catalogue import SPLIT, checks

if TYPE_CHECKING:
    import pyarrow as pa
    from transformers import Trainer

    from pytest_trainer.families import Family

#: Rows read of a split whose stored table is what is fed, spread over it.
STORED_ROWS = 10_000
#: Rows transformed at once when a split's samples come from a transform.
TRANSFORM_BATCH = 64
#: Stored columns that hold a row as its author wrote it (a conversation, a prompt and its answer, a text).
STORED_TEXT = ("messages", "prompt", "completion", "tools", "chat_template_kwargs", "text")


class FedSplit:
    """One split (training, or an evaluation split) as the Trainer's dataloader feeds it."""

    def __init__(
        self, trainer: Trainer, description: str, key: str | None, dataset: Any, rows: int, keeps_columns: bool = False
    ) -> None:
        self.trainer = trainer
        #: Whether the trainer feeds every column (it removes none, whatever remove_unused_columns says).
        self.keeps_columns = keeps_columns
        self.description = description
        #: The name of an evaluation split given as a dict, else None.
        self.key = key
        #: The split as given to the Trainer.
        self.given = dataset
        #: Rows a transform is run on (0: all of them).
        self._rows = rows
        #: Columns whose values Arrow cannot hold (objects, mixed types): no whole-split check reads them.
        self.opaque: list[str] = []
        #: The dataset row of each row of `table` (None: row i is dataset row i).
        self._read: list[int] | None = None
        #: Columns of `table` fed as stored, and the stored column each one is.
        self._passed: dict[str, str] = {}

    @functools.cached_property
    def dataset(self) -> Any:
        """The split with the columns the Trainer drops already dropped, as its dataloader sees it."""
        import datasets

        if isinstance(self.given, datasets.Dataset) and not self.keeps_columns:
            with diagnosis.pipeline_part("the Trainer's removal of unused columns"), _as_before_training(self.trainer):
                return self.trainer._remove_unused_columns(self.given, description=self.description)
        return self.given

    @functools.cached_property
    def removed(self) -> list[str]:
        """Columns of the stored split that the Trainer drops before the transform and the collator see them."""
        stored = getattr(self.given, "column_names", None) or []
        kept = set(getattr(self.dataset, "column_names", None) or stored)
        return [name for name in stored if name not in kept]

    @functools.cached_property
    def transformed(self) -> bool:
        """Whether the samples are computed (a transform, a torch Dataset) rather than read from the stored table."""
        import datasets

        if not isinstance(self.given, datasets.Dataset):
            return True
        return (self.given.format.get("type") or "") == "custom"

    @functools.cached_property
    def table(self) -> pa.Table:
        """The fed samples of rows spread over the split, as one Arrow table (row i is dataset row `row(i)`)."""
        import datasets

        dataset = self.dataset
        if not self.transformed:
            self._read = tables.spread(len(dataset), STORED_ROWS)
            table = tables.stored_rows(dataset, self._read, self._shown(dataset))
            self._passed = {name: name for name in tables.scalar_columns(table.schema)}
            return table
        if isinstance(dataset, datasets.Dataset):
            self._read = tables.spread(len(dataset), self._rows)
            columns: dict[str, list[Any]] = {}
            for start in range(0, len(self._read), TRANSFORM_BATCH):
                with diagnosis.pipeline_part(f"the {self.description} dataset's transform"):
                    batch = dataset[self._read[start : start + TRANSFORM_BATCH]]
                for name, values in batch.items():
                    columns.setdefault(name, []).extend(values)
            table, self.opaque = tables.from_columns(columns)
            self._passed = self._stored_as(table)
            return table
        samples = self._python_samples
        if samples and not all(isinstance(sample, Mapping) for sample in samples):
            self.opaque = [f"samples of type {type(samples[0]).__name__}"]
            return tables.from_columns({})[0]
        kept = self._kept_keys(samples)
        table, self.opaque = tables.from_columns({name: [sample.get(name) for sample in samples] for name in kept})
        return table

    @functools.cached_property
    def whole(self) -> pa.Table:
        """The columns fed as stored that hold one number per row, read over every row of the split."""
        import pyarrow as pa

        passed = self._fed_as_stored()
        if not passed:
            return pa.table({})
        if not self.transformed and self.table.num_rows == len(self.dataset):
            return self.table.select(list(passed))
        stored = tables.stored_rows(self.dataset, None, sorted(set(passed.values())))
        return pa.table({name: stored.column(source) for name, source in passed.items()})

    def column(self, name: str) -> tuple[pa.Table, Callable[[int], int]]:
        """The table to check column `name` on, and the dataset row of each of its rows: every row of the split
        where the column is fed as stored (`whole`), else the spread samples (`table`)."""
        if name in self.whole.column_names:
            return self.whole, int
        return self.table, self.row

    def row(self, position: int) -> int:
        """The dataset row that row `position` of `table` (and of `samples`) was read from."""
        self.table  # noqa: B018 - reading the table decides which rows it holds
        return int(position) if self._read is None else self._read[position]

    def samples(self, indices: list[int]) -> list[dict[str, Any]]:
        """Samples as the collator receives them; `indices` are positions in `table` (0 to `len(self)` - 1), so the
        sample at position i is the one whose values `table` holds in row i (dataset row `row(i)`)."""
        if not self.transformed:
            table = self.table
            return [self._decoded(table.slice(index, 1).to_pylist()[0]) for index in indices]
        if self._is_iterable or not hasattr(self.dataset, "__getitem__"):
            return [dict(self._python_samples[index]) for index in indices]
        with diagnosis.pipeline_part(f"the {self.description} dataset's transform"):
            return [dict(self.dataset[self.row(index)]) for index in indices]

    def stored(self, indices: list[int]) -> list[dict[str, Any] | None]:
        """The stored conversation of the samples at `indices` (positions in `table`): the columns of `STORED_TEXT`
        the split holds, read as stored (before the Trainer drops any); None each where the split is no Arrow
        dataset or holds none of them."""
        import datasets

        columns = [name for name in STORED_TEXT if name in (getattr(self.given, "column_names", None) or [])]
        if not isinstance(self.given, datasets.Dataset) or not columns or not indices:
            return [None] * len(indices)
        rows = [self.row(index) for index in indices]
        return list(tables.stored_rows(self.given, rows, columns).to_pylist())

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def _decoded(self, row: dict[str, Any]) -> dict[str, Any]:
        """A stored row as the dataset reads it: images, audio and other encoded features decoded (an image
        column holds {"bytes", "path"} in storage and a PIL image in the row the collator gets)."""
        import datasets
        from datasets.features.features import require_decoding

        features = getattr(self.dataset, "features", None)
        if not isinstance(features, datasets.Features):
            return row
        encoded = {name: features[name] for name in row if name in features and require_decoding(features[name])}
        if not encoded:
            return row
        with diagnosis.pipeline_part(f"decoding the {self.description} dataset's {', '.join(encoded)} column"):
            decoded = datasets.Features(encoded).decode_example({name: row[name] for name in encoded})
        return {**row, **decoded}

    def _fed_as_stored(self) -> dict[str, str]:
        self.table  # noqa: B018 - reading the table finds which of its columns are fed as stored
        return self._passed

    @staticmethod
    def _shown(dataset: Any) -> list[str] | None:
        """The stored columns a plain format feeds: set_format(columns=...) feeds only those."""
        shown = dataset.format.get("columns")
        if not shown or dataset.format.get("output_all_columns"):
            return None
        return [name for name in dataset.column_names if name in shown]

    def _stored_as(self, table: pa.Table) -> dict[str, str]:
        """Columns of the transform's output that hold, on every sampled row, the values of a stored column.

        A column of the same name is tried first, then any other stored column of one number per row: a
        transform that renames `label` to `labels` still passes it through. Only such columns are read from
        storage over every row; one the transform computes (a remapped label, say) differs on some sampled
        row and is checked on the samples alone.
        """
        import pyarrow as pa

        stored_names = tables.scalar_columns(self.dataset.data.schema) if hasattr(self.dataset, "data") else []
        produced = [name for name in tables.scalar_columns(table.schema) if name not in self.opaque]
        if not stored_names or not produced or not table.num_rows:
            return {}
        assert self._read is not None
        stored = tables.stored_rows(self.dataset, self._read, stored_names)
        values = {name: stored.column(name).to_pylist() for name in stored_names}
        passed: dict[str, str] = {}
        for name in produced:
            fed = table.column(name).to_pylist()
            candidates = [name] if name in values else []
            candidates += [other for other in stored_names if other != name and other not in passed.values()]
            source = next((other for other in candidates if values[other] == fed), None)
            if source is not None and pa.types.is_boolean(table.schema.field(name).type) == pa.types.is_boolean(
                stored.schema.field(source).type
            ):
                passed[name] = source
        return passed

    @property
    def _is_iterable(self) -> bool:
        import torch

        return isinstance(self.dataset, torch.utils.data.IterableDataset) or not hasattr(self.dataset, "__len__")

    @functools.cached_property
    def _python_samples(self) -> list[Any]:
        """Samples of a dataset that is not Arrow-backed, read as its dataloader would: rows spread over it, or the
        first ones of a stream."""
        limit = self._rows or STORED_ROWS
        with diagnosis.pipeline_part(f"the {self.description} dataset's __getitem__"):
            if self._is_iterable:
                return list(itertools.islice(iter(self.dataset), limit))
            self._read = tables.spread(len(self.dataset), limit)
            return [self.dataset[index] for index in self._read]

    def _kept_keys(self, samples: list[Mapping[str, Any]]) -> list[str]:
        """Keys of the samples that the Trainer's column-removing collator keeps."""
        keys = list(dict.fromkeys(key for sample in samples for key in sample))
        if not self.trainer.args.remove_unused_columns or self.keeps_columns:
            return keys
        signature = set(signature_columns(self.trainer))
        kept = [key for key in keys if key in signature]
        return kept or keys


@contextmanager
def _as_before_training(trainer: Any) -> Iterator[None]:
    """The Trainer's signature columns as they were before the plugin asked for them, during and after the call.

    A trainer works its signature columns out once, on its first dataloader; a subclass may amend them each time it is
    asked (axolotl's packing removes attention_mask, and a second call finds none to remove). Each call of the plugin
    starts from the trainer's own state, so it meets the trainer as its first dataloader does.
    """
    held = getattr(trainer, "_signature_columns", None)
    trainer._signature_columns = None
    try:
        yield
    finally:
        trainer._signature_columns = held


def signature_columns(trainer: Any) -> list[str]:
    """The columns the Trainer's removal of unused columns keeps (the model's forward parameters and the labels), as
    the trainer works them out before training."""
    with _as_before_training(trainer):
        trainer._set_signature_columns_if_needed()
        return list(trainer._signature_columns or [])


def splits(trainer: Trainer, rows: int, keeps_columns: bool = False) -> list[FedSplit]:
    """The training split and every evaluation split, as fed (`keeps_columns`: by a trainer that removes none)."""
    found = (
        [FedSplit(trainer, "training", None, trainer.train_dataset, rows, keeps_columns)]
        if trainer.train_dataset is not None
        else []
    )
    evaluation = trainer.eval_dataset
    if isinstance(evaluation, dict):
        found += [
            FedSplit(trainer, f"evaluation {name!r}", name, split, rows, keeps_columns)
            for name, split in evaluation.items()
        ]
    elif evaluation is not None:
        found.append(FedSplit(trainer, "evaluation", None, evaluation, rows, keeps_columns))
    return found


#: What torch and the tokenizers say when a collator meets samples of different lengths that nothing padded.
UNEQUAL_LENGTHS = (
    "stack expects each tensor to be equal size",
    "expected sequence of length",
    "Unable to create tensor",
    "must be of equal size",
    "too many dimensions",
    "does not have a padding token",
)


def label_column(trainer: Trainer, table: pa.Table) -> str | None:
    """The column of `table` the Trainer feeds as labels (its label_names, else `label` or `label_ids`)."""
    names = [*(getattr(trainer, "label_names", None) or ["labels"]), "label", "label_ids"]
    return next((name for name in names if name in table.column_names), None)


def decoded(trainer: Trainer, token_ids: Any) -> str:
    """The text of token ids when the Trainer knows a tokenizer, else an empty string."""
    tokenizer = getattr(trainer, "processing_class", None)
    decode = getattr(tokenizer, "decode", None)
    while isinstance(token_ids, list) and token_ids and isinstance(token_ids[0], list):
        token_ids = token_ids[0]  # the first choice of a multiple-choice row
    if not callable(decode) or not isinstance(token_ids, list) or not token_ids:
        return ""
    return str(decode(token_ids))


class Batches:
    """The batches the model is fed: the first one of the train dataloader, and ones collated from chosen samples."""

    def __init__(
        self, trainer: Trainer, family: Family, training: Callable[[], FedSplit], label_collator: Callable[[], str]
    ) -> None:
        self.trainer, self.family = trainer, family
        self._training = training
        #: The collator that pads this task's per-token labels, named when nothing pads them.
        self._label_collator = label_collator
        self._first: dict[str, Any] | None = None

    def first(self) -> dict[str, Any]:
        """The first batch of the Trainer's own train dataloader, drawn with a fixed seed, on the CPU."""
        import torch

        if self._first is None:
            try:
                batch = self.family.draw(self.trainer)
            except (ValueError, TypeError, RuntimeError) as error:
                # Explaining is the plugin's own work, outside the pipeline's part: its bugs stay its own.
                problem = self.padding_problem() if any(sign in str(error) for sign in UNEQUAL_LENGTHS) else None
                if problem is None:
                    raise
                raise problem from error
            self._first = {key: value.cpu() if torch.is_tensor(value) else value for key, value in batch.items()}
        return self._first

    def first_on(self, device: str) -> dict[str, Any]:
        """The first batch on `device`."""
        return moved(self.first(), device)

    def collate(self, features: list[dict[str, Any]], device: str) -> dict[str, Any]:
        """A batch made by the Trainer's own collator, on `device`."""
        import datasets

        collator = self.trainer.data_collator
        if not isinstance(self.trainer.train_dataset, datasets.Dataset) and not self.family.keeps_columns:
            collator = self.trainer._get_collator_with_removed_columns(collator, description="training")
        with diagnosis.pipeline_part("the data collator"):
            batch = collator(features)
        return moved(batch, device)

    def rows(self, indices: list[int]) -> list[dict[str, Any]]:
        """Training samples as the collator receives them (`indices` are positions in the training table)."""
        return self._training().samples(indices)

    def spread(self, rows: int) -> list[tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any] | None]]]:
        """(samples, batch, stored) of the script's batch size, collated by the Trainer's own collator on the CPU
        from rows spread over the training split; `stored`: each sample's stored conversation (`FedSplit.stored`)."""
        indices = self.positions(rows)
        size = max(1, int(self.trainer.args.train_batch_size))
        found = []
        for start in range(0, len(indices), size):
            chosen = indices[start : start + size]
            samples = self.rows(chosen)
            found.append(
                (samples, self.collate([dict(sample) for sample in samples], "cpu"), self._training().stored(chosen))
            )
        return found

    def positions(self, rows: int) -> list[int]:
        """The positions in the training table of the rows `spread(rows)` collates, in its order."""
        import numpy as np

        count = len(self._training())
        return sorted({int(index) for index in np.linspace(0, count - 1, min(rows, count))}) if count else []

    def padding_problem(self) -> diagnosis.PipelineFailure | None:
        """Samples of different lengths that nothing pads, named with the lengths of the first rows."""
        import numpy as np

        if self.trainer.train_dataset is None:
            return None
        table = self._training().table
        first_rows = table.slice(0, max(2, self.trainer.args.train_batch_size))
        for column in first_rows.column_names:
            if (
                not tables.is_numeric(first_rows.schema.field(column).type)
                or tables.depth(first_rows.schema.field(column).type) == 0
            ):
                continue
            counts = tables.row_lengths(first_rows, column)
            if counts.size and np.unique(counts).size > 1:
                return unpadded(column, counts.tolist(), self.trainer, self._label_collator())
        return None


#: Batch keys of the sequence boundaries a packing (padding-free) collator passes to flash attention.
BOUNDARY_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "cu_seqlens", "seq_lengths")


def packed(batch: Mapping[str, Any], rows: int) -> str | None:
    """How a batch collated from `rows` samples shows that its collator packs them into one sequence (a packing or
    padding-free collator: transformers' DataCollatorWithFlattening, TRL's padding_free, axolotl's multipack), or
    None for a batch of one row per sample."""
    import torch

    boundaries = next((key for key in BOUNDARY_KEYS if key in batch), None)
    if boundaries is not None:
        return f"its batch holds the rows' boundaries ({boundaries})"
    ids, positions = batch.get("input_ids"), batch.get("position_ids")
    if torch.is_tensor(ids) and ids.dim() >= 2 and ids.shape[0] < rows:
        return f"it makes {ids.shape[0]} sequence of the {rows} rows it is given"
    if (
        torch.is_tensor(positions)
        and positions.dim() == 2
        and positions.shape[1] > 1
        and bool(((positions[:, 1:] == 0) & (positions[:, :-1] > 0)).any())
    ):
        return "its position_ids restart inside a sequence"
    return None


def moved(batch: Mapping[str, Any], device: str) -> dict[str, Any]:
    import torch

    return {key: value.to(device) if torch.is_tensor(value) else value for key, value in batch.items()}


@checks("collate", reads=SPLIT)
def unpadded(
    column: str, lengths: Sequence[int], trainer: Any, label_collator: str
) -> diagnosis.PipelineFailure | None:
    """Samples of unequal lengths that nothing pads; `label_collator` is the collator that pads this task's labels."""
    shown = ", ".join(str(length) for length in lengths[:8])
    tokenizer = getattr(trainer, "processing_class", None) or getattr(trainer, "tokenizer", None)
    if tokenizer is not None and getattr(tokenizer, "pad_token", "") is None:
        return diagnosis.PipelineFailure(
            f"samples of different lengths ({column} lengths of the first rows: {shown}) must be padded, "
            f"but the tokenizer ({type(tokenizer).__name__}) has no pad token",
            "give it one before building the Trainer: tokenizer.pad_token = tokenizer.eos_token "
            "(or tokenizer.add_special_tokens({'pad_token': '[PAD]'}) and model.resize_token_embeddings)",
        )
    if type(getattr(trainer, "data_collator", None)).__name__ == "DataCollatorWithPadding":
        return _labels_not_padded(trainer, column, shown, label_collator)
    return diagnosis.PipelineFailure(
        f"samples of different lengths ({column} lengths of the first rows: {shown}) reach a collator that "
        "does not pad them "
        f"({_collator_name(trainer)})",
        "pass the tokenizer to the Trainer (processing_class=tokenizer; tokenizer=tokenizer before "
        "transformers 4.46) or data_collator=DataCollatorWithPadding(tokenizer), or pad when tokenizing",
    )


def _labels_not_padded(trainer: Any, column: str, shown: str, collator: str) -> diagnosis.PipelineFailure | None:
    """DataCollatorWithPadding pads what the tokenizer makes, never labels: a collator that pads them is the fix."""
    names = [*(getattr(trainer, "label_names", None) or ["labels"]), "label"]
    rows = max(2, int(getattr(trainer.args, "train_batch_size", 2)))
    lengths: list[int] = []
    label = ""
    for name in names:
        try:
            values = trainer.train_dataset[:rows][name]
        except Exception:
            continue
        if values and all(isinstance(value, list) for value in values):
            label, lengths = name, [len(value) for value in values]
            break
    if label and len(set(lengths)) > 1:
        return diagnosis.PipelineFailure(
            f"the {label!r} of the first rows have different lengths ({', '.join(map(str, lengths[:8]))}): "
            "DataCollatorWithPadding pads the tokenizer's inputs but not labels, so a batch of labels cannot be made",
            f"use data_collator={collator}, which pads the labels with -100 beside the inputs",
        )
    tokenizer = getattr(trainer.data_collator, "tokenizer", None)
    if column in (getattr(tokenizer, "model_input_names", None) or ["input_ids", "attention_mask"]):
        return None  # the collator pads it: unequal lengths are not what failed
    return diagnosis.PipelineFailure(
        f"samples of different lengths ({column} lengths of the first rows: {shown}) reach DataCollatorWithPadding, "
        f"which pads only what the tokenizer makes, and {column!r} is not one of them",
        f"pad {column!r} when preprocessing, or give the Trainer a data_collator of your own that pads it",
    )


def _collator_name(trainer: Any) -> str:
    collator = trainer.data_collator
    name = getattr(collator, "__name__", type(collator).__name__)
    if name == "default_data_collator":
        return "the Trainer got no tokenizer, so it uses default_data_collator, which only stacks equal lengths"
    return name
