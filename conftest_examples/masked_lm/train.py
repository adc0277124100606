"""Pretrain a tiny BERT with masked language modelling on short made-up sentences about small towns.

The WordPiece tokenizer is trained on the training sentences when the script starts, the model is
built from a ``BertConfig`` (no download), and ``DataCollatorForLanguageModeling`` masks 15% of
the tokens of every batch (the labels are -100 everywhere else).
Run directly with ``python train.py`` or test it with
``pytest --trainer-module=conftest_examples/masked_lm/train.py``.
"""

from pathlib import Path

from datasets import load_dataset
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    BertConfig,
    BertForMaskedLM,
    DataCollatorForLanguageModeling,
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


def preprocess_logits_for_metrics(logits, labels):
    """Keep only the predicted token ids, so evaluation does not gather the full vocabulary logits."""
    if isinstance(logits, tuple):
        logits = logits[0]
    return logits.argmax(dim=-1)


def compute_metrics(eval_pred):
    predictions, labels = eval_pred
    mask = labels != -100  # only the masked positions have labels
    return {"masked_token_accuracy": float((predictions[mask] == labels[mask]).mean())}


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
    )
    model = BertForMaskedLM(config)

    args = TrainingArguments(
        output_dir="masked-lm-tiny-bert",
        eval_strategy="epoch",
        save_strategy="no",
        learning_rate=1e-3,
        warmup_steps=20,
        num_train_epochs=10,
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
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15),
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
    )
    trainer.train()


if __name__ == "__main__":
    main()
