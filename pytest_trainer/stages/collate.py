"""`collate`: the Trainer's own train dataloader turns samples into a batch of tensors."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_trainer import diagnosis
from pytest_trainer.stages import StageResult

if TYPE_CHECKING:
    from pytest_trainer.pipeline import Pipeline


def run(pipeline: Pipeline, device: str) -> StageResult:
    import torch

    batch = pipeline.first_batch()
    loose = {key: type(value).__name__ for key, value in batch.items() if not torch.is_tensor(value)}
    if loose:
        listed = ", ".join(f"{key!r} ({kind})" for key, kind in loose.items())
        raise diagnosis.PipelineFailure(
            f"the collator's batch holds values that are not tensors: {listed}; the model cannot take them",
            "make the data collator return tensors (return_tensors='pt'), or drop those columns from the dataset",
        )
    on_device = pipeline.batch_on(device)
    sizes = {len(value) for value in batch.values() if value.dim() > 0}
    return StageResult(
        "collate", device, batch=on_device, figures={"batch_size": float(max(sizes, default=0))}
    )
