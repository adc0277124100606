"""`eval`: the evaluation path the Trainer runs after each epoch, on a few batches of every split.

Eval-only crashes (an untokenized evaluation split, a metric bug) otherwise appear only after a
whole epoch of training. Each evaluation split gets the `dataset` checks first.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from pytest_trainer import diagnosis, metric_settings
from pytest_trainer.catalogue import SPLIT, checks
from pytest_trainer.stages.base import Stage, StageResult, with_pictures
from pytest_trainer.tasks import IGNORE_INDEX

if TYPE_CHECKING:
    from pytest_trainer.fed_data import FedSplit as Split
    from pytest_trainer.pipeline import Pipeline

#: Batches of each evaluation split run through the prediction step.
BATCHES = 2
#: Share of an evaluation split's references that a generation length cuts, from which the metrics read mostly cut
#: predictions: a failure. Below it, the references cut are a note.
MOSTLY_CUT = 0.5
#: The length generate() takes where no setting gives one.
DEFAULT_MAX_LENGTH = 20


def generation_limit(trainer: Any, model: Any) -> tuple[int, str] | None:
    """The most target tokens an encoder-decoder's generated prediction holds when evaluation generates
    (`predict_with_generate` with metrics to compute), and the setting that says so; None where it does not generate.

    `max_length` counts the decoder's start token, so it leaves one token fewer for the target (its end token
    included); `max_new_tokens` counts the target's alone. Seq2SeqTrainer takes `generation_max_length`, else the
    model's generation config (whose `max_length` is 20 unless set)."""
    args = trainer.args
    if not getattr(args, "predict_with_generate", False) or trainer.compute_metrics is None:
        return None
    if hasattr(trainer, "_gen_kwargs") or not getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return None  # settings given to evaluate() itself, or a decoder whose length counts the prompt
    given = getattr(args, "generation_max_length", None)
    if given:
        return int(given) - 1, f"generation_max_length={given}"
    generation: Any = getattr(model, "generation_config", None)
    if getattr(generation, "max_new_tokens", None):
        return int(generation.max_new_tokens), f"the generation config's max_new_tokens={generation.max_new_tokens}"
    length = getattr(generation, "max_length", None)
    if not length:  # transformers 5 leaves it unset, and generate() takes its default
        return DEFAULT_MAX_LENGTH - 1, f"generate()'s default max_length={DEFAULT_MAX_LENGTH}: no setting gives one"
    default = " (the default: generation_max_length is not set)" if length == DEFAULT_MAX_LENGTH else ""
    return int(length) - 1, f"the generation config's max_length={length}{default}"


@checks("eval", reads=SPLIT)
def check_generation_length(pipeline: Pipeline, split: Split, limit: int, setting: str) -> list[str]:
    """Evaluation that generates must not cut most predictions below their references: the metrics would compare
    cut text with whole references. Fewer cut references are a note."""
    import numpy as np

    from pytest_trainer import tables

    column = pipeline.label_column(split.table)
    if column is None or tables.depth(split.table.schema.field(column).type) != 1:
        return []
    values, _ = tables.flatten(split.table, column)
    counts, _ = tables.lengths(split.table, column)
    if not counts.size or values.dtype.kind not in "iu":
        return []
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    ignored = np.add.reduceat((values == IGNORE_INDEX).astype(np.int64), starts) if values.size else counts * 0
    lengths = counts - np.where(counts > 0, ignored, 0)
    cut = lengths > limit
    if not cut.any():
        return []
    line = (
        f"{int(cut.sum())} of the {lengths.size} reference targets of the {split.description} dataset are longer than "
        f"the {limit} tokens evaluation generates ({setting}; median {int(np.median(lengths))} tokens, longest "
        f"{int(lengths.max())})"
    )
    if cut.mean() < MOSTLY_CUT:
        return [f"evaluation: {line}: their predictions are cut"]
    raise diagnosis.Finding(
        f"{line}: every such prediction is cut before its end, so the metrics compare cut text with whole references",
        "let evaluation generate as long as the references: "
        f"generation_max_length={math.ceil(np.percentile(lengths, 95)) + 1} in Seq2SeqTrainingArguments "
        "(or max_new_tokens in the model's generation_config)",
    )


def run(pipeline: Pipeline, device: str) -> StageResult:
    from pytest_trainer import fed_checks

    splits = [split for split in pipeline.splits if split.description != "training"]
    result = StageResult("eval", device)
    returned: list[metric_settings.Evaluated] = []
    limit = generation_limit(pipeline.trainer, pipeline.model)
    found: list[diagnosis.Finding] = []  # raised after every split has run, so that none hides an evaluation error
    for split in splits:
        fed_checks.check_split(pipeline, split)
        if limit is not None:
            try:
                result.notes.extend(check_generation_length(pipeline, split, *limit))
            except diagnosis.Finding as finding:
                found.append(finding)
        try:
            metrics, loss = _evaluate(pipeline, device, split, found)
        except diagnosis.TrainerError as failure:
            raise diagnosis.also(failure, found) from failure.__cause__
        result.figures.update({f"{split.key or 'eval'}_{name}": value for name, value in metrics.items()})
        returned.append(
            metric_settings.Evaluated("eval" if split.key is None else f"eval_{split.key}", loss, tuple(metrics))
        )
    # The evaluator the trainer runs beside its eval loss (sentence-transformers'), after the splits' own checks.
    model = pipeline.model_on(device)
    model.eval()
    evaluated = pipeline.family.evaluator(pipeline.trainer, model)
    note = _check_settings(pipeline, returned, [*(evaluated or {}), *_logged(pipeline.trainer)])
    if not splits and evaluated is None:
        pytest.skip("the Trainer has no eval_dataset")
    if evaluated is not None:
        result.figures.update({f"evaluator_{name}": value for name, value in evaluated.items()})
        result.notes.append(f"the trainer's evaluator returned {', '.join(sorted(evaluated)) or 'no number'}")
    result.notes.extend([note] if note else [])
    if found:
        raise with_pictures(diagnosis.combined(found), result)
    return result


def _findings(check: Callable[[], None]) -> list[diagnosis.Finding]:
    try:
        check()
    except diagnosis.Finding as finding:
        return [finding]
    return []


def _check_settings(pipeline: Pipeline, splits: list[metric_settings.Evaluated], logged: list[str]) -> str | None:
    """The settings that read the evaluation's metrics (metric_for_best_model, ...), against what it returned."""
    trainer = pipeline.trainer
    names = [split.prefix.removeprefix("eval_") for split in splits if split.prefix != "eval"]
    return metric_settings.check(
        trainer.args,
        list(getattr(getattr(trainer, "callback_handler", None), "callbacks", [])),
        metric_settings.returned(splits, logged),
        splits=names,
        computes_metrics=trainer.compute_metrics is not None,
        unknown=_own_metrics(trainer),
    )


def _logged(trainer: Any) -> list[str]:
    """The metrics a TRL trainer logs into each evaluation's metrics, as its prediction steps recorded them."""
    recorded = getattr(trainer, "_metrics", None)
    return list(recorded.get("eval", {})) if isinstance(recorded, dict) else []


#: Libraries whose trainers' own evaluation metrics `_logged` and the evaluator read.
KNOWN = ("transformers", "trl", "sentence_transformers")


def _own_metrics(trainer: Any) -> list[str]:
    """Trainer classes of another library or the script that override how an evaluation's metrics are made."""
    found = []
    for cls in type(trainer).__mro__:
        overrides = {"evaluate", "evaluation_loop", "log", "_determine_best_metric"} & set(vars(cls))
        if overrides and cls.__module__.split(".")[0] not in KNOWN:
            found.append(f"{cls.__name__}.{sorted(overrides)[0]}")
    return found


def _evaluate(
    pipeline: Pipeline, device: str, split: Split, found: list[diagnosis.Finding]
) -> tuple[dict[str, float], bool]:
    """The metrics compute_metrics returns on a few batches of `split`, and whether the prediction step gave a loss;
    the findings of its batches (random transforms, images normalized otherwise than the processor does) go to
    `found`."""
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
        again = next(iter(trainer.get_eval_dataloader(split.key if split.key is not None else split.given)), None)
    predictions: Any = None
    labels: Any = None
    loss = False
    for batch in batches:
        batch = {name: value.to(device) if torch.is_tensor(value) else value for name, value in batch.items()}
        with torch.no_grad(), diagnosis.pipeline_part("the Trainer's prediction step"):
            step_loss, logits, label_ids = pipeline.family.predict(trainer, model, batch, device)
        loss = loss or step_loss is not None
        if logits is not None and trainer.preprocess_logits_for_metrics is not None:
            with diagnosis.pipeline_part("preprocess_logits_for_metrics"):
                logits = trainer.preprocess_logits_for_metrics(logits, label_ids)
        if logits is not None:
            predictions = (
                logits if predictions is None else nested_concat(predictions, logits, padding_index=IGNORE_INDEX)
            )
        if label_ids is not None:
            labels = label_ids if labels is None else nested_concat(labels, label_ids, padding_index=IGNORE_INDEX)
    from pytest_trainer import pixels

    if batches and again is not None:
        found.extend(_findings(lambda: pixels.check_repeatable(batches[0], again, description)))
        found.extend(_findings(lambda: pixels.check_normalized(pipeline, batches[0], description)))
    if trainer.compute_metrics is None or predictions is None or labels is None:
        return {}, loss  # as the Trainer's evaluation loop: compute_metrics is called with predictions and labels
    prediction = EvalPrediction(predictions=nested_numpify(predictions), label_ids=nested_numpify(labels))
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
    return {name: float(value) for name, value in metrics.items()}, loss


def _holds_ignore_index(prediction: Any) -> bool:
    import numpy as np

    parts = [prediction.label_ids, prediction.predictions]
    arrays = [item for part in parts for item in (part if isinstance(part, (tuple, list)) else [part])]
    return any(
        isinstance(item, np.ndarray) and item.dtype.kind in "iu" and (item == IGNORE_INDEX).any() for item in arrays
    )


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
