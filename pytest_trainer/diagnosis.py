"""Failures in the user's terms: what is wrong, why it breaks training, and the fix.

Everything the plugin reports is a `TrainerError`: a check's `PipelineFailure` (a `Finding` when training still
runs), a script's `ScriptError`, the plugin's own `InternalError`. `pipeline_part` marks an exception as raised by
a part of the user's pipeline; `explanations.pipeline_rows` turns the known ones into failures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pytest_trainer.schema import Pictures

#: Set on an exception raised by the user's pipeline (collator, transform, model, loss, optimizer,
#: metrics); any other exception a check raises is a bug of pytest-trainer.
_PIPELINE_PART = "_pytest_trainer_pipeline_part"


class TrainerError(Exception):
    """Everything pytest-trainer reports to a user: the cause in their terms, the fix, and lines shown below them."""

    #: Whether the stages that need the one that failed lose their meaning (no batch, no loss, no gradients).
    blocks = True
    #: Whether this is the library's own error with nothing of pytest-trainer's to explain it (counted in the report).
    unexplained = False

    def __init__(self, cause: str, fix: str, details: Sequence[str] = ()) -> None:
        self.cause, self.fix, self.details = cause, fix, tuple(details)
        #: What the reports draw of the stage that failed (JSON values by name, as `StageResult.pictures`).
        self.pictures: Pictures = {}
        super().__init__(self.render())

    def render(self) -> str:
        lines = [self.cause, f"  fix: {self.fix}", *(f"  {line}" for line in self.details)]
        return "\n".join(lines)


class PipelineFailure(TrainerError):
    """A pipeline problem found by a stage, with its cause and its fix.

    It blocks the stages that need this one: they are skipped rather than fail again on what failed here.
    """


class Finding(PipelineFailure):
    """A defect that spoils training but leaves what this stage makes usable (the batch, the loss, the gradients).

    Unused parameters, a frozen head, a precision risk, a supervision mistake: one process still trains, so the
    stages after this one still run and report their own problems.
    """

    blocks = False


def combined(findings: Sequence[Finding]) -> Finding:
    """One failure for several findings of a stage: the first cause and fix first, the others below it."""
    first, *others = findings
    details = [*first.details]
    for other in others:
        details += [f"also: {other.cause}", f"  fix: {other.fix}", *(f"  {line}" for line in other.details)]
    found = Finding(first.cause, first.fix, details)
    for finding in findings:
        found.pictures.update(finding.pictures)
    return found


def also(failure: TrainerError, findings: Sequence[Finding]) -> TrainerError:
    """One failure that reports `findings` too, so that none is hidden behind it: findings together, a pipeline failure
    with each finding below it; an internal error stays as it is."""
    if not findings or not isinstance(failure, PipelineFailure):
        return failure
    if isinstance(failure, Finding):
        return combined([failure, *findings])
    details = [*failure.details]
    for finding in findings:
        details += [f"also: {finding.cause}", f"  fix: {finding.fix}"]
    made = type(failure)(failure.cause, failure.fix, details)
    made.pictures.update(failure.pictures)
    made.unexplained = failure.unexplained
    return made


def findings_last(checks: Iterable[Callable[[], object]]) -> None:
    """Run every check: a failure that breaks training is raised at once, findings together after the last."""
    found: list[Finding] = []
    for check in checks:
        try:
            check()
        except Finding as finding:
            found.append(finding)
    if found:
        raise combined(found)


class InternalError(TrainerError):
    """An exception in pytest-trainer's own code: a bug of the plugin, never the user's failure."""

    def __init__(self, check: str, error: BaseException) -> None:
        self.check, self.error = check, error
        first = str(error).splitlines()[0] if str(error) else ""
        super().__init__(
            f"internal error of pytest-trainer in the {check} check ({type(error).__name__}: {first})",
            "this is a bug of pytest-trainer, not of your pipeline: please report it with the traceback below",
        )


class ScriptError(TrainerError):
    """The script gave no Trainer; says why, where, and what to do. Every other item of the script is skipped."""

    def __init__(self, script: Path, cause: str, fix: str, where: str | None = None) -> None:
        self.script, self.where = script, where
        #: What the message names: the script's file name, or the command as given (`--trainer-command`).
        self.name = script.name
        super().__init__(cause, fix)

    def render(self) -> str:
        where = f"\n  at {self.where}" if self.where else ""
        return f"{self.name}: {self.cause}{where}\n  fix: {self.fix}"


@contextmanager
def pipeline_part(what: str) -> Iterator[None]:
    """Run a part of the user's pipeline: an exception it raises is the pipeline's, named by `what`."""
    try:
        yield
    except Exception as error:
        if not hasattr(error, _PIPELINE_PART):  # the innermost part names it
            setattr(error, _PIPELINE_PART, what)
        raise


def part_of(error: BaseException) -> str | None:
    """The part of the user's pipeline that raised `error`, or None when the plugin's own code did."""
    return getattr(error, _PIPELINE_PART, None)


def owned_by_pipeline(error: BaseException) -> bool:
    """A failure found in the pipeline, or an exception a part of it raised (not a bug of the plugin)."""
    return isinstance(error, PipelineFailure) or part_of(error) is not None


#: The fix of a library error no explanation row knows, raised while a stage ran a part of the pipeline.
UNEXPLAINED_FIX = "fix {part} for this batch: the original error and its traceback are below"


def raised_by(error: BaseException, part: str) -> PipelineFailure:
    """A library error nothing else explains, with the part of the pipeline that raised it first."""
    message = str(error).strip().splitlines()
    failure = PipelineFailure(
        f"{part} raised {type(error).__name__}: {message[0] if message else '(no message)'}",
        UNEXPLAINED_FIX.format(part=part),
    )
    failure.unexplained = True
    return failure


def labels_beyond_head(
    low: int,
    high: int,
    width: int,
    where: str = "",
    auto_class: str = "AutoModelForSequenceClassification",
    built_from: str | None = None,
    column: str | None = None,
) -> PipelineFailure:
    """Class ids beyond the head; the fix builds the model as the script does: `from_pretrained`, or from the
    config class `built_from` (a model trained from scratch). One class id per row in `column`, counted from `low` > 0
    and fitting the head from 0, is shifted instead: another output would leave classes below `low` without a row."""
    if column is not None and low > 0 and high - low + 1 == width:
        return PipelineFailure(
            f"labels range {low}..{high}: {width} classes counted from {low}, but class ids run from 0 to "
            f"num_labels - 1, so label {high} is beyond the model's {width} outputs{where}",
            f"shift the class ids to start at 0 where the labels are made, e.g. dataset = dataset.map(lambda row: "
            f"{{{column!r}: row[{column!r}] - {low}}}) (another output would leave class 0 without a row)",
        )
    classes = high + 1
    example = (
        f"{built_from}(..., num_labels={classes})"
        if built_from
        else f"{auto_class}.from_pretrained(..., num_labels={classes})"
    )
    return PipelineFailure(
        f"labels range {low}..{high} ({classes} classes) but the model has {width} outputs{where}",
        f"pass num_labels={classes} when building the model, e.g. {example}",
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


def no_matching_columns(split: str, columns: Sequence[str], taken: Sequence[str]) -> PipelineFailure:
    return PipelineFailure(
        f"no column of the {split} dataset ({', '.join(columns)}) is a parameter of the model's forward "
        f"({', '.join(taken)}), so the Trainer's remove_unused_columns drops them all",
        "name the columns after the forward's parameters, or set remove_unused_columns=False in TrainingArguments "
        "and give the Trainer a data_collator that builds the model's inputs",
    )


def unnamed_inputs(
    model: str, parameters: Sequence[str], dropped: Sequence[str], columns: Sequence[str] = ()
) -> PipelineFailure:
    """A forward(**inputs) names no input: the Trainer keeps only the columns a forward names, and the labels.
    `columns` are the split's columns as stored (the fix names them all), `dropped` those the Trainer dropped."""
    return PipelineFailure(
        f"{model}.forward({', '.join(parameters)}) names no input: the Trainer keeps only the columns the forward's "
        f"signature names (and the labels), so it dropped {', '.join(repr(name) for name in dropped)}; without "
        "'labels' in the signature the evaluation also computes no loss",
        f"name the inputs: def forward(self, {', '.join(_parameters(columns or dropped))}), or keep every column with "
        "TrainingArguments(remove_unused_columns=False, label_names=['labels'])",
    )


def _parameters(columns: Sequence[str]) -> list[str]:
    """The parameters a forward names to take these columns: the labels last (a collator renames 'label')."""
    labels = {"label", "labels", "label_ids"}
    inputs = [name for name in columns if name not in labels]
    return [*inputs, *(["labels=None"] if labels & set(columns) else [])]


def pad_in_targets(pad: int, count: int, where: str) -> Finding:
    return Finding(
        f"the labels hold the pad id {pad} ({where} and {count} positions in all) instead of -100: the loss "
        "trains the model to write padding after every target",
        "set padded label positions to -100: tokenize targets without padding='max_length' and let "
        "DataCollatorForSeq2Seq pad them (label_pad_token_id=-100), or replace the pad id by -100 in the labels",
    )


def missing_input(split: str, model_input: str, columns: Sequence[str]) -> PipelineFailure:
    return PipelineFailure(
        f"the {split} dataset has no {model_input!r} column, which the model needs "
        f"(columns the Trainer keeps: {', '.join(columns) or 'none'})",
        f"produce {model_input!r} in your preprocessing, or if the column has another name, "
        "rename it with dataset.rename_column(...)",
    )


def unpadded(column: str, lengths: Sequence[int], trainer: Any, label_collator: str) -> PipelineFailure | None:
    """Samples of unequal lengths that nothing pads; `label_collator` is the collator that pads this task's labels."""
    shown = ", ".join(str(length) for length in lengths[:8])
    tokenizer = getattr(trainer, "processing_class", None) or getattr(trainer, "tokenizer", None)
    if tokenizer is not None and getattr(tokenizer, "pad_token", "") is None:
        return PipelineFailure(
            f"samples of different lengths ({column} lengths of the first rows: {shown}) must be padded, "
            f"but the tokenizer ({type(tokenizer).__name__}) has no pad token",
            "give it one before building the Trainer: tokenizer.pad_token = tokenizer.eos_token "
            "(or tokenizer.add_special_tokens({'pad_token': '[PAD]'}) and model.resize_token_embeddings)",
        )
    if type(getattr(trainer, "data_collator", None)).__name__ == "DataCollatorWithPadding":
        return _labels_not_padded(trainer, column, shown, label_collator)
    return PipelineFailure(
        f"samples of different lengths ({column} lengths of the first rows: {shown}) reach a collator that "
        "does not pad them "
        f"({_collator_name(trainer)})",
        "pass the tokenizer to the Trainer (processing_class=tokenizer; tokenizer=tokenizer before "
        "transformers 4.46) or data_collator=DataCollatorWithPadding(tokenizer), or pad when tokenizing",
    )


def _labels_not_padded(trainer: Any, column: str, shown: str, collator: str) -> PipelineFailure | None:
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
        return PipelineFailure(
            f"the {label!r} of the first rows have different lengths ({', '.join(map(str, lengths[:8]))}): "
            "DataCollatorWithPadding pads the tokenizer's inputs but not labels, so a batch of labels cannot be made",
            f"use data_collator={collator}, which pads the labels with -100 beside the inputs",
        )
    tokenizer = getattr(trainer.data_collator, "tokenizer", None)
    if column in (getattr(tokenizer, "model_input_names", None) or ["input_ids", "attention_mask"]):
        return None  # the collator pads it: unequal lengths are not what failed
    return PipelineFailure(
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
