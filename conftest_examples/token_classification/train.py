"""Tag colour words and animal words in short sentences with a tiny BERT (token classification).

Each row of the data is a list of words with one tag per word (``O``, ``COLOUR`` or ``ANIMAL``).
The WordPiece tokenizer, trained on the training sentences when the script starts, splits some
words into several pieces: the word's tag goes on its first piece, and -100 (ignored by the loss)
on its other pieces and on ``[CLS]``/``[SEP]``. The model is built from a ``BertConfig`` (no download).
Run directly with ``python train.py`` or test it with
``pytest --trainer-module=conftest_examples/token_classification/train.py``.
"""

from pathlib import Path

import numpy as np
from datasets import load_dataset
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    BertConfig,
    BertForTokenClassification,
    DataCollatorForTokenClassification,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
)

DATA_DIR = Path(__file__).parent / "data"
MAX_POSITIONS = 64
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LABELS = ["O", "COLOUR", "ANIMAL"]
LABEL_TO_ID = {label: index for index, label in enumerate(LABELS)}
IGNORE = -100


def build_tokenizer(texts):
    """A lower-casing WordPiece tokenizer trained on ``texts``, wrapped for transformers."""
    core = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    core.normalizer = normalizers.BertNormalizer(lowercase=True)
    core.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    core.decoder = decoders.WordPiece()
    # A small vocabulary, so that some words (beetle, lantern, donkey, ...) split into pieces.
    core.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=300, special_tokens=SPECIAL_TOKENS))
    core.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[("[CLS]", core.token_to_id("[CLS]")), ("[SEP]", core.token_to_id("[SEP]"))],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        model_max_length=MAX_POSITIONS,  # the model's positions: truncation=True must cut there
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def tokenize_and_align(batch, tokenizer):
    """Tokenize pre-split words and give each word's tag to its first piece only."""
    encoded = tokenizer(batch["tokens"], is_split_into_words=True, truncation=True)
    all_labels = []
    for index, tags in enumerate(batch["tags"]):
        labels, previous = [], None
        for word_id in encoded.word_ids(batch_index=index):
            if word_id is None or word_id == previous:  # special token, or a later piece of the same word
                labels.append(IGNORE)
            else:
                labels.append(LABEL_TO_ID[tags[word_id]])
            previous = word_id
        all_labels.append(labels)
    encoded["labels"] = all_labels
    return encoded


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    predictions = np.argmax(logits, axis=-1)
    mask = labels != IGNORE
    predictions, labels = predictions[mask], labels[mask]
    metrics = {"accuracy": float((predictions == labels).mean())}
    for label in ("COLOUR", "ANIMAL"):
        target = LABEL_TO_ID[label]
        true_positive = float(((predictions == target) & (labels == target)).sum())
        predicted, actual = float((predictions == target).sum()), float((labels == target).sum())
        metrics[f"f1_{label.lower()}"] = 2 * true_positive / max(predicted + actual, 1.0)
    return metrics


def main():
    raw = load_dataset(
        "json",
        data_files={
            "train": str(DATA_DIR / "train.jsonl"),
            "validation": str(DATA_DIR / "validation.jsonl"),
        },
    )

    tokenizer = build_tokenizer(" ".join(words) for words in raw["train"]["tokens"])
    tokenized = raw.map(
        tokenize_and_align,
        batched=True,
        fn_kwargs={"tokenizer": tokenizer},
        remove_columns=["tokens", "tags"],
    )

    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=MAX_POSITIONS,
        pad_token_id=tokenizer.pad_token_id,
        num_labels=len(LABELS),
        id2label=dict(enumerate(LABELS)),
        label2id=LABEL_TO_ID,
    )
    model = BertForTokenClassification(config)

    args = TrainingArguments(
        output_dir="token-classification-tiny-bert",
        eval_strategy="epoch",
        save_strategy="no",
        learning_rate=1e-3,
        num_train_epochs=8,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=16,
        report_to="none",
    )

    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=tokenized["train"],
        eval_dataset=tokenized["validation"],
        processing_class=tokenizer,
        data_collator=DataCollatorForTokenClassification(tokenizer),
        compute_metrics=compute_metrics,
    )
    trainer.train()


if __name__ == "__main__":
    main()
