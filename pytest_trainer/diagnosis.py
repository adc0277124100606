"""Pipeline failures in the user's terms: what is wrong, why it breaks training, and the fix.

Checks raise `PipelineFailure` directly when they find a problem; `explain` turns an exception
raised by the libraries (an IndexError deep in a loss, a tensor that cannot be built) into one,
using what the pipeline knows about its data and model.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any


class PipelineFailure(Exception):
    """A pipeline problem found by a stage, with its cause and its fix."""

    def __init__(self, cause: str, fix: str, details: Sequence[str] = ()) -> None:
        self.cause, self.fix, self.details = cause, fix, tuple(details)
        super().__init__(self.render())

    def render(self) -> str:
        lines = [self.cause, f"  fix: {self.fix}", *(f"  {line}" for line in self.details)]
        return "\n".join(lines)


def labels_beyond_head(
    low: int, high: int, width: int, where: str = "", auto_class: str = "AutoModelForSequenceClassification"
) -> PipelineFailure:
    classes = high + 1
    return PipelineFailure(
        f"labels range {low}..{high} ({classes} classes) but the model has {width} outputs{where}",
        f"pass num_labels={classes} when building the model, e.g. "
        f"{auto_class}.from_pretrained(..., num_labels={classes})",
    )


def negative_label(value: int, where: str) -> PipelineFailure:
    return PipelineFailure(
        f"label {value}{where} is negative: class ids run from 0 to num_labels - 1",
        "map the labels to 0..C-1 (use -100 only for positions the loss must ignore)",
    )


def token_beyond_vocabulary(token_id: int, rows: int, where: str) -> PipelineFailure:
    return PipelineFailure(
        f"token id {token_id}{where} but the model's input embedding has {rows} rows (ids 0..{rows - 1})",
        "tokenize with the model's own tokenizer; if you added tokens to it, call "
        "model.resize_token_embeddings(len(tokenizer)) before building the Trainer",
    )


def sequence_too_long(length: int, limit: int, where: str) -> PipelineFailure:
    return PipelineFailure(
        f"a sequence of {length} tokens{where} but the model has only {limit} positions",
        f"tokenize with truncation=True (and max_length={limit} or less)",
    )


def untokenized(split: str, text_columns: Sequence[str], model_input: str) -> PipelineFailure:
    quoted = ", ".join(repr(name) for name in text_columns)
    call_args = ", ".join(f'batch["{name}"]' for name in text_columns[:2])
    return PipelineFailure(
        f"the {split} dataset has text columns {quoted} but no {model_input!r}: "
        "the model reads token ids, not text, so the Trainer was given the raw, untokenized split",
        f"tokenize it first, e.g. tokenized = raw.map(lambda batch: tokenizer({call_args}, truncation=True), "
        f"batched=True), and pass the tokenized split to the Trainer",
    )


def missing_input(split: str, model_input: str, columns: Sequence[str]) -> PipelineFailure:
    return PipelineFailure(
        f"the {split} dataset has no {model_input!r} column, which the model needs "
        f"(columns the Trainer keeps: {', '.join(columns) or 'none'})",
        f"produce {model_input!r} in your preprocessing, or if the column has another name, "
        "rename it with dataset.rename_column(...)",
    )


def unpadded(column: str, lengths: Sequence[int], trainer: Any) -> PipelineFailure:
    shown = ", ".join(str(length) for length in lengths[:8])
    tokenizer = getattr(trainer, "processing_class", None) or getattr(trainer, "tokenizer", None)
    if tokenizer is not None and getattr(tokenizer, "pad_token", "") is None:
        return PipelineFailure(
            f"samples of different lengths ({column} lengths of the first rows: {shown}) must be padded, "
            f"but the tokenizer ({type(tokenizer).__name__}) has no pad token",
            "give it one before building the Trainer: tokenizer.pad_token = tokenizer.eos_token "
            "(or tokenizer.add_special_tokens({'pad_token': '[PAD]'}) and model.resize_token_embeddings)",
        )
    return PipelineFailure(
        f"samples of different lengths ({column} lengths of the first rows: {shown}) reach a collator that "
        "does not pad them "
        f"({_collator_name(trainer)})",
        "pass the tokenizer to the Trainer (processing_class=tokenizer; tokenizer=tokenizer before "
        "transformers 4.46) or data_collator=DataCollatorWithPadding(tokenizer), or pad when tokenizing",
    )


def _collator_name(trainer: Any) -> str:
    collator = trainer.data_collator
    name = getattr(collator, "__name__", type(collator).__name__)
    if name == "default_data_collator":
        return "the Trainer got no tokenizer, so it uses default_data_collator, which only stacks equal lengths"
    return name


_TARGET_OUT_OF_BOUNDS = re.compile(r"Target (-?\d+) is out of bounds")


def explain(error: BaseException, facts: Any) -> PipelineFailure | None:
    """A PipelineFailure for a library exception, when the cause can be told; else None.

    `facts` is the pipeline: it answers for the labels, token ids and lengths of its batches.
    """
    message = str(error)
    if isinstance(error, PipelineFailure):
        return error
    if _TARGET_OUT_OF_BOUNDS.search(message) or "device-side assert" in message:
        found = facts.label_problem()
        if found is not None:
            return found
    if "index out of range in self" in message:
        found = facts.token_problem()
        if found is not None:
            return found
    if "must be the same as input size" in message or ("Found dtype" in message and "expected" in message):
        config = getattr(getattr(facts, "model", None), "config", None)
        problem = getattr(config, "problem_type", None)
        width = getattr(config, "num_labels", None)
        return PipelineFailure(
            f"the labels do not fit the model's loss for problem_type={problem!r} with num_labels={width}: {message}",
            "single-label classification takes integer class ids; multi-label classification takes float "
            f"multi-hot rows of width {width}; regression takes floats with num_labels=1",
        )
    if "did not return a loss" in message:
        return PipelineFailure(
            "the model returned no loss: the batch has no labels",
            "keep the target column in the dataset as 'labels' (or 'label'), or for language modelling use "
            "DataCollatorForLanguageModeling, which makes labels from input_ids",
            [message],
        )
    return None
