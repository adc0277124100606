"""A `trainer` fixture for the trainer_pipeline marker: a small Trainer built in the test suite itself.

Session-scoped, so the model and data are built once for every stage and device.
"""

import pytest
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
)

WORDS = ["the", "a", "movie", "film", "plot", "actor", "was", "is", "great", "awful", "boring", "fun", "long", "short"]
VOCAB = {word: index for index, word in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS])}
REVIEWS = [
    ("the movie was great", 1),
    ("the plot was boring", 0),
    ("a fun film", 1),
    ("the actor is awful", 0),
    ("great fun", 1),
    ("the film was long and boring", 0),
    ("a great actor", 1),
    ("awful plot", 0),
] * 4
#: Reviews the model never trains on, for the evaluation.
HELD_OUT = [
    ("the film is fun", 1),
    ("a boring plot", 0),
    ("the actor was great", 1),
    ("a long and awful movie", 0),
]


def build_tokenizer() -> PreTrainedTokenizerFast:
    core = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", VOCAB["[CLS]"]), ("[SEP]", VOCAB["[SEP]"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        model_max_length=32,  # the model's positions: truncation=True must cut there
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
    )


@pytest.fixture(scope="session")
def trainer(tmp_path_factory: pytest.TempPathFactory) -> Trainer:
    tokenizer = build_tokenizer()

    def tokenized(reviews: list[tuple[str, int]]) -> Dataset:
        raw = Dataset.from_dict({"text": [text for text, _ in reviews], "label": [label for _, label in reviews]})
        return raw.map(lambda batch: tokenizer(batch["text"]), batched=True, remove_columns=["text"])

    config = BertConfig(
        vocab_size=len(VOCAB),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=2,
    )
    args = TrainingArguments(
        output_dir=str(tmp_path_factory.mktemp("trainer")), per_device_train_batch_size=8, report_to="none"
    )
    return Trainer(
        model=BertForSequenceClassification(config),
        args=args,
        train_dataset=tokenized(REVIEWS),
        eval_dataset=tokenized(HELD_OUT),
        processing_class=tokenizer,
    )
