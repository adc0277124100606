"""What each kind of task feeds its model and what its labels mean: the one place checks ask.

A check never branches on the model's class. It asks the pipeline's `Task` whether it applies
(`task.skip(check)` gives the reason when it does not) and what to read: the token-sequence input,
what a label is, whether a choices axis sits between the batch and the tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_trainer import model_facts

# What a label is, for each kind of task.
CLASS = "class"  # one class id per row (text, image, audio classification)
TOKEN_CLASS = "token class"  # one class id per token, -100 where ignored
CHOICE = "choice"  # the index of the right choice (multiple choice)
FLOAT = "float"  # a number per row (regression)
MULTI_HOT = "multi-hot"  # a float row of 0/1 per class (multi-label classification)
TOKEN_IDS = "token ids"  # next or masked tokens (language modelling)
DECODER_TARGETS = "decoder targets"  # target token ids of an encoder-decoder
POSITIONS = "positions"  # start and end positions in the sequence (extractive QA)
TRANSCRIPT = "transcript"  # CTC targets
PREFERENCE = "preference"  # chosen against rejected; no label column
UNKNOWN = "unknown"

#: Labels that are class ids checked against a width.
CLASS_IDS = (CLASS, TOKEN_CLASS, CHOICE)
#: Labels whose values a property can vary over a domain and feed back to the loss.
VARIABLE = (CLASS, TOKEN_CLASS, CHOICE, FLOAT, MULTI_HOT)
#: Inputs that are token ids, whose length is the sequence length.
TOKEN_INPUTS = ("input_ids",)
#: Trainers that build their own batches from preference pairs.
PREFERENCE_TRAINERS = ("DPOTrainer", "RewardTrainer", "KTOTrainer", "ORPOTrainer", "CPOTrainer")
#: The token-id columns those trainers tokenize into (TRL's names across its versions).
PREFERENCE_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids", "completion_ids", "prompt_input_ids",
                      "chosen_input_ids", "rejected_input_ids", "completion_input_ids", "input_ids_chosen",
                      "input_ids_rejected")
#: Batch keys of an encoder-decoder that run along the target, not along the encoder's tokens.
DECODER_KEYS = ("labels", "decoder_input_ids", "decoder_attention_mask")

_NOT_CLASSES = {
    TOKEN_IDS: "a language model's labels are token ids, not classes: the dataset, targets and lengths checks "
               "cover them",
    DECODER_TARGETS: "seq2seq labels are decoder target token ids, not classes: the dataset check covers them",
    POSITIONS: "question-answering labels are start and end positions in each sequence, not classes",
    TRANSCRIPT: "CTC labels are transcripts of token ids, not classes",
    PREFERENCE: "preference pairs have no label column: the trainer scores chosen against rejected",
    UNKNOWN: "what this model takes as labels is unknown to pytest-trainer",
}


@dataclass(frozen=True)
class Task:
    """One kind of training task as the checks need to know it."""

    name: str
    labels: str
    #: The token-id input whose last axis is the sequence, or None (pixels, audio, a model of your own).
    sequence: str | None
    #: A choices axis between the batch and the tokens.
    nested: bool = False
    #: The model's loss shifts the labels itself (causal LM).
    shifts_labels: bool = False
    #: The model is a transformers model whose inputs and labels follow the library's conventions.
    conventional: bool = True
    #: Labels that are positions in the sequence (an answer span).
    positions: tuple[str, ...] = ()

    @property
    def token_columns(self) -> tuple[str, ...]:
        """Sample or batch keys that hold token ids of the model's vocabulary."""
        own = (self.sequence,) if self.sequence else ()
        return own + PREFERENCE_COLUMNS if self.labels == PREFERENCE else own

    def along_sequence(self, key: str) -> bool:
        """Whether a batch key runs along the tokens of the sequence input (so padding it pads them)."""
        return not (self.labels == DECODER_TARGETS and key in DECODER_KEYS)

    def skip(self, check: str) -> str | None:
        """Why `check` does not apply to this task, or None when it does."""
        if check == "targets" and not (self.labels == TOKEN_IDS and self.shifts_labels):
            return f"{self.name}: no causal-LM supervision to audit (the dataset stage checks these labels)"
        if check == "labels" and self.labels not in VARIABLE:
            return _NOT_CLASSES.get(self.labels, _NOT_CLASSES[UNKNOWN])
        if check in ("lengths", "padding"):
            if self.labels == PREFERENCE:
                return "preference pairs are tokenized and padded by the trainer itself, as chosen and rejected"
            if self.sequence is None and not self.conventional:
                return f"{self.name}: pytest-trainer cannot tell which input of a model of your own is its token " \
                       "sequence, so it varies no length"
            if self.sequence is None:
                return f"{self.name}: the model takes no token sequence whose length could vary"
            if check == "padding" and self.positions:
                return "question answering: the softmax over answer positions spans the padding too (transformers' " \
                       "QA heads do not mask it), so padded and unpadded losses differ by design"
            if check == "padding" and self.nested:
                return "multiple choice pads every choice of a row to one length: the padding property does not " \
                       "cover a choices axis"
        return None


def detect(model: Any, trainer: Any) -> Task:
    """The task of a Trainer, from its class and its model's class and config."""
    from transformers import PreTrainedModel

    base = model_facts.base_model(model)
    kind = type(base).__name__
    main = getattr(base, "main_input_name", "input_ids")
    sequence = main if main in TOKEN_INPUTS else None
    if any(cls.__name__ in PREFERENCE_TRAINERS for cls in type(trainer).__mro__):
        return Task("preference pairs", PREFERENCE, sequence)
    if not isinstance(base, PreTrainedModel):
        return Task(f"a model of your own ({kind})", UNKNOWN, None, conventional=False)
    config = getattr(base, "config", None)
    if kind.endswith("ForMultipleChoice"):
        return Task("multiple choice", CHOICE, sequence, nested=True)
    if kind.endswith("ForTokenClassification"):
        return Task("token classification", TOKEN_CLASS, sequence)
    if kind.endswith("ForQuestionAnswering"):
        return Task("question answering", POSITIONS, sequence, positions=("start_positions", "end_positions"))
    if kind.endswith("ForCTC"):
        return Task("speech recognition (CTC)", TRANSCRIPT, sequence)
    if kind.endswith(("ForCausalLM", "LMHeadModel")):
        return Task("causal language modelling", TOKEN_IDS, sequence, shifts_labels=True)
    if kind.endswith(("ForMaskedLM", "ForPreTraining")):
        return Task("masked language modelling", TOKEN_IDS, sequence)
    if getattr(config, "is_encoder_decoder", False) or kind.endswith(("ForConditionalGeneration", "Seq2SeqLM")):
        return Task("sequence to sequence", DECODER_TARGETS, sequence)
    if kind.endswith("Classification"):
        problem = getattr(config, "problem_type", None)
        name = {"input_ids": "text classification", "pixel_values": "image classification"}.get(
            main, "audio classification" if main.startswith("input_") else "classification"
        )
        if problem == "regression" or getattr(config, "num_labels", 2) == 1:
            return Task(f"{name} (regression)", FLOAT, sequence)
        if problem == "multi_label_classification":
            return Task(f"{name} (multi-label)", MULTI_HOT, sequence)
        return Task(name, CLASS, sequence)
    return Task(f"a {kind}", UNKNOWN, sequence)


def preference_figures(trainer: Any) -> dict[str, float]:
    """The last chosen and rejected log-probabilities and rewards a preference trainer logged (TRL's metrics)."""
    logged = getattr(trainer, "_metrics", None)
    if not isinstance(logged, dict):
        return {}
    figures: dict[str, float] = {}
    for metrics in logged.values():
        for name, values in (metrics.items() if isinstance(metrics, dict) else ()):
            if name.split("/")[0] in ("logps", "rewards") and isinstance(values, list) and values:
                figures[name.replace("/", "_")] = float(values[-1])
    return figures
