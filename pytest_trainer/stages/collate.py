"""`collate`: the Trainer's own train dataloader turns samples into a batch the model can take."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_trainer import diagnosis, model_facts, tasks
from pytest_trainer.stages import StageResult

if TYPE_CHECKING:
    from pytest_trainer.pipeline import Pipeline


def run(pipeline: Pipeline, device: str) -> StageResult:
    import torch

    batch = pipeline.first_batch()
    loose = {key: type(value).__name__ for key, value in batch.items() if not torch.is_tensor(value)}
    # A value that is no tensor is only wrong where the model names it as an input (it computes on it);
    # other values (a packing length, say) go to **kwargs or to a compute_loss of your own: forward judges them.
    named = model_facts.forward_parameters(pipeline.model) if pipeline.task.conventional else set()
    wrong = {key: kind for key, kind in loose.items() if key in named and isinstance(batch[key], (list, str))}
    if wrong:
        listed = ", ".join(f"{key!r} ({kind})" for key, kind in wrong.items())
        raise diagnosis.PipelineFailure(
            f"the collator's batch holds values that are not tensors: {listed}; the model cannot take them",
            "make the data collator return tensors (return_tensors='pt'), or drop those columns from the dataset",
        )
    check_target_padding(pipeline, batch)
    check_batch_tokens(pipeline, batch)
    on_device = pipeline.batch_on(device)
    main = batch.get(pipeline.task.sequence or "")
    sizes = [len(value) for value in ([main] if torch.is_tensor(main) else batch.values())
             if torch.is_tensor(value) and value.dim() > 0]
    result = StageResult("collate", device, batch=on_device, figures={"batch_size": float(max(sizes, default=0))})
    if loose:
        result.notes.append(f"values passed on as they are (not tensors): {', '.join(sorted(loose))}")
    return result


def check_batch_tokens(pipeline: Pipeline, batch: dict) -> None:
    """Token ids of the batch are rows of the input embedding (where the collator itself tokenizes, say)."""
    import torch

    rows = model_facts.vocabulary_rows(pipeline.model)
    if rows is None:
        return
    for key in pipeline.task.token_columns:
        ids = batch.get(key)
        if torch.is_tensor(ids) and not ids.dtype.is_floating_point and ids.numel() and int(ids.max()) >= rows:
            row = int(torch.nonzero(ids >= rows)[0][0])
            where = f" in row {row} of the first batch the collator made ({key!r})"
            raise diagnosis.token_beyond_vocabulary(int(ids.max()), rows, where)


def check_target_padding(pipeline: Pipeline, batch: dict) -> None:
    """Seq2seq targets the collator pads with the pad id instead of -100."""
    from pytest_trainer.task_checks import padded_targets

    labels = batch.get("labels")
    if pipeline.task.labels != tasks.DECODER_TARGETS or labels is None or not hasattr(labels, "numpy"):
        return
    values = labels.cpu().numpy()
    found = padded_targets(pipeline, values.reshape(-1))
    if found is not None:
        index, count = found
        row = index // values.shape[-1] if values.ndim > 1 else index
        raise diagnosis.pad_in_targets(
            int(values.reshape(-1)[index]), count, f"row {row} of the first batch the collator made"
        )
