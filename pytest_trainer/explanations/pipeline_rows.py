"""The errors a part of the pipeline raises while a stage runs it (the collator, the model's forward, the loss).

Each row reads the pipeline's facts (the batch, the model, the columns the Trainer dropped) and returns the cause in
the user's terms and a fix that differs from what the script does, or None. It sits above the pipeline, which it reads
(typed, never through `Any`), and below the stages, whose errors it explains (`explain`).
"""

from __future__ import annotations

import inspect
import re
from typing import TYPE_CHECKING, Any

import pytest

from pytest_trainer import diagnosis, model_facts
from pytest_trainer.explanations import script_rows
from pytest_trainer.explanations.registry import PIPELINE, Explained, Found, first, row

if TYPE_CHECKING:
    from pytest_trainer.pipeline import Pipeline


def explain(error: BaseException, pipeline: Pipeline) -> diagnosis.PipelineFailure | None:
    """A failure naming the cause of a library's exception, when a row tells it; else None."""
    if isinstance(error, diagnosis.PipelineFailure):
        return error
    found = first(PIPELINE, error, pipeline)
    if isinstance(found, Explained):
        return diagnosis.PipelineFailure(found.cause, found.fix, found.details)
    return found if isinstance(found, diagnosis.PipelineFailure) else None


# ---- the pipeline's facts, read defensively: a fact that cannot be read is no fact ------------------------------


def _batch(facts: Pipeline) -> dict[str, Any]:
    try:
        return dict(facts.batches.first())
    except Exception:
        return {}


#: What a tokenizer returns beside the token ids: never a target column, even where the model does not take it.
TOKENIZER_OUTPUTS = (
    "input_ids",
    "attention_mask",
    "token_type_ids",
    "special_tokens_mask",
    "offset_mapping",
    "length",
    "overflow_to_sample_mapping",
)


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


@row(
    PIPELINE,
    "a tensor on another device than the batch",
    "RuntimeError: Expected all tensors to be on the same device, but got weight is on cpu, different from other "
    "tensors on cuda:0 (when checking argument for argument weight in method wrapper_CUDA_nll_loss_forward)",
    script_rows.DEVICES_MET,
    "forward",
)
def _device_mismatch(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    return script_rows.placement(error)


#: The dtype names a mixed-precision flag computes in, as torch's messages write them.
HALF_NAMES = {"bf16": ("BFloat16", "bfloat16"), "fp16": ("Half", "float16")}


def fp16_trainable(facts: Pipeline, model: Any) -> diagnosis.PipelineFailure | None:
    """Trainable fp16 weights under fp16=True: the GPU's gradient scaler refuses their gradients."""
    import torch

    if facts.precision() != "fp16":
        return None
    half = [
        name
        for name, parameter in model.named_parameters()
        if parameter.requires_grad and parameter.dtype == torch.float16
    ]
    if not half:
        return None
    return diagnosis.PipelineFailure(
        f"{len(half)} trainable weights are fp16 under fp16=True mixed precision (e.g. {half[0]}): the gradient "
        'scaler refuses fp16 gradients on a GPU ("Attempting to unscale FP16 gradients"), and without it AdamW '
        "updates fp16 weights until they are NaN",
        "keep trainable weights in fp32 and let autocast cast them: load the model with dtype=torch.float32 "
        "(transformers 5 loads a checkpoint in the dtype it was saved in unless dtype= says otherwise), or cast the "
        "trainable ones (adapters, heads) to float32; or train in bf16 where the GPU has it",
    )


@row(
    PIPELINE,
    "a model in half precision fed float32 inputs",
    "RuntimeError: Input type (float) and bias type (c10::BFloat16) should be the same (or: Input type "
    "(torch.FloatTensor) and weight type (CPUBFloat16Type) should be the same ...)",
    r"Input type \((?:float|[^)]*FloatTensor)\) and (?:bias|weight) type \([^)]*?(BFloat16|Half)[^)]*\) should be"
    r"|mat1 and mat2 must have the same dtype, but got Float and (\w+)"
    r"|expected m(?:at)?1 and m(?:at)?2 to have the same dtype, but got: float != c10::(\w+)",
    "forward",
)
def _half_weights_float_inputs(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    """Where the script asks for mixed precision, the autocast trainer.train() turns on casts the inputs; the items
    run the model without it and cannot tell: the item is skipped with the reason."""
    import torch

    found = next(group for group in match.groups() if group)
    precision = next((flag for flag, names in HALF_NAMES.items() if found in names), None)
    if precision is None:
        return None
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    name = HALF_NAMES[precision][1]
    model = facts.model
    held = [weight for weight, parameter in model.named_parameters() if parameter.dtype == dtype]
    inputs = [key for key, value in _batch(facts).items() if getattr(value, "dtype", None) == torch.float32]
    if not held or not inputs:
        return None  # a layer of the model's own fed another of its dtypes: no cause this row can name
    trainable = fp16_trainable(facts, model)
    if trainable is not None:
        return trainable
    fed = f"its float32 inputs ({', '.join(inputs)})"
    asked = facts.precision()
    if asked is not None:
        pytest.skip(
            f"not checked: the model's weights are {name} and its forward leaves the cast of {fed} to the autocast "
            f"that {asked}=True turns on inside trainer.train(), which the items do not run the model under"
        )
    return Explained(
        f"the model's weights are {name} ({len(held)} tensors, e.g. {held[0]}) but {fed} are not, and no mixed "
        f"precision casts them (neither bf16=True nor fp16=True): the model's first layer refuses them",
        f"load the model in float32 (dtype=torch.float32; transformers 5 loads a checkpoint in the dtype it was saved "
        f"in unless dtype= says otherwise) and train with {'bf16=True' if precision == 'bf16' else 'fp16=True'}, or "
        f"cast {fed} to {name} in the collator",
    )


@row(
    PIPELINE,
    "audio at another sampling rate than the feature extractor's, in a transform or a collator",
    "ValueError: The model corresponding to this feature extractor: ... was trained using a sampling rate of 16000. "
    "Please make sure that the provided `raw_speech` input was sampled with 16000 and not 44100.",
    script_rows.SAMPLING_RATE,
    "collate",
)
def _sampling_rate(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    return script_rows.sampling_rate(match)


@row(PIPELINE, "CUDA asked for in the pipeline on a machine without a GPU",
     "AssertionError: Torch not compiled with CUDA enabled", script_rows.NO_CUDA, "collate")  # fmt: skip
def _cuda_asked(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    return script_rows.cuda_asked(error)


@row(
    PIPELINE,
    "label beyond the head",
    "IndexError: Target 2 is out of bounds. (GPU: device-side assert triggered)",
    r"Target -?\d+ is out of bounds|device-side assert",
    "forward",
)
def _target_out_of_bounds(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    from pytest_trainer import fed_checks

    return fed_checks.label_problem(facts)


@row(
    PIPELINE,
    "token id beyond the embedding, or a sequence beyond the positions",
    "IndexError: index out of range in self; BERT-style models in transformers 5: RuntimeError: The expanded size "
    "of the tensor (14) must match the existing size (6) at non-singleton dimension 1 (in 4.57: The size of tensor a "
    "(14) must match the size of tensor b (6))",
    r"index out of range in self|The expanded size of the tensor \(\d+\) must match the existing size \(\d+\)"
    r"|The size of tensor a \(\d+\) must match the size of tensor b \(\d+\) at non-singleton dimension 1",
    "forward",
)
def _index_out_of_range(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    from pytest_trainer import fed_checks

    return fed_checks.token_problem(facts)


@row(
    PIPELINE,
    "truncation through a vision-language row's image tokens",
    "ValueError: Mismatch in `image` token count between text and `input_ids`. Got ids=[3] and text=[4]. Likely "
    "due to `truncation='max_length'`. Please disable truncation or increase `max_length`.",
    r"Mismatch in `image` token count",
    "collate",
)
@row(
    PIPELINE,
    "image tokens and image features that differ in number",
    "ValueError: Image features and image tokens do not match, tokens: 3, features: 4",
    r"Image features and image tokens do not match",
    "forward",
)
def _image_tokens(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    from pytest_trainer import vision_text

    return vision_text.explain(error, facts)


@row(
    PIPELINE,
    "multi-label labels that are integers",
    "RuntimeError: result type Float can't be cast to the desired output type Long",
    r"can't be cast to the desired output type",
    "forward",
)
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


@row(
    PIPELINE,
    "float labels, one per example, for a classifier",
    "ValueError: Target size (torch.Size([8])) must be the same as input size (torch.Size([8, 3]))",
    r"Target size \(torch\.Size\(\[(\d+)\]\)\) must be the same as input size \(torch\.Size\(\[\d+, (\d+)\]\)\)",
    "forward",
)
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


@row(
    PIPELINE,
    "float labels for single-label classification",
    "RuntimeError: expected scalar type Long but found Float (torch 2: expected target dtype to be Long or Byte, "
    "but got Float)",
    r"expected scalar type Long but found Float|expected target dtype to be Long or Byte, but got Float",
    "forward",
)
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


@row(
    PIPELINE,
    "labels of another shape than the predictions",
    "ValueError: Expected input batch_size (8) to match target batch_size (24).",
    r"Expected input batch_size \((\d+)\) to match target batch_size \((\d+)\)",
    "forward",
)
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


@row(
    PIPELINE,
    "labels that do not fit the loss's problem type",
    "ValueError: Target size (...) must be the same as input size (...) / Found dtype Long but expected Float",
    r"must be the same as input size|Found dtype \w+ but expected \w+",
    "forward",
)
def _labels_do_not_fit(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    config = _config(facts)
    problem, width = getattr(config, "problem_type", None), getattr(config, "num_labels", None)
    return Explained(
        f"the labels do not fit the model's loss for problem_type={problem!r} with num_labels={width}: "
        f"{str(error).splitlines()[0]}",
        "single-label classification takes integer class ids; multi-label classification takes float "
        f"multi-hot rows of width {width}; regression takes floats with num_labels=1",
    )


@row(
    PIPELINE,
    "the model returned no loss",
    "ValueError: The model did not return a loss from the inputs, only the following keys: logits.",
    r"did not return a loss",
    "forward",
)
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


@row(
    PIPELINE,
    "a seq2seq target column dropped by the Trainer",
    "ValueError: You must specify exactly one of input_ids or inputs_embeds (from the decoder); 4.x: You have to "
    "specify either decoder_input_ids or decoder_inputs_embeds",
    r"exactly one of input_ids or inputs_embeds|specify either decoder_input_ids or decoder_inputs_embeds",
    "forward",
)
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


@row(
    PIPELINE,
    "no pad id for a classifier that reads the last token",
    "ValueError: Cannot handle batch sizes > 1 if no padding token is defined.",
    r"Cannot handle batch sizes > 1 if no padding token is defined",
    "forward",
)
def _no_pad_id_in_config(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    config = _config(facts)
    if config is None or getattr(config, "pad_token_id", None) is not None:
        return None
    tokenizer = getattr(facts.trainer, "processing_class", None)
    pad = getattr(tokenizer, "pad_token_id", None)
    model = _model_name(facts)
    fix = f"set model.config.pad_token_id = tokenizer.pad_token_id ({pad}) before building the Trainer"
    if tokenizer is not None and pad is None:
        fix = (
            "give the tokenizer a pad token and the model its id: tokenizer.pad_token = tokenizer.eos_token; "
            "model.config.pad_token_id = tokenizer.pad_token_id"
        )
    return Explained(
        f"{model} classifies from each row's last real token, which it finds by the pad id, but "
        "model.config.pad_token_id is None",
        fix,
        (str(error).splitlines()[0],),
    )


@row(
    PIPELINE,
    "label column of strings",
    "ValueError: too many dimensions 'str' / Unable to create tensor ... Perhaps your features (`label` in this "
    "case) have excessive nesting",
    r"too many dimensions 'str'|Perhaps your features \(`(\w+)` in this case\)",
    "collate",
)
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


@row(
    PIPELINE,
    "a column the transform or collator reads, dropped by the Trainer",
    "KeyError: 'image' (or 'text')",
    r"^'",
    "dataset",
)
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


@row(
    PIPELINE,
    "no column the forward takes (an untokenized split, a forward(**inputs))",
    "ValueError: No columns in "
    "the dataset match the model's forward method signature; with a tokenizer: You should supply an encoding ... "
    "that includes input_ids, but you provided ['label']",
    r"No columns in the dataset match the model's forward|includes input_ids, but you provided",
    "collate",
)
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
        from pytest_trainer import fed_checks

        return fed_checks.unnamed_inputs(_model_name(facts), named, removed, stored)
    return None


@row(
    PIPELINE,
    "a tokenizer output the model's generate does not take (online RL sampling)",
    "ValueError: The following `model_kwargs` are not used by the model: ['token_type_ids'] (note: typos in the "
    "generate arguments will also show up in this list)",
    r"The following `model_kwargs` are not used by the model: \['(\w+)'",
    "collate",
)
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


@row(
    PIPELINE,
    "a batch key the forward does not take",
    "TypeError: forward() got an unexpected keyword argument 'token_type_ids'",
    r"forward\(\) got an unexpected keyword argument '(\w+)'",
    "forward",
)
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
    tokenizer_fix = (
        " (for token_type_ids: tokenizer(..., return_token_type_ids=False))" if key == "token_type_ids" else ""
    )
    keep = (
        "" if remove_unused else (" (the script sets remove_unused_columns=False, so the Trainer passes every column)")
    )
    return Explained(
        f"the batch has {key!r}, which {model}.forward does not take{keep}",
        f"drop it before training: dataset = dataset.remove_columns([{key!r}]){tokenizer_fix}, or accept **kwargs in "
        "a forward of your own",
    )


@row(
    PIPELINE,
    "parameters DDP got no gradient for (several processes)",
    "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one.",
    r"Expected to have finished reduction in the prior iteration",
    "distributed",
)
def _ddp_unused(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    names = list(getattr(error, "unused_parameters", None) or [])
    shown = f" ({', '.join(names[:6])}{' ...' if len(names) > 6 else ''})" if names else ""
    args = getattr(facts.trainer, "args", None)
    checkpointing = _checkpointing(args)
    why = (
        "with gradient checkpointing on, the Trainer sets DDP's find_unused_parameters=False"
        if checkpointing and getattr(args, "ddp_find_unused_parameters", None) is None
        else "the script sets ddp_find_unused_parameters=False"
        if getattr(args, "ddp_find_unused_parameters", None) is False
        else "DDP does not look for unused parameters"
    )
    reentrant = f" with {_checkpointing_kwargs(args)}={{'use_reentrant': False}}" if checkpointing else ""
    return Explained(
        f"{len(names) or 'some'} trainable parameters get no gradient in a step{shown}: the forward does not use "
        f"them, and {why}, so DDP waits for their gradients and stops at the next step",
        "freeze or remove what the forward never uses (parameter.requires_grad_(False)), or set "
        f"ddp_find_unused_parameters=True in TrainingArguments{reentrant}",
    )


@row(
    PIPELINE,
    "reentrant gradient checkpointing under DDP looking for unused parameters",
    "RuntimeError: Expected to mark a variable ready only once.",
    r"Expected to mark a variable ready only once",
    "distributed",
)
def _ddp_ready_twice(match: re.Match[str], error: BaseException, facts: Pipeline) -> Found:
    args = getattr(facts.trainer, "args", None)
    if not _checkpointing(args):
        return None  # a parameter used outside forward, or shared between passes: the library's message says so
    return Explained(
        "reentrant gradient checkpointing (use_reentrant=True) runs each layer's backward again, so DDP, which "
        "looks for unused parameters, sees their gradients arrive twice",
        f"checkpoint without reentrance: {_checkpointing_kwargs(args)}={{'use_reentrant': False}} in TrainingArguments",
    )


def _checkpointing_kwargs(args: Any) -> str:
    """The arguments' name for checkpointing options: transformers 5 renamed gradient_ to activation_checkpointing."""
    return (
        "activation_checkpointing_kwargs"
        if hasattr(args, "activation_checkpointing_kwargs")
        else "gradient_checkpointing_kwargs"
    )


def _checkpointing(args: Any) -> bool:
    return bool(getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing", None))
