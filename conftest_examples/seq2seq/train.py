"""Spell numbers out in words with a tiny T5 trained from scratch (sequence to sequence).

Each row of the data is a number below 1000 ("347") and its English words ("three hundred forty
seven"). The word-level tokenizer, trained on the training rows when the script starts, splits the
numbers into single digits and ends every sequence with ``</s>``; like T5's, its pad token has id 0
and is also the decoder start token. ``DataCollatorForSeq2Seq`` pads the targets with -100 (ignored
by the loss). The model is built from a ``T5Config`` (no download).
Run directly with ``python train.py`` or test it with
``pytest --trainer-module=conftest_examples/seq2seq/train.py``.
"""

from pathlib import Path

import numpy as np
from datasets import load_dataset
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import (
    DataCollatorForSeq2Seq,
    PreTrainedTokenizerFast,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    T5Config,
    T5ForConditionalGeneration,
)

DATA_DIR = Path(__file__).parent / "data"
MAX_LENGTH = 16  # the longest target, "seven hundred seventy seven" + </s>, is 5 tokens
PAD, EOS, UNK = "<pad>", "</s>", "<unk>"  # ids 0, 1, 2, as in T5
IGNORE = -100


def build_tokenizer(texts):
    """A word-level tokenizer trained on ``texts`` that splits digits and appends EOS, wrapped for transformers."""
    core = Tokenizer(models.WordLevel(unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    core.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=[PAD, EOS, UNK]))
    core.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", special_tokens=[(EOS, core.token_to_id(EOS))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        model_max_length=MAX_LENGTH,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
    )


def preprocess(batch, tokenizer):
    """Token ids of the number (encoder input) and of its words (decoder targets, in ``labels``)."""
    return tokenizer(batch["number"], text_target=batch["words"], truncation=True)


def make_compute_metrics(tokenizer):
    def compute_metrics(eval_pred):
        predictions, labels = eval_pred
        # Generated ids are padded with -100 when the batches are gathered, and the collator padded
        # the targets with -100: neither is a token id, so put the pad id back before decoding.
        predictions = np.where(predictions != IGNORE, predictions, tokenizer.pad_token_id)
        labels = np.where(labels != IGNORE, labels, tokenizer.pad_token_id)
        predicted = tokenizer.batch_decode(predictions, skip_special_tokens=True)
        expected = tokenizer.batch_decode(labels, skip_special_tokens=True)
        exact = [p.strip() == e.strip() for p, e in zip(predicted, expected, strict=True)]
        return {"exact_match": float(np.mean(exact))}

    return compute_metrics


def main():
    raw = load_dataset(
        "json",
        data_files={
            "train": str(DATA_DIR / "train.jsonl"),
            "validation": str(DATA_DIR / "validation.jsonl"),
        },
    )

    tokenizer = build_tokenizer([*raw["train"]["number"], *raw["train"]["words"]])
    tokenized = raw.map(
        preprocess,
        batched=True,
        fn_kwargs={"tokenizer": tokenizer},
        remove_columns=["number", "words"],
    )

    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        dropout_rate=0.0,  # a model this small underfits rather than overfits
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,  # T5 starts decoding from the pad token
    )
    model = T5ForConditionalGeneration(config)

    args = Seq2SeqTrainingArguments(
        output_dir="seq2seq-tiny-t5",
        eval_strategy="epoch",
        save_strategy="epoch",
        save_total_limit=1,
        learning_rate=5e-3,
        num_train_epochs=20,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=20,
        predict_with_generate=True,  # evaluation generates, so compute_metrics sees whole answers
        generation_max_length=MAX_LENGTH,
        report_to="none",
    )

    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=tokenized["train"],
        eval_dataset=tokenized["validation"],
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),  # pads the labels with -100
        compute_metrics=make_compute_metrics(tokenizer),
    )
    trainer.train()


if __name__ == "__main__":
    main()
