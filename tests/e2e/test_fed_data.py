"""The fed data is checked across the whole split, not its first rows, and a pad id that is also the end token is
no false alarm.

A split sorted by class (an image folder, a text split sorted by label) shows only its first classes in its
first rows. `dataset` reads a transform's output on rows spread over the split, and reads the label column the
transform passes through unchanged from storage over every row, naming the real dataset row.
"""

from __future__ import annotations

import pytest
from pipeline_runs import failures, outcomes, run_script, write

from pytest_trainer import tables

# ---------------------------------------------------------------------------------------------------------------
# Pure parts.


def test_spread_rows_are_evenly_spaced_and_keep_both_ends() -> None:
    assert tables.spread(10, 0) == list(range(10))
    assert tables.spread(10, 20) == list(range(10))
    assert tables.spread(100, 5) == [0, 24, 49, 74, 99]
    assert tables.spread(100, 1) == [0]
    rows = tables.spread(100_000, 256)
    assert len(set(rows)) == 256 and rows == sorted(rows) and rows[0] == 0 and rows[-1] == 99_999


# ---------------------------------------------------------------------------------------------------------------
# A 10-class image folder, rows sorted by class as an image folder is, turned into pixels by with_transform.

IMAGE_FOLDER = """
    import pathlib
    import random

    import torch
    from datasets import load_dataset
    from PIL import Image
    from transformers import Trainer, TrainingArguments, ViTConfig, ViTForImageClassification

    try:  # transformers 5: the PIL-based processor has its own name
        from transformers import ViTImageProcessorPil
    except ImportError:  # transformers 4: the default processor is the PIL-based one
        from transformers import ViTImageProcessor as ViTImageProcessorPil

    CLASSES = [f"class{index}" for index in range(10)]
    root = pathlib.Path("images")
    rng = random.Random(0)
    for index, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True, exist_ok=True)
        for copy in range(4):
            Image.new("RGB", (16, 16), (index * 25, rng.randint(0, 255), 255 - index * 25)).save(
                root / name / f"{copy}.png")

    data = load_dataset("imagefolder", data_dir=str(root), split="train")
    processor = ViTImageProcessorPil(size={"height": 16, "width": 16})


    def transform(batch):
        pixels = processor([image.convert("RGB") for image in batch["image"]], return_tensors="pt")["pixel_values"]
        return {"pixel_values": pixels, "label": batch["label"]}


    def collate(examples):
        return {"pixel_values": torch.stack([example["pixel_values"] for example in examples]),
                "labels": torch.tensor([example["label"] for example in examples])}


    config = ViTConfig(image_size=16, patch_size=8, num_channels=3, hidden_size=16, num_hidden_layers=1,
                       num_attention_heads=2, intermediate_size=32, num_labels=CLASS_COUNT)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, remove_unused_columns=False,
                             report_to="none")
    trainer = Trainer(model=ViTForImageClassification(config), args=args, train_dataset=data.with_transform(transform),
                      data_collator=collate, processing_class=processor)
    trainer.train()
"""


def test_image_folder_with_a_head_too_small_fails_dataset_naming_the_label_range(project: pytest.Pytester) -> None:
    write(project, "train.py", IMAGE_FOLDER.replace("CLASS_COUNT", "2"))
    result = run_script(project, "--trainer-stages=dataset")
    assert failures(result) == ["dataset[cpu]"]
    # Rows 0-7 are classes 0 and 1; row 8 is the first of class 2, named by its index in the dataset.
    result.stdout.fnmatch_lines(
        [
            "*labels range 0..9 (10 classes) but the model has 2 outputs (row 8 of the training dataset has label 2)*",
            "*fix: pass num_labels=10 when building the model, e.g. ViTConfig(..., num_labels=10)",
        ]
    )
    result.stdout.no_fnmatch_line("*Target * is out of bounds*")


def test_image_folder_with_a_head_of_every_class_passes(project: pytest.Pytester) -> None:
    write(project, "train.py", IMAGE_FOLDER.replace("CLASS_COUNT", "10"))
    result = run_script(project, "--trainer-stages=dataset,collate,forward")
    assert outcomes(result) == {"dataset[cpu]": "PASSED", "collate[cpu]": "PASSED", "forward[cpu]": "PASSED"}


# ---------------------------------------------------------------------------------------------------------------
# A text split sorted by label, tokenized on the fly by a transform.

SORTED_TEXT = """
    import tiny
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

    tok = tiny.tokenizer()
    raw = tiny.text_dataset(count=60).sort("label")


    def transform(batch):
        encoded = tok(batch["text"], truncation=True)
        encoded["labels"] = LABELS
        return encoded


    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, remove_unused_columns=False,
                             report_to="none")
    trainer = Trainer(model=tiny.classifier(num_labels=CLASS_COUNT), args=args,
                      train_dataset=raw.with_transform(transform), processing_class=tok,
                      data_collator=DataCollatorWithPadding(tok))
    trainer.train()
"""


def test_text_sorted_by_label_fails_on_the_first_row_of_the_late_class(project: pytest.Pytester) -> None:
    write(project, "train.py", SORTED_TEXT.replace("LABELS", 'batch["label"]').replace("CLASS_COUNT", "2"))
    # Renamed from "label" to "labels" but passed through unchanged: read from storage over all 60 rows.
    result = run_script(project, "--trainer-stages=dataset", "--trainer-sample=4")
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(
        ["*labels range 0..2 (3 classes) but the model has 2 outputs (row 40 of the training dataset has label 2)*"]
    )


def test_a_computed_label_is_read_on_rows_spread_over_the_split(project: pytest.Pytester) -> None:
    # The transform computes the labels (class 2 becomes 5), so they cannot be read from storage: the four
    # samples spread over the split (rows 0, 19, 39, 59) still reach the last class, and the row named is 59.
    computed = '[5 if label == 2 else label for label in batch["label"]]'
    write(project, "train.py", SORTED_TEXT.replace("LABELS", computed).replace("CLASS_COUNT", "3"))
    result = run_script(project, "--trainer-stages=dataset", "--trainer-sample=4")
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(
        ["*labels range 0..5 (6 classes) but the model has 3 outputs (row 59 of the training dataset has label 5)*"]
    )


def test_text_sorted_by_label_with_every_class_in_the_head_passes(project: pytest.Pytester) -> None:
    write(project, "train.py", SORTED_TEXT.replace("LABELS", 'batch["label"]').replace("CLASS_COUNT", "3"))
    result = run_script(project, "--trainer-stages=dataset", "--trainer-sample=4")
    assert outcomes(result) == {"dataset[cpu]": "PASSED"}


# ---------------------------------------------------------------------------------------------------------------
# Whisper-style speech seq2seq: the pad id is the end-of-text id, and every label row ends with one of them.

WHISPER = """
    import random
    from dataclasses import dataclass
    from types import SimpleNamespace

    import numpy as np
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import (PreTrainedTokenizerFast, Seq2SeqTrainer, Seq2SeqTrainingArguments, WhisperConfig,
                              WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperProcessor)

    WORDS = "the a cat dog bird sat ran flew on under mat log tree big small".split()
    SPECIAL = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]
    VOCAB = {token: index for index, token in enumerate(SPECIAL + WORDS)}
    core = Tokenizer(models.WordLevel(VOCAB, unk_token="<|endoftext|>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(
        single="<|startoftranscript|> <|en|> <|transcribe|> <|notimestamps|> $A <|endoftext|>",
        special_tokens=[(token, VOCAB[token]) for token in SPECIAL])
    # As Whisper's own tokenizer: <|endoftext|> is the pad, the end and the start token at once.
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                        pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    extractor = WhisperFeatureExtractor(feature_size=16, chunk_length=1)  # 1 s of audio: 100 frames of 16 bins
    try:  # a processor (feature extractor + tokenizer) has no pad_token_id of its own
        processor = given = WhisperProcessor(feature_extractor=extractor, tokenizer=tokenizer)
    except TypeError:  # transformers 4 wants a WhisperTokenizer: give the extractor, as the Whisper blog post does
        processor, given = SimpleNamespace(feature_extractor=extractor, tokenizer=tokenizer), extractor

    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))) for _ in range(24)]
    waves = [np.sin(np.arange(rng.randint(4000, 16000)) * rng.uniform(0.01, 0.2)).astype(np.float32) for _ in texts]


    def prepare(row):
        row["input_features"] = extractor(row["audio"], sampling_rate=16000).input_features[0]
        row["labels"] = tokenizer(row["text"]TARGET_PADDING).input_ids
        return row


    data = Dataset.from_dict({"audio": waves, "text": texts}).map(prepare, remove_columns=["audio", "text"])


    @dataclass
    class DataCollatorSpeechSeq2SeqWithPadding:  # as in the Whisper fine-tuning blog post
        processor: object
        decoder_start_token_id: int

        def __call__(self, features):
            inputs = [{"input_features": feature["input_features"]} for feature in features]
            batch = self.processor.feature_extractor.pad(inputs, return_tensors="pt")
            labels_batch = self.processor.tokenizer.pad([{"input_ids": feature["labels"]} for feature in features],
                                                        return_tensors="pt")
            labels = labels_batch["input_ids"].masked_fill(labels_batch.attention_mask.ne(1), -100)
            if (labels[:, 0] == self.decoder_start_token_id).all().cpu().item():
                labels = labels[:, 1:]
            batch["labels"] = labels
            return batch


    end = VOCAB["<|endoftext|>"]
    config = WhisperConfig(vocab_size=len(VOCAB), num_mel_bins=16, d_model=16, encoder_layers=1, decoder_layers=1,
                           encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                           decoder_ffn_dim=32, max_source_positions=50, max_target_positions=32, pad_token_id=end,
                           eos_token_id=end, bos_token_id=end, decoder_start_token_id=VOCAB["<|startoftranscript|>"],
                           suppress_tokens=[], begin_suppress_tokens=[])
    model = WhisperForConditionalGeneration(config)
    args = Seq2SeqTrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=data, processing_class=given,
                             data_collator=DataCollatorSpeechSeq2SeqWithPadding(processor,
                                                                                config.decoder_start_token_id))
    trainer.train()
"""


def test_whisper_labels_ending_in_one_end_token_that_is_the_pad_id_pass(project: pytest.Pytester) -> None:
    write(project, "train.py", WHISPER.replace("TARGET_PADDING", ""))
    stages = ("dataset", "collate", "forward", "backward", "step")
    result = run_script(project, f"--trainer-stages={','.join(stages)}")
    assert outcomes(result) == {f"{stage}[cpu]": "PASSED" for stage in stages}


def test_whisper_targets_padded_to_max_length_with_the_pad_id_fail_dataset(project: pytest.Pytester) -> None:
    write(project, "train.py", WHISPER.replace("TARGET_PADDING", ', padding="max_length", max_length=20'))
    result = run_script(project, "--trainer-stages=dataset")
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "*the labels hold the pad id 0 (row 0 of the training dataset, after its end token, and * positions in all) "
            "instead of -100*",
            "*label_pad_token_id=-100*",
        ]
    )


def test_whisper_targets_the_collator_pads_with_the_pad_id_fail_collate(project: pytest.Pytester) -> None:
    """The blog post's collator without its masked_fill: the rows are stored whole, the collator pads them with the end
    token, which is the pad id; the correct collator (above) passes."""
    masked = 'labels = labels_batch["input_ids"].masked_fill(labels_batch.attention_mask.ne(1), -100)'
    assert masked in WHISPER
    write(
        project, "train.py", WHISPER.replace("TARGET_PADDING", "").replace(masked, 'labels = labels_batch["input_ids"]')
    )
    result = run_script(project, "--trainer-stages=dataset,collate")
    assert failures(result) == ["collate[cpu]"], result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(
        [
            "*the labels hold the pad id * (row * of the first batch the collator made and * positions in all) instead of -100*",
            "*fix: in DataCollatorSpeechSeq2SeqWithPadding, set the labels' padded positions to -100 by the mask the "
            "tokenizer's pad() returns*",
        ]
    )
