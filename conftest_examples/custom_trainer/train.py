"""Triage help-desk tickets as urgent or routine with a Trainer subclass that weights its loss.

Only about one ticket in six is urgent, so a plain cross-entropy lets the model do well by calling
everything routine. ``WeightedLossTrainer`` overrides ``compute_loss`` to weight each class by
the inverse of its frequency in the training split. The model is a tiny BERT built from a config
(no download), with a WordPiece tokenizer trained on the training tickets when the script starts.
Run directly with ``python train.py`` or test it with
``pytest --trainer-module=conftest_examples/custom_trainer/train.py``.
"""

from pathlib import Path

import numpy as np
import torch
from datasets import load_dataset
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from torch import nn
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    DataCollatorWithPadding,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
)

DATA_DIR = Path(__file__).parent / "data"
MAX_POSITIONS = 64
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LABELS = ["routine", "urgent"]


class WeightedLossTrainer(Trainer):
    """A Trainer whose loss is cross-entropy with one weight per class."""

    def __init__(self, *args, class_weights, **kwargs):
        super().__init__(*args, **kwargs)
        self.class_weights = class_weights

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.logits
        weight = self.class_weights.to(device=logits.device, dtype=logits.dtype)
        loss = nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1), weight=weight)
        return (loss, outputs) if return_outputs else loss


def class_weights(labels, num_classes):
    """Inverse-frequency weights: each class contributes as much to the loss as a balanced split would."""
    counts = np.bincount(np.asarray(labels), minlength=num_classes)
    return torch.tensor(len(labels) / (num_classes * np.maximum(counts, 1)), dtype=torch.float32)


def build_tokenizer(texts):
    """A lower-casing WordPiece tokenizer trained on ``texts``, wrapped for transformers."""
    core = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    core.normalizer = normalizers.BertNormalizer(lowercase=True)
    core.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    core.decoder = decoders.WordPiece()
    core.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=500, special_tokens=SPECIAL_TOKENS))
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


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    predictions = np.argmax(logits, axis=-1)
    true_positive = float(((predictions == 1) & (labels == 1)).sum())
    return {
        "accuracy": float((predictions == labels).mean()),
        "urgent_recall": true_positive / max(float((labels == 1).sum()), 1.0),
        "urgent_precision": true_positive / max(float((predictions == 1).sum()), 1.0),
    }


def main():
    raw = load_dataset(
        "json",
        data_files={
            "train": str(DATA_DIR / "train.jsonl"),
            "validation": str(DATA_DIR / "validation.jsonl"),
        },
    )

    tokenizer = build_tokenizer(raw["train"]["text"])
    tokenized = raw.map(
        lambda batch: tokenizer(batch["text"], truncation=True),
        batched=True,
        remove_columns=["text"],
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
        label2id={label: index for index, label in enumerate(LABELS)},
    )
    model = BertForSequenceClassification(config)

    args = TrainingArguments(
        output_dir="custom-trainer-tiny-bert",
        eval_strategy="epoch",
        save_strategy="no",
        learning_rate=1e-3,
        num_train_epochs=8,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=16,
        report_to="none",
    )

    trainer = WeightedLossTrainer(
        model=model,
        args=args,
        train_dataset=tokenized["train"],
        eval_dataset=tokenized["validation"],
        processing_class=tokenizer,
        data_collator=DataCollatorWithPadding(tokenizer),
        compute_metrics=compute_metrics,
        class_weights=class_weights(raw["train"]["label"], len(LABELS)),
    )
    trainer.train()


if __name__ == "__main__":
    main()
