"""Regress a made-up "sentiment intensity" score in [0, 1] from a sentence with a tiny BERT.

The model is built from a config (no download) with one output (``num_labels=1``), so
``BertForSequenceClassification`` computes a mean-squared-error loss on the float labels.
The WordPiece tokenizer is trained on the training sentences when the script starts.
Run directly with ``python train.py`` or test it with
``pytest --trainer-module=conftest_examples/regression/train.py``.
"""

from pathlib import Path

import numpy as np
from datasets import Value, load_dataset
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
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


def build_tokenizer(texts):
    """A lower-casing WordPiece tokenizer trained on ``texts``, wrapped for transformers."""
    core = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    core.normalizer = normalizers.BertNormalizer(lowercase=True)
    core.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    core.decoder = decoders.WordPiece()
    core.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=400, special_tokens=SPECIAL_TOKENS))
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
    predictions, labels = eval_pred
    predictions = np.clip(predictions.reshape(-1), 0.0, 1.0)
    errors = predictions - labels.reshape(-1)
    return {"mse": float(np.mean(errors**2)), "mae": float(np.mean(np.abs(errors)))}


def main():
    raw = load_dataset(
        "json",
        data_files={
            "train": str(DATA_DIR / "train.jsonl"),
            "validation": str(DATA_DIR / "validation.jsonl"),
        },
    )
    # JSON floats load as float64; the model's logits are float32, and so must the MSE target be.
    raw = raw.cast_column("label", Value("float32"))

    tokenizer = build_tokenizer(raw["train"]["text"])
    tokenized = raw.map(
        lambda batch: tokenizer(batch["text"], truncation=True),
        batched=True,
        remove_columns=["text"],
    )

    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=MAX_POSITIONS,
        pad_token_id=tokenizer.pad_token_id,
        num_labels=1,
        problem_type="regression",
    )
    model = BertForSequenceClassification(config)

    args = TrainingArguments(
        output_dir="regression-tiny-bert",
        eval_strategy="epoch",
        save_strategy="no",
        learning_rate=2e-3,
        num_train_epochs=20,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=32,
        report_to="none",
    )

    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=tokenized["train"],
        eval_dataset=tokenized["validation"],
        processing_class=tokenizer,
        data_collator=DataCollatorWithPadding(tokenizer),
        compute_metrics=compute_metrics,
    )
    trainer.train()


if __name__ == "__main__":
    main()
