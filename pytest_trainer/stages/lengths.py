"""`lengths` (property): real rows at lengths up to the model's limit go through collator and forward.

A row is drawn from the whole split (the longest always in reach) and cut or repeated to a drawn length from 1 to
the model's position limit, then batched by the Trainer's own collator. Past the longest row read, where only
repeated rows reach, lengths are drawn far fewer and far between; the longest row at the limit itself is always tried
first (its failure is reported as is only when no drawn example fails). Lengths are not batched together: padding a
short row to a long one would hide what fails at its own length. Also checks that the tokenizer's truncation length
fits the model's positions, since a long example past them crashes training wherever it sits in the data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_trainer import diagnosis, model_facts
from pytest_trainer.catalogue import SETTINGS, checks
from pytest_trainer.losses import checked_loss, has_targets
from pytest_trainer.stages.base import Stage, StageResult, row_by_row

if TYPE_CHECKING:
    from pytest_trainer import strategies
    from pytest_trainer.pipeline import Pipeline

#: A tokenizer's model_max_length at or above this was never set (transformers uses a huge sentinel).
UNSET_MAX_LENGTH = 10**12


def run(pipeline: Pipeline, device: str) -> StageResult:
    import torch

    from pytest_trainer import strategies
    from pytest_trainer.explanations import pipeline_rows
    from pytest_trainer.property_runs import search

    strategies.require_sequences(pipeline)
    model_input = pipeline.task.sequence or ""
    risk = check_truncation_length(pipeline)
    model = pipeline.model_on(device)
    model.eval()

    def fits(example: strategies.ResizedBatch) -> None:
        try:
            batch = pipeline.batches.collate(list(example.features), device)
            with torch.no_grad():
                loss, _ = pipeline.loss_only(model, batch)
            if has_targets(batch, pipeline.task):
                checked_loss(loss)
        except Exception as error:
            if not diagnosis.owned_by_pipeline(error):
                raise
            found = pipeline_rows.explain(error, pipeline)
            rows = ("row " if len(example.rows) == 1 else "rows ") + ", ".join(map(str, example.rows))
            text = pipeline.decoded(example.features[0][model_input])
            first_line = str(error).splitlines()[0] if str(error) else ""
            cause = found.cause if found else f"{type(error).__name__}: {first_line}"
            raise diagnosis.PipelineFailure(
                f"{rows} resized to {_tokens(example.length)} fail: {cause}",
                found.fix if found else "make the collator and model accept every length up to the model's limit",
                [f"shortest failing row as text: {text!r}"] if text else [],
            ) from error

    longest = strategies.longest_rows(pipeline, 1)
    search(
        strategies.batches(pipeline, max_rows=1),
        fits,
        f"{pipeline.name}::lengths[{device}]",
        pipeline.settings.examples,
        explicit=[strategies.resized_batch(pipeline, longest, strategies.length_limit(pipeline))] if longest else [],
    )
    limit = model_facts.position_limit(pipeline.model)
    notes = [risk] if risk else []
    if limit is None:
        notes.append("no position limit: the model learns no table of absolute positions (rotary or relative ones)")
    return StageResult("lengths", device, figures={"position_limit": float(limit)} if limit else {}, notes=notes)


@checks("lengths", reads=SETTINGS)
def check_truncation_length(pipeline: Pipeline) -> str | None:
    """truncation=True cuts at the tokenizer's model_max_length: it must not exceed the model's positions.

    A length set larger than the positions is a wrong setting (a tokenizer of another checkpoint): it fails.
    An unset one is only a risk, since the dataset check has seen every row fit: it is a note.
    """
    tokenizer = getattr(pipeline.trainer, "processing_class", None)
    limit = model_facts.position_limit(pipeline.model)
    cap = getattr(tokenizer, "model_max_length", None)
    if limit is None or not isinstance(cap, int) or cap <= limit:
        return None
    if cap >= UNSET_MAX_LENGTH:
        return (
            f"the tokenizer has no model_max_length: every training row fits the model's {limit} positions, "
            f"but truncation=True without max_length would not cut a longer text to fit"
        )
    raise diagnosis.PipelineFailure(
        f"the tokenizer's model_max_length is {cap} but the model has {limit} positions: truncation=True "
        f"does not cut long texts to fit, and the first one longer than {limit} tokens crashes training",
        f"set tokenizer.model_max_length = {limit} (or tokenize with truncation=True, max_length={limit})",
    )


def _tokens(count: int) -> str:
    return f"{count} token" if count == 1 else f"{count} tokens"


STAGE = Stage("lengths", rank=130, run=run, needs=("forward",), applies=row_by_row)
