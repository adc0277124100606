"""`targets`: what a causal-LM fine-tune really supervises, on batches made by the Trainer's own collator.

The worst bugs of LLM fine-tuning are silent: training runs and the loss falls while the model learns
the wrong thing. Rows spread over the training split are collated as the Trainer would and their
labels audited: rows with nothing to learn (a completion cut off by truncation, a response marker
that never matches), end-of-sequence tokens never supervised (pad = eos with a collator that masks
pad), labels shifted by hand for a model that shifts them itself, and prompt tokens trained under a
completion-only loss. The share of supervised tokens goes to the report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_trainer import diagnosis, tasks
from pytest_trainer.stages.base import Stage, StageResult, with_pictures
from pytest_trainer.tasks import IGNORE_INDEX

if TYPE_CHECKING:
    import numpy as np

    from pytest_trainer.families import Family
    from pytest_trainer.pipeline import Pipeline
    from pytest_trainer.tasks import Task

#: Rows of the training split, spread over it, collated in batches of the script's size.
SAMPLED_ROWS = 64
#: Labels count as shifted by hand when this share of them equals the next input token, and under half the same one.
SHIFTED = 0.9
#: Batch keys that mark the completion (or the assistant's turns) under a completion-only loss.
COMPLETION_MASKS = ("completion_mask", "assistant_masks")


def run(pipeline: Pipeline, device: str) -> StageResult:
    import pytest

    if pipeline.task.labels == tasks.REWARD:
        return rewards(pipeline, device)
    collated = [(_numpy(batch), samples) for samples, batch in pipeline.batches.spread(SAMPLED_ROWS)]
    tokenizer = getattr(pipeline.trainer, "processing_class", None)
    pad = getattr(getattr(tokenizer, "tokenizer", tokenizer), "pad_token_id", None)
    rows = [row for batch, samples in collated if "labels" in batch and "input_ids" in batch
            for row in _rows(batch, samples, pad)]
    if not rows:
        pytest.skip("the collated batches carry no labels of token ids: the model computes no loss from them to audit")
    supervised = sum(int(row.trained.sum()) for row in rows)
    real = sum(int(row.real.sum()) for row in rows)
    result = StageResult("targets", device, figures={
        "supervised_share": supervised / max(real, 1), "supervised_tokens": float(supervised),
        "rows_audited": float(len(rows)),
    })
    from pytest_trainer import vision_text  # image tokens: each row's count, and none of them supervised

    figures, notes = vision_text.audit(pipeline, collated, SAMPLED_ROWS)
    result.figures.update(figures)
    result.notes.extend(notes)
    check_rows_supervised(pipeline, rows)
    check_shift(pipeline, rows)
    check_prompt_unlabelled(pipeline, rows)
    eos_total, eos_trained = check_eos_supervised(pipeline, rows)
    result.figures.update({"eos_tokens": float(eos_total), "eos_supervised": float(eos_trained)})
    result.notes.append(f"{supervised} of {real} real tokens supervised ({supervised / max(real, 1):.0%}) "
                        f"in {len(rows)} rows; end-of-sequence tokens supervised: {eos_trained} of {eos_total}")
    return result


def rewards(pipeline: Pipeline, device: str) -> StageResult:
    """Online RL trains toward the rewards of sampled completions: they are audited instead of labels."""
    import pytest

    from pytest_trainer import reward_checks

    pipeline.batches.first()  # samples the completions and scores them
    sampled = pipeline.family.sampled
    if sampled is None or not sampled.completions:
        pytest.skip("the trainer sampled no completions to audit")
    result = StageResult("targets", device, pictures={"rewards": reward_checks.picture(sampled)})
    try:
        reward_checks.audit(sampled, result.figures, result.notes)
    except diagnosis.TrainerError as failure:
        with_pictures(failure, result)
        raise
    return result


class _Row:
    """One sequence as collated: its token ids, which positions are real (not padding), and which are trained.

    `prompt` marks the positions a completion-only loss must not train, where the batch or the dataset says so.
    """

    def __init__(self, ids: np.ndarray, labels: np.ndarray, real: np.ndarray, prompt: np.ndarray | None) -> None:
        self.ids, self.labels, self.real, self.prompt = ids, labels, real, prompt
        self.trained = (labels != IGNORE_INDEX) & real
        self.trained[:1] = False  # a causal LM predicts from the previous token: position 0 is never a target


def _numpy(batch: dict[str, Any]) -> dict[str, np.ndarray]:
    return {key: value.detach().cpu().numpy() for key, value in batch.items() if hasattr(value, "detach")}


def _rows(batch: dict[str, np.ndarray], samples: list[dict[str, Any]], pad: int | None = None) -> list[_Row]:
    """The sequences of a batch: its rows, or in a packed batch the runs where position_ids restart at 0 (a run of
    `pad` tokens alone, with no label, is the padding after the last one, not a sequence)."""
    import numpy as np

    ids, labels = batch["input_ids"], batch["labels"]
    if ids.ndim != 2 or labels.shape != ids.shape:
        return []
    mask = batch.get("attention_mask")
    real = mask.astype(bool) if mask is not None and mask.shape == ids.shape else np.ones_like(ids, dtype=bool)
    completion = next((batch[key] for key in COMPLETION_MASKS if key in batch and batch[key].shape == ids.shape), None)
    positions = batch.get("position_ids")
    rows = []
    for index in range(ids.shape[0]):
        prompt = None if completion is None else ~completion[index].astype(bool)
        if prompt is None and len(samples) == ids.shape[0]:
            prompt = _masked_by_dataset(samples[index], ids[index], real[index])
        starts = [0]
        if positions is not None and positions.shape == ids.shape and len(samples) > ids.shape[0]:
            starts = [int(start) for start in np.flatnonzero(positions[index] == 0)] or [0]
        for start, end in zip(starts, [*starts[1:], ids.shape[1]], strict=True):
            cut = slice(start, end)
            if len(starts) > 1 and pad is not None and (ids[index, cut] == pad).all() and \
                    (labels[index, cut] == IGNORE_INDEX).all():
                continue
            rows.append(_Row(ids[index, cut], labels[index, cut], real[index, cut].copy(),
                             None if prompt is None else prompt[cut]))
    return rows


def _masked_by_dataset(sample: dict[str, Any], ids: np.ndarray, real: np.ndarray) -> np.ndarray | None:
    """Positions whose label the dataset itself sets to -100 (a prompt), aligned with the collated row."""
    import numpy as np

    given_ids, given_labels = sample.get("input_ids"), sample.get("labels")
    if given_ids is None or given_labels is None:
        return None
    given_ids, given_labels = np.asarray(given_ids).reshape(-1), np.asarray(given_labels).reshape(-1)
    if given_ids.shape != given_labels.shape or not (given_labels == IGNORE_INDEX).any():
        return None
    offset = int(np.argmax(real)) if real.any() else 0  # left padding puts the sample after the pads
    if offset + given_ids.size > ids.size or not (ids[offset:offset + given_ids.size] == given_ids).all():
        return None  # the collator changed the tokens (truncated, packed): no alignment to compare
    masked = np.zeros(ids.shape, dtype=bool)
    masked[offset:offset + given_ids.size] = given_labels == IGNORE_INDEX
    return masked


def check_rows_supervised(pipeline: Pipeline, rows: list[_Row]) -> None:
    """Every row teaches something: a row whose labels are all -100 adds a loss of 0 (or NaN alone)."""
    empty = [index for index, row in enumerate(rows) if not row.trained.any()]
    if not empty:
        return
    row = rows[empty[0]]
    raise diagnosis.PipelineFailure(
        f"{len(empty)} of {len(rows)} sampled rows have no supervised token (their labels are all -100): they "
        "teach nothing, and a batch of only such rows gives a loss of NaN",
        "check that the completion survives truncation (raise max_length, or truncate the prompt), and that the "
        "response or assistant marker of a completion-only loss matches the tokenized text",
        [f"row as trained ([[...]] marks the supervised tokens): {marked(pipeline, row)}"],
    )


def check_shift(pipeline: Pipeline, rows: list[_Row]) -> None:
    """Causal-LM labels are the inputs themselves, which the model shifts: shifted twice, it learns the next but one."""
    import numpy as np

    if not pipeline.task.shifts_labels:
        return
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
            f"input token), but {type(pipeline.model).__name__} shifts them itself: it is trained to predict the "
            "token after next",
            "set labels = input_ids (a copy, -100 on padding); DataCollatorForLanguageModeling(tokenizer, mlm=False) "
            "does this",
            [f"row as trained: {marked(pipeline, row)}"],
        )


def check_prompt_unlabelled(pipeline: Pipeline, rows: list[_Row]) -> None:
    """Under a completion-only (or assistant-only) loss, no prompt token carries a label."""
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
        [f"row as trained: {marked(pipeline, row)}"],
    )


def check_eos_supervised(pipeline: Pipeline, rows: list[_Row]) -> tuple[int, int]:
    """Some real end-of-sequence token is a target, or the model never learns to stop."""
    processor = getattr(pipeline.trainer, "processing_class", None)
    tokenizer = getattr(processor, "tokenizer", processor)  # a multimodal processor holds the tokenizer
    eos = getattr(tokenizer, "eos_token_id", None)
    if not isinstance(eos, int):
        return 0, 0
    total = trained = 0
    for row in rows:
        at_eos = (row.ids == eos) & row.real
        at_eos[:1] = False
        total += int(at_eos.sum())
        trained += int((at_eos & row.trained).sum())
    if total and not trained and any(row.trained.any() for row in rows):
        row = next(row for row in rows if ((row.ids == eos) & row.real)[1:].any())
        pad = getattr(tokenizer, "pad_token_id", None)
        why = " (the tokenizer pads with the eos token, and the collator masks every pad id)" if pad == eos else ""
        raise diagnosis.PipelineFailure(
            f"no real end-of-sequence token is supervised (0 of {total} {getattr(tokenizer, 'eos_token', eos)!r} "
            "tokens in "
            f"{len(rows)} sampled rows carry a label){why}: the model never learns to stop",
            "give the tokenizer a pad token of its own (tokenizer.pad_token = '<|pad|>' or an unused reserved token; "
            "resize the embeddings if it is new), or keep the label of the final eos token",
            [f"row as trained: {marked(pipeline, row)}"],
        )
    return total, trained


def marked(pipeline: Pipeline, row: _Row, limit: int = 400) -> str:
    """The row's real tokens as text, with [[...]] around the supervised ones."""
    ids, trained = row.ids[row.real], row.trained[row.real]
    parts, start = [], 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or trained[end] != trained[start]:
            text = pipeline.decoded([int(token) for token in ids[start:end]]) or " ".join(map(str, ids[start:end]))
            parts.append(f"[[{text}]]" if trained[start] else text)
            start = end
    shown = " ".join(parts)
    return repr(shown if len(shown) <= limit else shown[:limit] + "...")


def applies(task: Task, family: Family) -> str | None:
    if (task.labels == tasks.TOKEN_IDS and task.shifts_labels) or task.labels == tasks.REWARD:
        return None
    return f"{task.name}: no causal-LM supervision to audit (the dataset stage checks these labels)"


STAGE = Stage("targets", rank=30, run=run, needs=("collate",), applies=applies,
              same_on_every_device="the audit reads the collated data, the same on every device")
