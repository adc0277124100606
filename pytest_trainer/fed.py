"""The data as the Trainer feeds it: the one view of each split that every check reads.

What the model is fed is not what is stored. A split's samples are what its dataloader reads:
after the Trainer drops the columns the model's forward does not take, and after the dataset's own
transform (`set_transform`, `with_transform`) or a torch Dataset's `__getitem__`. Where the stored
Arrow table *is* what is fed, it is read directly and checked whole, vectorised; otherwise the
transform runs over the first rows (as many as --trainer-sample keeps) in batches, and the result
is held as an Arrow table too, so every check reads one kind of table.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pytest_trainer import diagnosis, tables

if TYPE_CHECKING:
    import pyarrow as pa
    from transformers import Trainer

#: Rows read of a split whose stored table is what is fed: whole-split checks are cheap there.
STORED_ROWS = 10_000
#: Rows transformed at once when a split's samples come from a transform.
TRANSFORM_BATCH = 64


class FedSplit:
    """One split (training, or an evaluation split) as the Trainer's dataloader feeds it."""

    def __init__(self, trainer: Trainer, description: str, key: str | None, dataset: Any, rows: int) -> None:
        self.trainer = trainer
        self.description = description
        #: The name of an evaluation split given as a dict, else None.
        self.key = key
        #: The split as given to the Trainer.
        self.given = dataset
        #: Rows a transform is run on (0: all of them).
        self._rows = rows
        #: Columns whose values Arrow cannot hold (objects, mixed types): no whole-split check reads them.
        self.opaque: list[str] = []

    @functools.cached_property
    def dataset(self) -> Any:
        """The split with the columns the Trainer drops already dropped, as its dataloader sees it."""
        import datasets

        if isinstance(self.given, datasets.Dataset):
            with diagnosis.pipeline_part("the Trainer's removal of unused columns"):
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
        """The fed samples as one Arrow table: the whole split when stored, else its first transformed rows."""
        import datasets

        dataset = self.dataset
        if not self.transformed:
            table = tables.stored(dataset, STORED_ROWS)
            shown = dataset.format.get("columns")  # set_format(columns=...) feeds only those
            if shown and not dataset.format.get("output_all_columns"):
                table = table.select([name for name in shown if name in table.column_names])
            return table
        if isinstance(dataset, datasets.Dataset):
            count = len(dataset) if not self._rows else min(len(dataset), self._rows)
            columns: dict[str, list[Any]] = {}
            for start in range(0, count, TRANSFORM_BATCH):
                with diagnosis.pipeline_part(f"the {self.description} dataset's transform"):
                    batch = dataset[start:min(start + TRANSFORM_BATCH, count)]
                for name, values in batch.items():
                    columns.setdefault(name, []).extend(values)
        else:
            samples = self._python_samples
            if samples and not all(isinstance(sample, Mapping) for sample in samples):
                self.opaque = [f"samples of type {type(samples[0]).__name__}"]
                return tables.from_columns({})[0]
            kept = self._kept_keys(samples)
            columns = {name: [sample.get(name) for sample in samples] for name in kept}
        table, self.opaque = tables.from_columns(columns)
        return table

    def samples(self, indices: list[int]) -> list[dict[str, Any]]:
        """Samples as the collator receives them."""
        if not self.transformed:
            table = self.table
            return [table.slice(index, 1).to_pylist()[0] for index in indices]
        with diagnosis.pipeline_part(f"the {self.description} dataset's transform"):
            if hasattr(self.dataset, "__getitem__") and not self._is_iterable:
                return [dict(self.dataset[index]) for index in indices]
        return [dict(self._python_samples[index]) for index in indices]

    def __len__(self) -> int:
        return int(self.table.num_rows)

    @property
    def _is_iterable(self) -> bool:
        import torch

        return isinstance(self.dataset, torch.utils.data.IterableDataset) or not hasattr(self.dataset, "__len__")

    @functools.cached_property
    def _python_samples(self) -> list[Any]:
        """The first samples of a dataset that is not Arrow-backed, read as its dataloader would."""
        limit = self._rows or STORED_ROWS
        with diagnosis.pipeline_part(f"the {self.description} dataset's __getitem__"):
            if self._is_iterable:
                return list(itertools.islice(iter(self.dataset), limit))
            return [self.dataset[index] for index in range(min(len(self.dataset), limit))]

    def _kept_keys(self, samples: list[Mapping[str, Any]]) -> list[str]:
        """Keys of the samples that the Trainer's column-removing collator keeps."""
        keys = list(dict.fromkeys(key for sample in samples for key in sample))
        if not self.trainer.args.remove_unused_columns:
            return keys
        self.trainer._set_signature_columns_if_needed()
        signature: set[str] = set(self.trainer._signature_columns or [])
        kept = [key for key in keys if key in signature]
        return kept or keys


def splits(trainer: Trainer, rows: int) -> list[FedSplit]:
    """The training split and every evaluation split, as fed."""
    found = [FedSplit(trainer, "training", None, trainer.train_dataset, rows)] if trainer.train_dataset is not None \
        else []
    evaluation = trainer.eval_dataset
    if isinstance(evaluation, dict):
        found += [FedSplit(trainer, f"evaluation {name!r}", name, split, rows) for name, split in evaluation.items()]
    elif evaluation is not None:
        found.append(FedSplit(trainer, "evaluation", None, evaluation, rows))
    return found
