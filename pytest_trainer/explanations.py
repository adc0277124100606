"""The loud errors people hit with the Trainer, TRL and PEFT, each with its cause in the user's terms and a fix.

One table, two halves: `PIPELINE` for errors a part of the pipeline raises while a stage runs it (the collator, the
model's forward, the loss), `SCRIPT` for errors the script raises while it builds its Trainer. A row is a pattern
of the library's message and a function that reads what it needs (the batch, the model, the columns the Trainer
dropped) and returns the cause and the fix, or None where the facts do not match, so the error keeps its own
message. A row's fix never repeats what the script already does. Adding an error is adding one row.

It sits above the pipeline, which it reads (typed, never through `Any`), and below the stages, whose errors it
explains (`explain`).
"""

from __future__ import annotations

import math
import re
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_trainer import diagnosis, model_facts

if TYPE_CHECKING:
    from pytest_trainer.pipeline import Pipeline


@dataclass(frozen=True)
class Explained:
    """A cause in the user's terms, the fix, and lines shown below them."""

    cause: str
    fix: str
    details: tuple[str, ...] = ()


#: What a pipeline row returns: its own explanation, a failure the pipeline's checks found, or None.
Found = Explained | Exception | None


@dataclass(frozen=True)
class Row:
    """One loud error: the message it is known by, and how to tell its cause."""

    name: str
    #: The message users see (shown in the README's table).
    seen: str
    pattern: re.Pattern[str]
    explain: Callable[..., Any]
    #: The stage where it surfaces, for the table.
    stage: str = ""


PIPELINE: list[Row] = []
SCRIPT: list[Row] = []


def _row(table: list[Row], name: str, seen: str, pattern: str, stage: str) -> Callable[[Callable[..., Any]],
                                                                                         Callable[..., Any]]:
    def register(explain: Callable[..., Any]) -> Callable[..., Any]:
        table.append(Row(name, seen, re.compile(pattern), explain, stage))
        return explain

    return register


def explain_pipeline(error: BaseException, facts: Pipeline) -> Explained | Exception | None:
    """The first row whose pattern matches and whose facts agree, else None (the library's own message stays)."""
    message = str(error)
    for row in PIPELINE:
        match = row.pattern.search(message)
        if match is not None:
            found = row.explain(match, error, facts)
            if found is not None:
                return found  # type: ignore[no-any-return]
    return None


def explain(error: BaseException, pipeline: Pipeline) -> diagnosis.PipelineFailure | None:
    """A failure naming the cause of a library's exception, when a row of `PIPELINE` tells it; else None."""
    if isinstance(error, diagnosis.PipelineFailure):
        return error
    found = explain_pipeline(error, pipeline)
    if isinstance(found, Explained):
        return diagnosis.PipelineFailure(found.cause, found.fix, found.details)
    return found if isinstance(found, diagnosis.PipelineFailure) else None


def explain_script(error: BaseException) -> Explained | None:
    """The cause and fix of an error raised while the script builds its Trainer, else None."""
    message = str(error)
    for row in SCRIPT:
        match = row.pattern.search(message)
        if match is not None:
            found = row.explain(match, error)
            if found is not None:
                return found  # type: ignore[no-any-return]
    return None


# ---- the pipeline's facts, read defensively: a fact that cannot be read is no fact ------------------------------


def _batch(facts: Pipeline) -> dict[str, Any]:
    try:
        return dict(facts.batches.first())
    except Exception:
        return {}


#: What a tokenizer returns beside the token ids: never a target column, even where the model does not take it.
TOKENIZER_OUTPUTS = ("input_ids", "attention_mask", "token_type_ids", "special_tokens_mask", "offset_mapping",
                     "length", "overflow_to_sample_mapping")


def _removed(facts: Pipeline) -> list[str]:
    try:
        return list(facts.training.removed)
    except Exception:
        return []


def _config(facts: Pipeline) -> Any:
    try:
        return getattr(facts.model, "config", None)
    except Exception:
        return None


def _model_name(facts: Pipeline) -> str:
    try:
        return type(facts.model).__name__
    except Exception:
        return "the model"


def _forward_takes(facts: Pipeline) -> set[str] | None:
    import inspect

    try:
        model = facts.model
        base = getattr(model, "get_base_model", None)
        forward = (base() if callable(base) else model).forward
        parameters = inspect.signature(forward).parameters.values()
    except Exception:
        return None
    if any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters):
        return None  # **kwargs: it takes anything
    return {parameter.name for parameter in parameters}


def _batch_keys(facts: Pipeline) -> set[str]:
    """The keys of the batch the Trainer's dataloader makes (none where it cannot make one)."""
    try:
        return set(facts.batches.first())
    except Exception:  # a collator that fails is the collate stage's finding, not this row's
        return set()


def _label_names(facts: Pipeline) -> list[str]:
    names = getattr(facts.trainer, "label_names", None) or ["labels"]
    return [*names, "label", "label_ids"]


def _shape(value: Any) -> tuple[int, ...] | None:
    shape = getattr(value, "shape", None)
    return tuple(int(size) for size in shape) if shape is not None else None


def _stored_values(facts: Pipeline, column: str, rows: int = 8) -> list[Any]:
    try:
        return list(facts.training.given[:rows][column])
    except Exception:
        return []


# ---- pipeline rows ----------------------------------------------------------------------------------------------


@_row(PIPELINE, "label beyond the head", "IndexError: Target 2 is out of bounds. (GPU: device-side assert triggered)",
      r"Target -?\d+ is out of bounds|device-side assert", "forward")
def _target_out_of_bounds(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    from pytest_trainer import data_checks

    return data_checks.label_problem(facts)


@_row(PIPELINE, "token id beyond the embedding, or a sequence beyond the positions",
      "IndexError: index out of range in self; BERT-style models in transformers 5: RuntimeError: The expanded size "
      "of the tensor (14) must match the existing size (6) at non-singleton dimension 1 (in 4.57: The size of tensor a "
      "(14) must match the size of tensor b (6))",
      r"index out of range in self|The expanded size of the tensor \(\d+\) must match the existing size \(\d+\)"
      r"|The size of tensor a \(\d+\) must match the size of tensor b \(\d+\) at non-singleton dimension 1",
      "forward")
def _index_out_of_range(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    from pytest_trainer import data_checks

    return data_checks.token_problem(facts)


@_row(PIPELINE, "truncation through a vision-language row's image tokens",
      "ValueError: Mismatch in `image` token count between text and `input_ids`. Got ids=[3] and text=[4]. Likely "
      "due to `truncation='max_length'`. Please disable truncation or increase `max_length`.",
      r"Mismatch in `image` token count", "collate")
@_row(PIPELINE, "image tokens and image features that differ in number",
      "ValueError: Image features and image tokens do not match, tokens: 3, features: 4",
      r"Image features and image tokens do not match", "forward")
def _image_tokens(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    from pytest_trainer import vision_text

    return vision_text.explain(error, facts)


@_row(PIPELINE, "multi-label labels that are integers",
      "RuntimeError: result type Float can't be cast to the desired output type Long",
      r"can't be cast to the desired output type", "forward")
def _multi_label_integers(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    config = _config(facts)
    if getattr(config, "problem_type", None) != "multi_label_classification" or "Float" not in str(error):
        return None
    width = getattr(config, "num_labels", None)
    return Explained(
        "multi-label classification (problem_type='multi_label_classification') needs float multi-hot labels, one "
        f"row of {width} zeros and ones per example, but the labels are integer rows, not floats",
        "make the label rows floats (e.g. [1.0, 0.0, 1.0]): dataset.cast_column('labels', "
        "Sequence(Value('float32'))), or map each row with [float(x) for x in row]",
        (str(error).splitlines()[0],),
    )


@_row(PIPELINE, "float labels, one per example, for a classifier",
      "ValueError: Target size (torch.Size([8])) must be the same as input size (torch.Size([8, 3]))",
      r"Target size \(torch\.Size\(\[(\d+)\]\)\) must be the same as input size \(torch\.Size\(\[\d+, (\d+)\]\)\)",
      "forward")
def _float_labels_taken_for_rows(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    labels = _batch(facts).get("labels")
    if labels is None or getattr(labels, "dim", lambda: 0)() != 1:
        return None
    classes = match.group(2)
    if not labels.is_floating_point():
        if getattr(_config(facts), "problem_type", None) != "multi_label_classification":
            return None
        return Explained(
            "multi-label classification (problem_type='multi_label_classification') needs float multi-hot labels, one "
            f"row of {classes} zeros and ones per example, but the labels are one value per example, not a row per "
            "example",
            f"give each example a float row of width {classes} (e.g. [1.0, 0.0, 1.0]); for one class per example "
            "drop problem_type='multi_label_classification'",
            (str(error).splitlines()[0],),
        )
    shown = ", ".join(f"{float(value):g}" for value in labels[:4].tolist())
    return Explained(
        f"the labels are floats, one per example ({shown}, ...): for a {classes}-class head transformers then takes "
        "float labels for multi-label rows (problem_type='multi_label_classification'), whose loss needs a row of "
        f"{classes} values per example",
        "for one class per example make the label column integers: dataset = dataset.cast_column('label', "
        f"Value('int64')) (or ClassLabel); for multi-label give each example a float row of width {classes}",
        (str(error).splitlines()[0],),
    )


@_row(PIPELINE, "float labels for single-label classification",
      "RuntimeError: expected scalar type Long but found Float (torch 2: expected target dtype to be Long or Byte, "
      "but got Float)",
      r"expected scalar type Long but found Float|expected target dtype to be Long or Byte, but got Float", "forward")
def _float_class_ids(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    labels = _batch(facts).get("labels")
    if labels is None or not getattr(labels, "is_floating_point", lambda: False)():
        return None
    width = getattr(_config(facts), "num_labels", None)
    regression = " (for regression, build the model with num_labels=1)" if width and width > 1 else ""
    return Explained(
        f"the labels are floats ({', '.join(f'{float(v):g}' for v in labels.flatten()[:4].tolist())}, ...) but "
        "single-label classification's cross-entropy takes integer class ids",
        f"make the label column integers: dataset = dataset.cast_column('label', Value('int64')){regression}",
        (str(error).splitlines()[0],),
    )


@_row(PIPELINE, "labels of another shape than the predictions",
      "ValueError: Expected input batch_size (8) to match target batch_size (24).",
      r"Expected input batch_size \((\d+)\) to match target batch_size \((\d+)\)", "forward")
def _labels_per_example_mismatch(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    predicted, given = int(match.group(1)), int(match.group(2))
    labels = _batch(facts).get("labels")
    shape = _shape(labels)
    model = _model_name(facts)
    if shape is None:
        return None
    if len(shape) == 2 and model.endswith("ForSequenceClassification"):
        width = getattr(_config(facts), "num_labels", None)
        return Explained(
            f"the labels are rows of {shape[1]} values per example (labels {list(shape)}) but {model} predicts one "
            f"class per example: the loss gets {given} targets for {predicted} predictions",
            "give each example its class id (for one-hot rows: the index of the 1, e.g. row.index(1)); if an example "
            f"may have several classes, make the rows floats and build the model with num_labels={width}, "
            "problem_type='multi_label_classification'",
            (str(error).splitlines()[0],),
        )
    return Explained(
        f"the labels (shape {list(shape)}) do not line up with {model}'s predictions: the loss gets {given} "
        f"targets for {predicted} predictions",
        "give one label per prediction: per token for token classification (align word labels with "
        "encoding.word_ids(), -100 on special tokens), one per example for sequence classification",
        (str(error).splitlines()[0],),
    )


@_row(PIPELINE, "labels that do not fit the loss's problem type",
      "ValueError: Target size (...) must be the same as input size (...) / Found dtype Long but expected Float",
      r"must be the same as input size|Found dtype \w+ but expected \w+", "forward")
def _labels_do_not_fit(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    config = _config(facts)
    problem, width = getattr(config, "problem_type", None), getattr(config, "num_labels", None)
    return Explained(
        f"the labels do not fit the model's loss for problem_type={problem!r} with num_labels={width}: "
        f"{str(error).splitlines()[0]}",
        "single-label classification takes integer class ids; multi-label classification takes float "
        f"multi-hot rows of width {width}; regression takes floats with num_labels=1",
    )


@_row(PIPELINE, "the model returned no loss", "ValueError: The model did not return a loss from the inputs, "
      "only the following keys: logits.", r"did not return a loss", "forward")
def _no_loss(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    takes = _forward_takes(facts)
    model = _model_name(facts)
    received = re.search(r"inputs it received are ([\w,]+)", str(error))
    if "labels" in (received.group(1).split(",") if received else []) or (takes is not None and "labels" not in takes):
        return Explained(
            f"{model} computes no loss: its forward takes no labels (it is a base model without a task head)",
            f"train a model with a head for the task (e.g. AutoModelForSequenceClassification rather than "
            f"{model}), or compute the loss yourself in a Trainer subclass's compute_loss",
            (str(error).splitlines()[0],),
        )
    dropped = [name for name in _removed(facts) if name not in ("text", "sentence", "input_text")]
    if dropped:
        return Explained(
            f"the batch has no labels: the Trainer dropped the column {dropped[0]!r} (remove_unused_columns) "
            f"because {model}.forward takes no parameter of that name",
            f"name the target column 'labels': dataset = dataset.rename_column({dropped[0]!r}, 'labels')",
            (str(error).splitlines()[0],),
        )
    return Explained(
        "the model returned no loss: the batch has no labels",
        "keep the target column in the dataset as 'labels' (or 'label'), or for language modelling use "
        "DataCollatorForLanguageModeling, which makes labels from input_ids",
        (str(error).splitlines()[0],),
    )


@_row(PIPELINE, "a seq2seq target column dropped by the Trainer",
      "ValueError: You must specify exactly one of input_ids or inputs_embeds (from the decoder); 4.x: You have to "
      "specify either decoder_input_ids or decoder_inputs_embeds",
      r"exactly one of input_ids or inputs_embeds|specify either decoder_input_ids or decoder_inputs_embeds", "forward")
def _decoder_without_targets(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    if not getattr(_config(facts), "is_encoder_decoder", False):
        return None
    batch = _batch(facts)
    if "input_ids" not in batch or batch.get("labels") is not None or batch.get("decoder_input_ids") is not None:
        return None
    model = _model_name(facts)
    dropped = [name for name in _removed(facts) if name not in TOKENIZER_OUTPUTS]
    if dropped:
        return Explained(
            f"the decoder got no input: the batch has no 'labels', because the Trainer dropped the target column "
            f"{dropped[0]!r} (remove_unused_columns: {model}.forward takes no parameter of that name), and the "
            "decoder's input is made from the labels",
            f"name the target column 'labels' when tokenizing (encoded['labels'] = tokenizer(text_target=...)"
            f"['input_ids']), or dataset = dataset.rename_column({dropped[0]!r}, 'labels')",
            (str(error).splitlines()[0],),
        )
    return Explained(
        "the decoder got no input: the batch has neither 'labels' nor 'decoder_input_ids'",
        "tokenize the targets into a 'labels' column: encoded['labels'] = tokenizer(text_target=targets)['input_ids']",
        (str(error).splitlines()[0],),
    )


@_row(PIPELINE, "no pad id for a classifier that reads the last token",
      "ValueError: Cannot handle batch sizes > 1 if no padding token is defined.",
      r"Cannot handle batch sizes > 1 if no padding token is defined", "forward")
def _no_pad_id_in_config(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    config = _config(facts)
    if config is None or getattr(config, "pad_token_id", None) is not None:
        return None
    tokenizer = getattr(facts.trainer, "processing_class", None)
    pad = getattr(tokenizer, "pad_token_id", None)
    model = _model_name(facts)
    fix = f"set model.config.pad_token_id = tokenizer.pad_token_id ({pad}) before building the Trainer"
    if tokenizer is not None and pad is None:
        fix = ("give the tokenizer a pad token and the model its id: tokenizer.pad_token = tokenizer.eos_token; "
               "model.config.pad_token_id = tokenizer.pad_token_id")
    return Explained(
        f"{model} classifies from each row's last real token, which it finds by the pad id, but "
        "model.config.pad_token_id is None",
        fix,
        (str(error).splitlines()[0],),
    )


@_row(PIPELINE, "label column of strings",
      "ValueError: too many dimensions 'str' / Unable to create tensor ... Perhaps your features (`label` in this "
      "case) have excessive nesting", r"too many dimensions 'str'|Perhaps your features \(`(\w+)` in this case\)",
      "collate")
def _string_labels(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    columns = [match.group(1)] if match.lastindex else _label_names(facts)
    for column in columns:
        values = _stored_values(facts, column)
        if values and all(isinstance(value, str) for value in values):
            names = sorted(set(values))[:4]
            return Explained(
                f"the {column!r} column holds strings ({', '.join(repr(name) for name in names)}, ...): the model "
                "takes class ids, and a batch cannot be made of text",
                f"map the names to ids before training: dataset = dataset.class_encode_column({column!r}), then "
                f"build the model with num_labels=len(dataset.features[{column!r}].names)",
                (str(error).splitlines()[0],),
            )
    return None


@_row(PIPELINE, "a column the transform or collator reads, dropped by the Trainer", "KeyError: 'image' (or 'text')",
      r"^'", "dataset")
def _dropped_column_read(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    if not isinstance(error, KeyError) or not error.args or not isinstance(error.args[0], str):
        return None
    column = error.args[0]
    if column not in _removed(facts):
        return None
    model = _model_name(facts)
    return Explained(
        f"the Trainer dropped the column {column!r} before your transform or collator reads it "
        f"(remove_unused_columns: {model}.forward takes no {column!r})",
        "set remove_unused_columns=False in TrainingArguments (then let the transform or a data_collator keep only "
        "what the model takes), or preprocess with dataset.map(...) before training so the model's inputs are stored",
    )


@_row(PIPELINE, "no column the forward takes (an untokenized split, a forward(**inputs))", "ValueError: No columns in "
      "the dataset match the model's forward method signature; with a tokenizer: You should supply an encoding ... "
      "that includes input_ids, but you provided ['label']",
      r"No columns in the dataset match the model's forward|includes input_ids, but you provided", "collate")
def _no_matching_columns(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    removed = _removed(facts)
    text = [name for name in removed if all(isinstance(value, str) for value in _stored_values(facts, name) or [0])]
    if text:
        quoted = ", ".join(repr(name) for name in text)
        return Explained(
            f"the training dataset has text columns {quoted} but no 'input_ids': the model reads token ids, so the "
            "Trainer was given the raw, untokenized split and dropped every column",
            f"tokenize it first: tokenized = raw.map(lambda batch: tokenizer(batch[{text[0]!r}], truncation=True), "
            "batched=True), and pass the tokenized split to the Trainer",
        )
    try:
        named = model_facts.unnamed_inputs(facts.model)
    except Exception:
        named = None
    if named is not None and removed and getattr(getattr(facts.trainer, "args", None), "remove_unused_columns", True):
        try:
            stored = list(facts.training.given.column_names)
        except Exception:
            stored = removed
        return diagnosis.unnamed_inputs(_model_name(facts), named, removed, stored)
    return None


@_row(PIPELINE, "a tokenizer output the model's generate does not take (online RL sampling)",
      "ValueError: The following `model_kwargs` are not used by the model: ['token_type_ids'] (note: typos in the "
      "generate arguments will also show up in this list)",
      r"The following `model_kwargs` are not used by the model: \['(\w+)'", "collate")
def _unused_generate_input(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    key = match.group(1)
    if key not in TOKENIZER_OUTPUTS:
        return None  # not the tokenizer's: the library's own message stays
    return Explained(
        f"the tokenizer returns {key!r} with each prompt, and {_model_name(facts)}.generate does not take it, so "
        "the trainer cannot sample completions",
        "make the tokenizer return only what the model takes: build it with model_input_names=['input_ids', "
        "'attention_mask'] (save_pretrained keeps that), or set tokenizer.model_input_names to that list before "
        "the trainer is built",
    )


@_row(PIPELINE, "a batch key the forward does not take",
      "TypeError: forward() got an unexpected keyword argument 'token_type_ids'",
      r"forward\(\) got an unexpected keyword argument '(\w+)'", "forward")
def _unexpected_keyword(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    key = match.group(1)
    if key not in _batch_keys(facts):
        return None  # raised inside the forward, by a call of the model's own: not the batch's doing
    model = _model_name(facts)
    if key in _label_names(facts):
        return Explained(
            f"{model}.forward takes no {key!r}: the Trainer passes the labels to the model, which must compute "
            "the loss",
            f"accept labels in {model}.forward and return the loss (e.g. a dict with 'loss'), or compute the loss "
            "in a Trainer subclass's compute_loss",
        )
    remove_unused = bool(getattr(getattr(facts.trainer, "args", None), "remove_unused_columns", True))
    tokenizer_fix = " (for token_type_ids: tokenizer(..., return_token_type_ids=False))" \
        if key == "token_type_ids" else ""
    keep = "" if remove_unused else (
        " (the script sets remove_unused_columns=False, so the Trainer passes every column)")
    return Explained(
        f"the batch has {key!r}, which {model}.forward does not take{keep}",
        f"drop it before training: dataset = dataset.remove_columns([{key!r}]){tokenizer_fix}, or accept **kwargs in "
        "a forward of your own",
    )


@_row(PIPELINE, "parameters DDP got no gradient for (several processes)",
      "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one.",
      r"Expected to have finished reduction in the prior iteration", "distributed")
def _ddp_unused(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    names = list(getattr(error, "unused_parameters", None) or [])
    shown = f" ({', '.join(names[:6])}{' ...' if len(names) > 6 else ''})" if names else ""
    args = getattr(facts.trainer, "args", None)
    checkpointing = _checkpointing(args)
    why = ("with gradient checkpointing on, the Trainer sets DDP's find_unused_parameters=False"
           if checkpointing and getattr(args, "ddp_find_unused_parameters", None) is None
           else "the script sets ddp_find_unused_parameters=False" if getattr(args, "ddp_find_unused_parameters", None)
           is False else "DDP does not look for unused parameters")
    reentrant = f" with {_checkpointing_kwargs(args)}={{'use_reentrant': False}}" if checkpointing else ""
    return Explained(
        f"{len(names) or 'some'} trainable parameters get no gradient in a step{shown}: the forward does not use "
        f"them, and {why}, so DDP waits for their gradients and stops at the next step",
        "freeze or remove what the forward never uses (parameter.requires_grad_(False)), or set "
        f"ddp_find_unused_parameters=True in TrainingArguments{reentrant}",
    )


@_row(PIPELINE, "reentrant gradient checkpointing under DDP looking for unused parameters",
      "RuntimeError: Expected to mark a variable ready only once.",
      r"Expected to mark a variable ready only once", "distributed")
def _ddp_ready_twice(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    args = getattr(facts.trainer, "args", None)
    if not _checkpointing(args):
        return None  # a parameter used outside forward, or shared between passes: the library's message says so
    return Explained(
        "reentrant gradient checkpointing (use_reentrant=True) runs each layer's backward again, so DDP, which "
        "looks for unused parameters, sees their gradients arrive twice",
        f"checkpoint without reentrance: {_checkpointing_kwargs(args)}={{'use_reentrant': False}} in "
        "TrainingArguments",
    )


def _checkpointing_kwargs(args: Any) -> str:
    """The arguments' name for checkpointing options: transformers 5 renamed gradient_ to activation_checkpointing."""
    return "activation_checkpointing_kwargs" if hasattr(args, "activation_checkpointing_kwargs") \
        else "gradient_checkpointing_kwargs"


def _checkpointing(args: Any) -> bool:
    return bool(getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing", None))


# ---- script rows: errors while the script builds its Trainer ----------------------------------------------------


@_row(SCRIPT, "LoRA target modules not in the model",
      "ValueError: Target modules {'q_proj', 'v_proj'} not found in the base model.",
      r"", "load")
def _lora_targets(match: re.Match[str], error: BaseException) -> Explained | None:
    message = str(error)
    if type(error).__name__ != "NoMatchingPeftModuleError" and not re.search(
            r"Target modules .* not found in the base model", message):
        return None
    model = _local_of_type(error, "model", _is_module, innermost=True)
    names = linear_module_names(model) if model is not None else []
    family = getattr(getattr(model, "config", None), "model_type", None)
    usual = _usual_targets(family)
    found = f"; its linear modules are {', '.join(names)}" if names else ""
    return Explained(
        f"LoRA's target modules were not found in the model ({message.splitlines()[0]}){found}",
        "name modules of this model in LoraConfig(target_modules=...)"
        + (f", e.g. {usual} for {family} models" if usual else "")
        + ", or target_modules='all-linear'",
    )


@_row(SCRIPT, "a reference model loaded from a checkpoint that is not there",
      "OSError: ... is not a local folder and is not a valid model identifier (TRL loading ref_model_path)",
      r"", "load")
def _reference_checkpoint(match: re.Match[str], error: BaseException) -> Explained | None:
    reference = _local_of_type(error, "ref_model_path", lambda value: isinstance(value, str))
    if reference is None or not isinstance(error, (OSError, ValueError)):
        return None
    message = str(error)
    which = "a model built from a config does not have" if not reference else "cannot be loaded here"
    return Explained(
        "the trainer could not build its reference model: with no ref_model given, it loads one from the "
        f"policy model's checkpoint ({reference!r}), which {which} "
        f"({type(error).__name__}: {message.splitlines()[0] if message else ''})",
        "pass ref_model= (a copy of the model, copy.deepcopy(model), or a checkpoint on this machine), or train "
        "with a peft_config: the model without its adapter is then the reference",
    )


@_row(SCRIPT, "an online RL reference model loaded by the name of a model built from a config",
      "OSError: Repo id must use alphanumeric chars '-', '_' or '.' ...: '' (RLOO, or GRPO, with beta > 0)",
      r"", "load")
def _online_reference(match: re.Match[str], error: BaseException) -> Explained | None:
    args = _local_of_type(error, "args", lambda value: hasattr(value, "beta") and hasattr(value, "num_generations"))
    model_id = _local_of_type(error, "model_id", lambda value: isinstance(value, str), innermost=True)
    policy = _local_of_type(error, "model", _is_module)  # loaded already: the load that failed is the reference's
    beta = getattr(args, "beta", 0)
    if model_id is None or policy is None or not beta or not isinstance(error, (OSError, ValueError)):
        return None
    which = "a model built from a config does not have" if not model_id else "cannot be loaded here"
    message = str(error)
    return Explained(
        f"with beta={beta:g}, the trainer builds a reference model for its KL term by loading the policy model's "
        f"checkpoint by name ({model_id!r}), which {which} ({type(error).__name__}: "
        f"{message.splitlines()[0] if message else ''})",
        "set beta=0.0 in the config (no KL term, no reference model), or build the model with from_pretrained "
        "from a checkpoint on this machine (save_pretrained it first)",
    )


#: The dataset formats each TRL trainer takes, as its documentation names them.
TRL_FORMATS = {
    "SFTTrainer": "'text', or 'messages' (conversational), or 'prompt' and 'completion'",
    "DPOTrainer": "'prompt', 'chosen' and 'rejected' (or 'chosen' and 'rejected' with the prompt in them)",
    "RewardTrainer": "'chosen' and 'rejected' (optionally with 'prompt')",
    "KTOTrainer": "'prompt', 'completion' and 'label'",
    "ORPOTrainer": "'prompt', 'chosen' and 'rejected'",
    "CPOTrainer": "'prompt', 'chosen' and 'rejected'",
}


@_row(SCRIPT, "a TRL dataset in another format", "KeyError: 'chosen' / KeyError: 'text' (inside the TRL trainer)",
      r"", "load")
def _trl_format(match: re.Match[str], error: BaseException) -> Explained | None:
    if not isinstance(error, KeyError) or not _raised_in(error, "/trl/"):
        return None
    trainer = _local_of_type(error, "self", lambda value: type(value).__name__ in TRL_FORMATS)
    if trainer is None:
        return None
    name = type(trainer).__name__
    row = _local_of_type(error, "example", lambda value: hasattr(value, "keys")) or _local_of_type(
        error, "batch", lambda value: hasattr(value, "keys"))
    columns = ", ".join(repr(key) for key in list(row.keys())) if row is not None else "unknown"
    return Explained(
        f"{name} found no column {error.args[0]!r} in the dataset: its columns are {columns}, "
        f"and {name} takes {TRL_FORMATS[name]}",
        "rename the columns (dataset.rename_column(old, new)) or map the rows into one of those formats",
    )


@_row(SCRIPT, "a stream without max_steps",
      "ValueError: The train_dataset does not implement __len__, max_steps has to be specified.",
      r"max_steps.*(__len__|does not have a length)|(__len__|does not have a length).*max_steps", "load")
def _stream_without_max_steps(match: re.Match[str], error: BaseException) -> Explained:
    return Explained(
        "the training dataset is a stream (an IterableDataset, or streaming=True) and TrainingArguments has no "
        "max_steps: the Trainer cannot tell how long an epoch is",
        "set max_steps in TrainingArguments (the number of optimizer steps to train for)",
    )


@_row(SCRIPT, "the policy given as its own reference (TRL)",
      "ValueError: `model` and `ref_model` cannot be the same object.",
      r"`?model`? and `?ref_model`? cannot be the same object", "load")
def _same_reference(match: re.Match[str], error: BaseException) -> Explained:
    return Explained(
        "the same model object is passed as the policy and as ref_model: the reference must stay frozen while the "
        "policy trains, so it has to be another object",
        "pass ref_model=copy.deepcopy(model), or leave ref_model out (the trainer then loads a frozen copy from the "
        "model's checkpoint), or train with a peft_config (the model without its adapter is the reference)",
    )


@_row(SCRIPT, "GRPO generations per prompt that do not divide the batch",
      "ValueError: generation_batch_size (6) must be divisible by num_generations (8).",
      r"(generation_batch_size|global train batch size)[^0-9]*\(?(?:\d+ x )?(\d+)\)?.*divisible by (?:the number of "
      r"generations per prompt|num_generations) \((\d+)\)", "load")
def _grpo_groups(match: re.Match[str], error: BaseException) -> Explained:
    batch, generations = int(match.group(2)), int(match.group(3))
    divisors = [str(number) for number in range(2, batch + 1) if batch % number == 0]
    multiple = generations * max(1, -(-batch // generations))
    whole = math.lcm(generations, batch)  # generation_batch_size holds whole groups and whole training batches
    return Explained(
        f"GRPO samples num_generations={generations} completions of each prompt and scores them as a group, so a "
        f"generation batch must hold whole groups, but it holds {batch} completions "
        "(per_device_train_batch_size x gradient_accumulation_steps x processes, or generation_batch_size)",
        f"make the generation batch a multiple of {generations} (e.g. per_device_train_batch_size={multiple} or "
        f"generation_batch_size={whole})"
        + (f", or set num_generations to a divisor of {batch} ({', '.join(divisors)})" if divisors else ""),
    )


@_row(SCRIPT, "masked-LM collator with a tokenizer without a mask token",
      "ValueError: This tokenizer does not have a mask token which is necessary for masked language modeling.",
      r"does not have a mask token which is necessary for masked language modeling", "load")
def _mlm_without_mask(match: re.Match[str], error: BaseException) -> Explained:
    return Explained(
        "DataCollatorForLanguageModeling masks tokens by default (mlm=True, for BERT-style models), and this "
        "tokenizer has no mask token: it is a causal LM's tokenizer",
        "for a causal LM pass DataCollatorForLanguageModeling(tokenizer, mlm=False), which makes labels from "
        "input_ids; for masked LM use a tokenizer with a mask token",
    )


@_row(SCRIPT, "load_best_model_at_end with save and eval at different times",
      "ValueError: --load_best_model_at_end requires the save and eval strategy to match",
      r"(?s)load_best_model_at_end requires the save and eval strategy to match.*Evaluation strategy: "
      r"(?:\w+\.)?(\w+).*Save strategy: (?:\w+\.)?(\w+)", "load")
def _best_model_strategies(match: re.Match[str], error: BaseException) -> Explained:
    evaluate, save = match.group(1).lower(), match.group(2).lower()
    return Explained(
        f"load_best_model_at_end keeps the checkpoint of the best evaluation, but the script evaluates by {evaluate!r}"
        f" and saves by {save!r}, so the best evaluation may have no checkpoint",
        f"save when you evaluate: save_strategy={evaluate!r} (with save_steps equal to eval_steps for 'steps'), or "
        "drop load_best_model_at_end",
    )


@_row(SCRIPT, "load_best_model_at_end with save steps not a multiple of eval steps",
      "ValueError: --load_best_model_at_end requires the saving steps to be a round multiple of the evaluation steps",
      r"load_best_model_at_end requires the sav\w* steps to be a round multiple of the evaluation steps, but found "
      r"(\d+), which is not a round multiple of (\d+)", "load")
def _best_model_steps(match: re.Match[str], error: BaseException) -> Explained:
    save, evaluate = int(match.group(1)), int(match.group(2))
    nearest = max(evaluate, round(save / evaluate) * evaluate)
    return Explained(
        f"load_best_model_at_end keeps the checkpoint of the best evaluation, but checkpoints every {save} steps "
        f"miss most evaluations every {evaluate} steps",
        f"make save_steps a multiple of eval_steps: save_steps={nearest} (or eval_steps={save}), or drop "
        "load_best_model_at_end",
    )


_UNEXPECTED = r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'"


def _arguments_class(name: str) -> bool:
    return name.endswith(("Arguments", "Config"))


@_row(SCRIPT, "an argument transformers 5 or TRL 1.x renamed or removed (TrainingArguments and the TRL configs)",
      "TypeError: TrainingArguments.__init__() got an unexpected keyword argument 'evaluation_strategy'",
      _UNEXPECTED, "load")
def _renamed_argument(match: re.Match[str], error: BaseException) -> Explained | None:
    from pytest_trainer import renames

    where, old = match.group(1), match.group(2)
    if not isinstance(error, TypeError) or not _arguments_class(where):
        return None
    change = renames.CONFIG_FIELDS.get(where, {}).get(old) or renames.ARGUMENTS.get(old)
    if change is None:
        return None
    library = "trl" if change.release.startswith("TRL") else "transformers"
    return Explained(
        f"{change.told(where)}; this machine has {renames.library_release(library)}, and the script was written for "
        "an older release",
        change.fix(f"{where}(...)"),
    )


@_row(SCRIPT, "a trainer argument renamed, or moved into the TRL config",
      "TypeError: Trainer.__init__() got an unexpected keyword argument 'tokenizer'", _UNEXPECTED, "load")
def _renamed_trainer_argument(match: re.Match[str], error: BaseException) -> Explained | None:
    from pytest_trainer import renames

    where, old = match.group(1), match.group(2)
    if not isinstance(error, TypeError) or not where.endswith("Trainer"):
        return None
    change = renames.TRAINER_ARGUMENTS.get(where, {}).get(old) or renames.TRAINER_ARGUMENTS["*"].get(old)
    if change is not None:
        return Explained(f"{change.told(where)} (this machine has {renames.library_release('transformers')}, "
                         f"{renames.library_release('trl')})", change.fix(f"{where}(...)"))
    config, moved = renames.MOVED_TO_CONFIG.get(where, ("", ()))
    if old not in moved:
        return None
    return Explained(
        f"{where} takes no {old!r} since TRL 0.13: the trainer's settings moved into its {config} (this machine has "
        f"{renames.library_release('trl')})",
        f"set it in the config: args = {config}(..., {old}=...), and pass {where}(..., args=args)",
    )


@_row(SCRIPT, "a from_pretrained keyword transformers 5 removed",
      "TypeError: LlamaForCausalLM.__init__() got an unexpected keyword argument 'load_in_4bit'", _UNEXPECTED, "load")
def _renamed_loading_keyword(match: re.Match[str], error: BaseException) -> Explained | None:
    from pytest_trainer import renames

    where, old = match.group(1), match.group(2)
    change = renames.LOADING.get(old)
    if not isinstance(error, TypeError) or change is None or _arguments_class(where) or where.endswith("Trainer"):
        return None
    return Explained(
        f"from_pretrained passed {old!r} on to {where}, which does not take it: "
        f"{change.told('from_pretrained')} (this machine has {renames.library_release('transformers')})",
        change.fix("from_pretrained(...)"),
    )


@_row(SCRIPT, "a name transformers 5 or TRL 1.x no longer exports",
      "ImportError: cannot import name 'DataCollatorForCompletionOnlyLM' from 'trl'",
      r"cannot import name '(\w+)' from '([\w.]+)'", "load")
def _removed_import(match: re.Match[str], error: BaseException) -> Explained | None:
    from pytest_trainer import renames

    name, module = match.group(1), match.group(2)
    change = renames.IMPORTS.get(name)
    if change is None or not isinstance(error, ImportError):
        return None
    library = module.split(".")[0]
    return Explained(
        f"{module} has no {name!r} since {change.release} (this machine has {renames.library_release(library)})",
        change.new if change.new.startswith("from ") or not change.renamed else f"import {change.new} instead",
    )


@_row(SCRIPT, "a TRL trainer given plain TrainingArguments",
      "AttributeError: 'TrainingArguments' object has no attribute 'model_init_kwargs'",
      r"'(TrainingArguments|\w+Config)' object has no attribute '(\w+)'", "load")
def _trl_arguments(match: re.Match[str], error: BaseException) -> Explained | None:
    given = match.group(1)
    trainer = _local_of_type(error, "self", lambda value: type(value).__name__.endswith("Trainer"))
    if trainer is None or not _raised_in(error, "/trl/"):
        return None
    name = type(trainer).__name__
    wanted = name.replace("Trainer", "Config")
    if given == wanted:
        return None
    return Explained(
        f"{name} was given a {given}, which has no {match.group(2)!r}: each TRL trainer reads its own config's "
        f"settings, and {name} takes a {wanted}",
        f"args = {wanted}(output_dir=..., ...) with the same settings (it is a TrainingArguments too), and pass "
        f"{name}(..., args=args)",
    )


# ---- what the script rows read from the traceback ---------------------------------------------------------------


def _is_module(value: Any) -> bool:
    import torch

    return isinstance(value, torch.nn.Module)


def _raised_in(error: BaseException, part: str) -> bool:
    """Whether the error passed through code whose file path holds `part`."""
    trace = error.__traceback__
    while trace is not None:
        if part in trace.tb_frame.f_code.co_filename.replace("\\", "/"):
            return True
        trace = trace.tb_next
    return False


def _local_of_type(error: BaseException, name: str, accept: Callable[[Any], bool], innermost: bool = False) -> Any:
    """A frame's local `name` that `accept` takes along the error's traceback: the outermost, or the innermost."""
    found = None
    trace: types.TracebackType | None = error.__traceback__
    while trace is not None:
        value = trace.tb_frame.f_locals.get(name)
        if value is not None and accept(value):
            if not innermost:
                return value
            found = value
        trace = trace.tb_next
    return found


def linear_module_names(model: Any) -> list[str]:
    """The distinct last names of a model's linear layers (GPT-2's Conv1D included): what LoRA can target."""
    import torch

    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if name and (isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D")
    }
    return sorted(names)


def _usual_targets(family: str | None) -> list[str] | None:
    try:
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as usual
    except ImportError:
        return None
    found = usual.get(family) if family else None
    return list(found) if found else None


def table_rows() -> Sequence[Row]:
    """Every row, pipeline first: what the README's table lists."""
    return [*PIPELINE, *SCRIPT]
