"""What each kind of task feeds its model and what its labels mean: the one place checks ask.

A check never branches on the model's class. It reads the pipeline's `Task`: what a label is (its kind), the
width of a classification head, the token-sequence input, whether a choices axis sits between the batch and
the tokens, which value the losses ignore. Labels are keyed by kind; every fact about a kind is here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_trainer import model_facts

#: Label value that the losses of transformers (and torch's cross entropy) ignore.
IGNORE_INDEX = -100

# What a label is, for each kind of task.
CLASS = "class"  # one class id per row (text, image, audio classification)
TOKEN_CLASS = "token class"  # one class id per token, IGNORE_INDEX where ignored
CHOICE = "choice"  # the index of the right choice (multiple choice)
FLOAT = "float"  # a number per row (regression)
MULTI_HOT = "multi-hot"  # a float row of 0/1 per class (multi-label classification)
TOKEN_IDS = "token ids"  # next or masked tokens (language modelling)
DECODER_TARGETS = "decoder targets"  # target token ids of an encoder-decoder
POSITIONS = "positions"  # start and end positions in the sequence (extractive QA)
TRANSCRIPT = "transcript"  # CTC targets
PREFERENCE = "preference"  # chosen against rejected; no label column
REWARD = "reward"  # sampled completions scored by reward functions (online RL); no label column
EMBEDDING = "embedding"  # texts encoded by sentence-transformers, with a label whose meaning its loss decides
UNKNOWN = "unknown"

#: Labels that are class ids checked against a width.
CLASS_IDS = (CLASS, TOKEN_CLASS, CHOICE)
#: Labels whose values a property can vary over a domain and feed back to the loss.
VARIABLE = (CLASS, TOKEN_CLASS, CHOICE, FLOAT, MULTI_HOT)
#: Inputs that are token ids, whose length is the sequence length.
TOKEN_INPUTS = ("input_ids",)
#: Batch keys of an encoder-decoder that run along the target, not along the encoder's tokens.
DECODER_KEYS = ("labels", "decoder_input_ids", "decoder_attention_mask")

#: Why a label of each kind is not a class id whose values could be varied.
NOT_CLASSES = {
    TOKEN_IDS: "a language model's labels are token ids, not classes: the dataset, targets and lengths checks "
    "cover them",
    DECODER_TARGETS: "seq2seq labels are decoder target token ids, not classes: the dataset check covers them",
    POSITIONS: "question-answering labels are start and end positions in each sequence, not classes",
    TRANSCRIPT: "CTC labels are transcripts of token ids, not classes",
    PREFERENCE: "preference pairs have no label column: the trainer scores chosen against rejected",
    REWARD: "online RL has no label column: reward functions score the completions the model samples",
    EMBEDDING: "a sentence-transformers loss decides what its label is (a score, a class, none): the dataset check "
    "holds the labels to the loss",
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
    #: Outputs of a single-label classification head of class ids (None: no such head).
    classes: int | None = None
    #: The class a fix names when it rebuilds the model with another num_labels.
    auto_class: str = "AutoModelForSequenceClassification"
    #: Sample or batch keys beside the sequence that hold token ids of the model's vocabulary (preference pairs).
    more_token_columns: tuple[str, ...] = ()
    #: The token id that stands for image features in the sequence (a vision-language model), else None.
    image_token: int | None = None

    @property
    def token_columns(self) -> tuple[str, ...]:
        """Sample or batch keys that hold token ids of the model's vocabulary."""
        return ((self.sequence,) if self.sequence else ()) + self.more_token_columns

    @property
    def label_collator(self) -> str:
        """The collator of transformers that pads this task's per-token labels with IGNORE_INDEX."""
        if self.labels == TOKEN_CLASS:
            return "DataCollatorForTokenClassification(tokenizer)"
        return "DataCollatorForSeq2Seq(tokenizer, model=model)"

    def along_sequence(self, key: str) -> bool:
        """Whether a batch key runs along the tokens of the sequence input (so padding it pads them)."""
        return not (self.labels == DECODER_TARGETS and key in DECODER_KEYS)

    def no_sequence(self) -> str | None:
        """Why this task has no token sequence whose length a property could vary, or None when it has one."""
        if self.sequence is None and not self.conventional:
            return (
                f"{self.name}: pytest-trainer cannot tell which input of a model of your own is its token "
                "sequence, so it varies no length"
            )
        if self.sequence is None:
            return f"{self.name}: the model takes no token sequence whose length could vary"
        return None

    def not_classes(self) -> str | None:
        """Why this task's labels are no values a property can vary, or None when they are."""
        if self.labels in VARIABLE:
            return None
        return NOT_CLASSES.get(self.labels, NOT_CLASSES[UNKNOWN])


def detect(model: Any) -> Task:
    """The task of a model, from its class and its config (a trainer family may say otherwise)."""
    from transformers import PreTrainedModel

    base = model_facts.base_model(model)
    kind = type(base).__name__
    main = getattr(base, "main_input_name", "input_ids")
    sequence = main if main in TOKEN_INPUTS else None
    if not isinstance(base, PreTrainedModel):
        return Task(f"a model of your own ({kind})", UNKNOWN, None, conventional=False)
    config = getattr(base, "config", None)
    count = getattr(config, "num_labels", None)
    classes = count if isinstance(count, int) and count > 1 else None
    if kind.endswith("ForMultipleChoice"):
        return Task("multiple choice", CHOICE, sequence, nested=True)
    if kind.endswith("ForTokenClassification"):
        return Task(
            "token classification", TOKEN_CLASS, sequence, classes=classes, auto_class="AutoModelForTokenClassification"
        )
    if kind.endswith("ForQuestionAnswering"):
        return Task("question answering", POSITIONS, sequence, positions=("start_positions", "end_positions"))
    if kind.endswith("ForCTC"):
        return Task("speech recognition (CTC)", TRANSCRIPT, sequence)
    if kind.endswith(("ForCausalLM", "LMHeadModel")):
        return Task("causal language modelling", TOKEN_IDS, sequence, shifts_labels=True)
    if kind.endswith(("ForMaskedLM", "ForPreTraining")):
        return Task("masked language modelling", TOKEN_IDS, sequence)
    if kind.endswith("Classification"):  # an encoder-decoder's classifier too (BART, T5)
        problem = getattr(config, "problem_type", None)
        name = {"input_ids": "text classification", "pixel_values": "image classification"}.get(
            main, "audio classification" if main.startswith("input_") else "classification"
        )
        if problem == "regression" or count == 1:
            return Task(f"{name} (regression)", FLOAT, sequence)
        if problem == "multi_label_classification":
            return Task(f"{name} (multi-label)", MULTI_HOT, sequence)
        # A text head is rebuilt with AutoModelForSequenceClassification; an image or audio one with its own class.
        auto_class = "AutoModelForSequenceClassification" if main == "input_ids" else kind
        return Task(name, CLASS, sequence, classes=classes, auto_class=auto_class)
    if kind.endswith("ForConditionalGeneration") and vision_language(config):
        return Task(
            "vision-language causal language modelling",
            TOKEN_IDS,
            sequence,
            shifts_labels=True,
            image_token=image_token(config),
        )
    if getattr(config, "is_encoder_decoder", False) or kind.endswith(("ForConditionalGeneration", "Seq2SeqLM")):
        return Task("sequence to sequence", DECODER_TARGETS, sequence)
    return Task(f"a {kind}", UNKNOWN, sequence)


def vision_language(config: Any) -> bool:
    """Whether a `...ForConditionalGeneration` config is a decoder-only vision-language model (LLaVA, Idefics3,
    Qwen2-VL): not an encoder-decoder, with a vision config beside the text config of a decoder."""
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    text = getattr(config, "text_config", None)
    if text is None or getattr(text, "is_encoder_decoder", False):
        return False
    return getattr(config, "vision_config", None) is not None


def image_token(config: Any) -> int | None:
    """The id of the token whose positions the vision features fill, as the model's config names it."""
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value >= 0:
            return value
    return None
