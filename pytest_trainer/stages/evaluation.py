"""`eval`: the evaluation path the Trainer runs after each epoch, on a few batches of every split.

Eval-only crashes (an untokenized evaluation split, a metric bug) otherwise appear only after a
whole epoch of training. Each evaluation split gets the `dataset` checks first.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

from pytest_trainer import diagnosis
from pytest_trainer.stages.base import Stage, StageResult
from pytest_trainer.tasks import IGNORE_INDEX

if TYPE_CHECKING:
    from pytest_trainer.fed import FedSplit as Split
    from pytest_trainer.pipeline import Pipeline

#: Batches of each evaluation split run through the prediction step.
BATCHES = 2


def run(pipeline: Pipeline, device: str) -> StageResult:
    import pytest

    from pytest_trainer import data_checks

    splits = [split for split in pipeline.splits if split.description != "training"]
    result = StageResult("eval", device)
    for split in splits:
        data_checks.check_split(pipeline, split)
        metrics = _evaluate(pipeline, device, split)
        result.figures.update({f"{split.key or 'eval'}_{name}": value for name, value in metrics.items()})
    # The evaluator the trainer runs beside its eval loss (sentence-transformers'), after the splits' own checks.
    model = pipeline.model_on(device)
    model.eval()
    evaluated = pipeline.family.evaluator(pipeline.trainer, model)
    if not splits and evaluated is None:
        pytest.skip("the Trainer has no eval_dataset")
    if evaluated is not None:
        result.figures.update({f"evaluator_{name}": value for name, value in evaluated.items()})
        result.notes.append(f"the trainer's evaluator returned {', '.join(sorted(evaluated)) or 'no number'}")
    return result


def _evaluate(pipeline: Pipeline, device: str, split: Split) -> dict[str, float]:
    import torch
    from transformers import EvalPrediction
    from transformers.trainer_pt_utils import nested_concat, nested_numpify

    trainer = pipeline.trainer
    model = pipeline.model_on(device)
    model.eval()
    description = split.description
    with diagnosis.pipeline_part("the Trainer's eval dataloader"):
        loader = trainer.get_eval_dataloader(split.key if split.key is not None else split.given)
        batches = list(itertools.islice(loader, BATCHES))
    predictions: Any = None
    labels: Any = None
    for batch in batches:
        batch = {name: value.to(device) if torch.is_tensor(value) else value for name, value in batch.items()}
        with torch.no_grad(), diagnosis.pipeline_part("the Trainer's prediction step"):
            _, logits, label_ids = pipeline.family.predict(trainer, model, batch, device)
        if logits is not None and trainer.preprocess_logits_for_metrics is not None:
            with diagnosis.pipeline_part("preprocess_logits_for_metrics"):
                logits = trainer.preprocess_logits_for_metrics(logits, label_ids)
        if logits is not None:
            predictions = logits if predictions is None else \
                nested_concat(predictions, logits, padding_index=IGNORE_INDEX)
        if label_ids is not None:
            labels = label_ids if labels is None else nested_concat(labels, label_ids, padding_index=IGNORE_INDEX)
    if trainer.compute_metrics is None or predictions is None:
        return {}
    prediction = EvalPrediction(predictions=nested_numpify(predictions),
                                label_ids=nested_numpify(labels) if labels is not None else None)  # type: ignore[arg-type]
    try:
        metrics = trainer.compute_metrics(prediction)
    except Exception as error:
        shapes = f"predictions {_shapes(prediction.predictions)}, label_ids {_shapes(prediction.label_ids)}"
        if _holds_ignore_index(prediction) and isinstance(error, (OverflowError, IndexError, TypeError)):
            raise diagnosis.PipelineFailure(
                f"compute_metrics raised {type(error).__name__} on the {description} predictions ({shapes}): the "
                "label ids (and padded predictions) hold -100, which it decodes as a token id",
                "replace -100 before decoding: labels = np.where(labels != -100, labels, tokenizer.pad_token_id) "
                "(the same for predictions), then tokenizer.batch_decode(...)",
            ) from error
        raise diagnosis.PipelineFailure(
            f"compute_metrics raised {type(error).__name__} on the {description} predictions ({shapes}): {error}",
            "fix compute_metrics for predictions of these shapes: it would crash after the first epoch",
        ) from error
    if not isinstance(metrics, dict):
        raise diagnosis.PipelineFailure(
            f"compute_metrics returned {type(metrics).__name__}, not a dict of numbers",
            "return a dict such as {'accuracy': 0.8}",
        )
    bad = {name: value for name, value in metrics.items() if not _finite_number(value)}
    if bad:
        raise diagnosis.PipelineFailure(
            f"compute_metrics returned values that are not finite numbers: {bad}",
            "return plain finite numbers (float(...)); guard divisions by zero",
        )
    return {name: float(value) for name, value in metrics.items()}


def _holds_ignore_index(prediction: Any) -> bool:
    import numpy as np

    parts = [prediction.label_ids, prediction.predictions]
    arrays = [item for part in parts for item in (part if isinstance(part, (tuple, list)) else [part])]
    return any(isinstance(item, np.ndarray) and item.dtype.kind in "iu" and (item == IGNORE_INDEX).any()
               for item in arrays)


def _finite_number(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _shapes(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_shapes(item) for item in value) + ")"
    return str(getattr(value, "shape", type(value).__name__))


# What fails after the first epoch: the evaluation loop and compute_metrics.
STAGE = Stage("eval", rank=90, run=run, needs=("forward",))
