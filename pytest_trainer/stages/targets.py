"""`targets`: what a fine-tune really trains, on batches made by the Trainer's own collator, against what the
model will be asked.

The worst bugs of LLM fine-tuning are silent: training runs and the loss falls while the model learns the wrong
thing. Rows spread over the training split are collated as the Trainer would and read once into the `asked` view
(`pytest_trainer.asked`): rows with nothing to learn, labels shifted by hand for a model that shifts them itself,
prompt tokens trained under a completion-only loss, answers that do not end on a token generation stops at or that
truncation cuts, a doubled BOS, a prompt other than the one the chat template gives at inference, and turns,
reasoning or tool calls the template drops. Preference pairs are compared as truncated; online RL's sampled
completions and rewards are audited instead of labels. The share of supervised tokens goes to the report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from pytest_trainer import diagnosis, schema, tasks
from pytest_trainer.catalogue import BATCH, checks
from pytest_trainer.stages.base import Stage, StageResult, with_pictures

if TYPE_CHECKING:
    import numpy as np

    from pytest_trainer.asked.view import Asked
    from pytest_trainer.families import Family
    from pytest_trainer.pipeline import Pipeline
    from pytest_trainer.tasks import Task

#: Rows of the training split, spread over it, collated in batches of the script's size.
SAMPLED_ROWS = 64
#: Labels count as shifted by hand when this share of them equals the next input token, and under half the same one.
SHIFTED = 0.9


def run(pipeline: Pipeline, device: str) -> StageResult:
    from pytest_trainer.asked import checks
    from pytest_trainer.asked.view import Asked, rows_of

    if pipeline.task.labels == tasks.REWARD:
        return rewards(pipeline, device)
    if pipeline.task.labels == tasks.PREFERENCE:
        return preferences(pipeline, device)
    collated = [(_numpy(batch), samples, stored) for samples, batch, stored in pipeline.batches.spread(SAMPLED_ROWS)]
    tokenizer = getattr(pipeline.trainer, "processing_class", None)
    pad = getattr(getattr(tokenizer, "tokenizer", tokenizer), "pad_token_id", None)
    rows = [
        row
        for batch, samples, stored in collated
        if "labels" in batch and "input_ids" in batch
        for row in rows_of(batch, samples, stored, pad)
    ]
    if not rows:
        pytest.skip("the collated batches carry no labels of token ids: the model computes no loss from them to audit")
    asked = Asked.of(pipeline.trainer, pipeline.model, rows)
    supervised = sum(int(row.trained.sum()) for row in rows)
    real = sum(len(row) for row in rows)
    result = StageResult(
        "targets",
        device,
        figures={
            "supervised_share": supervised / max(real, 1),
            "supervised_tokens": float(supervised),
            "rows_audited": float(len(rows)),
        },
    )
    from pytest_trainer import vision_text  # image tokens: each row's count, and none of them supervised

    figures, notes = vision_text.audit(pipeline, [(batch, samples) for batch, samples, _ in collated], SAMPLED_ROWS)
    result.figures.update(figures)
    result.notes.extend(notes)
    check_rows_supervised(asked)
    if pipeline.task.shifts_labels:
        check_shift(asked, type(pipeline.model).__name__)
    check_prompt_unlabelled(asked)
    from pytest_trainer.report import pictures

    shown = pictures.trained_and_asked(asked)
    if shown:
        result.pictures["asked"] = shown
    ends: dict[str, tuple[int, int]] = {}
    try:
        diagnosis.findings_last(
            [
                lambda: checks.check_doubled_bos(asked),
                lambda: checks.check_prompt_as_asked(asked),
                lambda: ends.update(answers=checks.check_answer_ends(asked, result.notes)),
                lambda: ends.update(texts=checks.check_eos_of_texts(asked)),
                lambda: checks.check_answers_trained(asked),
            ]
        )
    except diagnosis.Finding as found:
        raise with_pictures(found, result) from None
    eos_total, eos_trained = ends.get("texts", (0, 0))
    answers, stopped = ends.get("answers", (0, 0))
    result.figures.update({"eos_tokens": float(eos_total), "eos_supervised": float(eos_trained)})
    line = (
        f"{supervised} of {real} real tokens supervised ({supervised / max(real, 1):.0%}) in {len(rows)} rows; "
        f"end-of-sequence tokens supervised: {eos_trained} of {eos_total}"
    )
    if answers:
        result.figures.update({"answers": float(answers), "answers_ending_on_a_stop_token": float(stopped)})
        line += f"; answers ending on a token generation stops at: {stopped} of {answers}"
    result.notes.append(line)
    return result


def preferences(pipeline: Pipeline, device: str) -> StageResult:
    """Preference training learns from the difference between chosen and rejected answers, as truncated."""
    from pytest_trainer.asked import pairs
    from pytest_trainer.asked.view import Asked

    found = [
        (chosen, rejected, sample)
        for samples, batch, _ in pipeline.batches.spread(SAMPLED_ROWS)
        for (chosen, rejected), sample in zip(pairs.answers(_numpy(batch), len(samples)), samples, strict=False)
    ]
    if not found:
        pytest.skip(
            "the preference batches hold no chosen and rejected answers side by side to compare (unpaired "
            "preferences, or a layout this stage does not read)"
        )
    result = StageResult("targets", device, figures={"pairs_audited": float(len(found))})
    asked = Asked.of(pipeline.trainer, pipeline.model, [])
    pairs.check_pairs_differ(found, asked.max_length, asked.text, result.notes)
    result.figures["pairs_the_same"] = float(sum(chosen == rejected for chosen, rejected, _ in found))
    return result


def rewards(pipeline: Pipeline, device: str) -> StageResult:
    """Online RL trains toward the rewards of sampled completions: they are audited instead of labels."""
    from pytest_trainer import reward_checks

    pipeline.batches.first()  # samples the completions and scores them
    sampled = pipeline.family.sampled
    if sampled is None or not sampled.completions:
        pytest.skip("the trainer sampled no completions to audit")
    result = StageResult(
        "targets",
        device,
        pictures={"rewards": reward_checks.picture(sampled)},
        measured=schema.Sampling(sampled.seconds),
    )
    try:
        reward_checks.audit(sampled, result.figures, result.notes)
    except diagnosis.TrainerError as failure:
        with_pictures(failure, result)
        raise
    return result


def _numpy(batch: dict[str, Any]) -> dict[str, np.ndarray]:
    return {key: value.detach().cpu().numpy() for key, value in batch.items() if hasattr(value, "detach")}


@checks("targets", reads=BATCH)
def check_rows_supervised(asked: Asked) -> None:
    """Every row teaches something: a row whose labels are all -100 adds a loss of 0 (or NaN alone)."""
    rows = asked.rows
    empty = [index for index, row in enumerate(rows) if not row.trained.any()]
    if not empty:
        return
    row = rows[empty[0]]
    raise diagnosis.PipelineFailure(
        f"{len(empty)} of {len(rows)} sampled rows have no supervised token (their labels are all -100): they "
        "teach nothing, and a batch of only such rows gives a loss of NaN",
        "check that the completion survives truncation (raise max_length, or truncate the prompt), and that the "
        "response or assistant marker of a completion-only loss matches the tokenized text",
        [f"row as trained ([[...]] marks the supervised tokens): {asked.marked(row)}"],
    )


@checks("targets", reads=BATCH)
def check_shift(asked: Asked, model: str) -> None:
    """Causal-LM labels are the inputs themselves, which the model shifts: shifted twice, it learns the next but one.

    `model` is the name of the model's class, which shifts the labels itself."""
    import numpy as np

    rows = asked.rows
    same = ahead = count = 0
    for row in rows:
        positions = np.flatnonzero(row.trained[:-1])
        same += int((row.labels[positions] == row.ids[positions]).sum())
        ahead += int((row.labels[positions] == row.ids[positions + 1]).sum())
        count += positions.size
    if count and ahead >= SHIFTED * count and same < count / 2:
        row = next(row for row in rows if row.trained.any())
        raise diagnosis.PipelineFailure(
            f"the labels are the inputs shifted left by one ({ahead} of {count} supervised labels equal the next "
            f"input token), but {model} shifts them itself: it is trained to predict the "
            "token after next",
            "set labels = input_ids (a copy, -100 on padding); DataCollatorForLanguageModeling(tokenizer, mlm=False) "
            "does this",
            [f"row as trained: {asked.marked(row)}"],
        )


@checks("targets", reads=BATCH)
def check_prompt_unlabelled(asked: Asked) -> None:
    """Under a completion-only (or assistant-only) loss, no prompt token carries a label."""
    rows = asked.rows
    leaked = [(row, int((row.trained & row.prompt).sum())) for row in rows if row.prompt is not None]
    leaked = [(row, count) for row, count in leaked if count]
    if not leaked:
        return
    row, _ = leaked[0]
    total = sum(count for _, count in leaked)
    raise diagnosis.PipelineFailure(
        f"{total} prompt tokens carry labels in {len(leaked)} of {len(rows)} sampled rows although the data marks "
        "them as prompt (labels -100 in the dataset, or outside the completion_mask): the collator trains the model "
        "to write the prompt too",
        "keep the dataset's labels in the collator and pad them with -100 instead of copying input_ids (TRL's own "
        "collators do, with completion_only_loss=True or assistant_only_loss=True)",
        [f"row as trained: {asked.marked(row)}"],
    )


def applies(task: Task, family: Family) -> str | None:
    if (task.labels == tasks.TOKEN_IDS and task.shifts_labels) or task.labels in (tasks.REWARD, tasks.PREFERENCE):
        return None
    return f"{task.name}: no causal-LM supervision to audit (the dataset stage checks these labels)"


STAGE = Stage(
    "targets",
    rank=30,
    run=run,
    needs=("collate",),
    applies=applies,
    same_on_every_device="the audit reads the collated data, the same on every device",
)
