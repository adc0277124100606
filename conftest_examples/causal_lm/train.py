"""Train a tiny GPT-2 from scratch on short made-up stories (causal language modelling).

The byte-level BPE tokenizer is trained on the training stories when the script starts; it
ends every text with ``<|endoftext|>`` and pads with its own ``<|pad|>`` token, which
``DataCollatorForLanguageModeling(mlm=False)`` turns into -100 in the labels. The model is built
from a ``GPT2Config`` (no download).
Run directly with ``python train.py`` or test it with
``pytest --trainer-module=conftest_examples/causal_lm/train.py``.
"""

from pathlib import Path

from datasets import load_dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    DataCollatorForLanguageModeling,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
)

DATA_DIR = Path(__file__).parent / "data"
MAX_POSITIONS = 128
EOS, PAD = "<|endoftext|>", "<|pad|>"


def build_tokenizer(texts):
    """A byte-level BPE tokenizer trained on ``texts`` that appends EOS, wrapped for transformers."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    bpe_trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    core.train_from_iterator(texts, bpe_trainer)
    core.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", special_tokens=[(EOS, core.token_to_id(EOS))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        model_max_length=MAX_POSITIONS,  # the model's positions: truncation=True must cut there
        bos_token=EOS,
        eos_token=EOS,
        pad_token=PAD,  # GPT-2 has no pad token; a separate one keeps EOS in the labels
    )


def preprocess_logits_for_metrics(logits, labels):
    """Keep only the predicted token ids, so evaluation does not gather the full vocabulary logits."""
    if isinstance(logits, tuple):
        logits = logits[0]
    return logits.argmax(dim=-1)


def compute_metrics(eval_pred):
    predictions, labels = eval_pred
    # The prediction at position i is for the token at position i + 1.
    predictions, labels = predictions[:, :-1], labels[:, 1:]
    mask = labels != -100
    return {"next_token_accuracy": float((predictions[mask] == labels[mask]).mean())}


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

    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=MAX_POSITIONS,
        n_embd=64,
        n_layer=2,
        n_head=2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = GPT2LMHeadModel(config)

    args = TrainingArguments(
        output_dir="causal-lm-tiny-gpt2",
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
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
    )
    trainer.train()


if __name__ == "__main__":
    main()
