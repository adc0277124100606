"""Pipelines beyond text classification: vision, audio, multiple choice, seq2seq, TRL, a model of one's own.

Each style has a correct script (trained for 2 steps once with `python train.py` before its expectations were
written), which must pass without a false alarm, and a broken form, which must fail at its stage with the cause named.
"""

from __future__ import annotations

import json

import numpy  # noqa: F401
import PIL.Image  # noqa: F401
import pytest
import trl  # noqa: F401
from pipeline_runs import ITEMS, failures, outcomes, run_script, write
from task_scripts import LM
from transformers import (  # noqa: F401
    BertForMultipleChoice,
    DataCollatorForMultipleChoice,
    DataCollatorForSeq2Seq,
    LlamaForCausalLM,
    Seq2SeqTrainer,
    T5ForConditionalGeneration,
    ViTForImageClassification,
    Wav2Vec2FeatureExtractor,
    Wav2Vec2ForSequenceClassification,
)
from trl import DPOTrainer, SFTTrainer  # noqa: F401

# The libraries above are imported here, before pytester's in-process runs, for the reason conftest gives.

#: The stages every correct pipeline with an eval split must pass; the property items may skip with a reason.
CORE = ("dataset", "collate", "forward", "backward", "step", "overfit", "eval", "save", "precision", "memory")

#: Where the correct scripts' runs write the plugin's JSON report, which ties each skip reason to its item.
REPORT = "--trainer-report=report.json"


def skip_reasons(project: pytest.Pytester, result: pytest.RunResult) -> dict[str, str]:
    """`{"labels[cpu]": reason, ...}` for each skipped item of the run, from its JSON report (the `-rs` summary
    lines name no item and group identical reasons); the `-rs` lines are printed so that a reader sees them."""
    for line in result.outlines:
        if line.startswith("SKIPPED ["):
            print(line)
    items = json.loads((project.path / "report.json").read_text())["items"]
    return {f"{item['stage']}[{item['device']}]": item["reason"] for item in items if item["outcome"] == "skipped"}


def check_correct(
    project: pytest.Pytester,
    result: pytest.RunResult,
    passed: tuple[str, ...] = CORE,
    skipped: dict[str, str] | None = None,
) -> dict[str, str]:
    """No failure; every item ran, each either PASSED (`passed`) or SKIPPED with its reason (`skipped` maps the
    item to a distinctive fragment of the reason, which the `-rs` summary shows in full). `result` is a run with
    `REPORT`.

    `targets` audits causal-LM supervision: every other task lists it in `skipped` (see `not_causal`).
    """
    skipped = skipped or {}
    statuses = outcomes(result)
    reasons = skip_reasons(project, result)
    assert failures(result) == [], result.stdout.str()[-6000:]
    assert set(statuses) == {f"{item}[cpu]" for item in ITEMS}, statuses
    assert sorted((*passed, *skipped)) == sorted(ITEMS), "each item is listed once, as passed or as skipped"
    assert {item: statuses[f"{item}[cpu]"] for item in passed} == dict.fromkeys(passed, "PASSED"), statuses
    assert {item: statuses[f"{item}[cpu]"] for item in skipped} == dict.fromkeys(skipped, "SKIPPED"), statuses
    assert set(reasons) == {f"{item}[cpu]" for item in skipped}, reasons  # the report agrees with the terminal
    summary = "\n".join(line for line in result.outlines if line.startswith("SKIPPED ["))
    for item, fragment in skipped.items():
        reason = reasons[f"{item}[cpu]"]
        assert fragment in reason, (item, fragment, reason)
        assert reason in summary, (item, reason, summary)
    return statuses


def rest(*items: str) -> tuple[str, ...]:
    return tuple(item for item in ITEMS if item not in (*items, "targets"))


def not_causal(task: str) -> dict[str, str]:
    """The `targets` item of a task that is no causal LM: it skips, naming the task."""
    return {"targets": f"{task}: no causal-LM supervision to audit"}


#: Why a property that resizes the token sequence skips where the model takes none (pixels, waveforms).
NO_TOKEN_SEQUENCE = "the model takes no token sequence whose length could vary"


# ---------------------------------------------------------------------------------------------------------------
# 1. Vision, the documented recipe: an Image() column turned into pixel_values by set_transform.

VISION = """
    import random

    import torch
    from datasets import ClassLabel, Dataset, Features, Image
    from PIL import Image as PILImage
    from transformers import Trainer, TrainingArguments, ViTConfig, ViTForImageClassification, ViTImageProcessor

    rng = random.Random(0)
    colors = [(200, 30, 30), (30, 200, 30), (30, 30, 200)]
    images = [PILImage.new("RGB", (40, 40), tuple(max(0, min(255, c + rng.randint(-40, 40))) for c in colors[i % 3]))
              for i in range(24)]
    features = Features({"image": Image(), "label": ClassLabel(names=["red", "green", "blue"])})
    data = Dataset.from_dict({"image": images, "label": [i % 3 for i in range(24)]}, features=features)

    processor = ViTImageProcessor(size={"height": 32, "width": 32})


    def transform(batch):
        batch["pixel_values"] = processor([image.convert("RGB") for image in batch["image"]],
                                          return_tensors="pt")["pixel_values"]
        return batch


    data.set_transform(transform)


    def collate_fn(examples):
        return {"pixel_values": torch.stack([example["pixel_values"] for example in examples]),
                "labels": torch.tensor([example["label"] for example in examples])}


    config = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=16, num_hidden_layers=1,
                       num_attention_heads=2, intermediate_size=32, num_labels=3)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, remove_unused_columns=False,
                             report_to="none")
    trainer = Trainer(model=ViTForImageClassification(config), args=args, train_dataset=data, eval_dataset=data,
                      data_collator=collate_fn, processing_class=processor)
    trainer.train()
"""


def test_vision_set_transform_recipe_passes(project: pytest.Pytester) -> None:
    write(project, "train.py", VISION)
    result = run_script(project, REPORT)
    # Pixel inputs have no token lengths and no padding: those two property items skip, with a reason.
    check_correct(
        project,
        result,
        passed=rest("lengths", "padding"),
        skipped={
            **not_causal("image classification"),
            **dict.fromkeys(("lengths", "padding"), f"image classification: {NO_TOKEN_SEQUENCE}"),
        },
    )


def test_vision_transform_starved_by_remove_unused_columns_fails_dataset(project: pytest.Pytester) -> None:
    write(project, "train.py", VISION.replace("remove_unused_columns=False", "remove_unused_columns=True"))
    result = run_script(project)
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(["*dataset[[]cpu[]] failed*transform*", "*remove_unused_columns=False*"])


# ---------------------------------------------------------------------------------------------------------------
# 2. Audio: raw waveforms of varying lengths, a Wav2Vec2 feature extractor, a padding collator.

AUDIO = """
    import numpy as np
    from datasets import Dataset
    from transformers import (DataCollatorWithPadding, Trainer, TrainingArguments, Wav2Vec2Config,
                              Wav2Vec2FeatureExtractor, Wav2Vec2ForSequenceClassification)

    rng = np.random.default_rng(0)
    waves, labels = [], []
    for i in range(24):
        length = int(rng.integers(800, 1601))
        t = np.arange(length) / 16000
        waves.append((np.sin(2 * np.pi * 220 * (i % 3 + 1) * t) + 0.05 * rng.standard_normal(length)).astype(np.float32))
        labels.append({label})
    raw = Dataset.from_dict({{"audio": waves, "label": labels}})

    extractor = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True,
                                         return_attention_mask=True)
    data = raw.map(lambda batch: extractor(batch["audio"], sampling_rate=16000), batched=True, remove_columns=["audio"])
    # feat_extract_norm="layer" (as in wav2vec2-large-lv60): the group norm of wav2vec2-base is not padding-invariant.
    config = Wav2Vec2Config(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                            conv_dim=(16, 16), conv_kernel=(10, 3), conv_stride=(5, 2), num_feat_extract_layers=2,
                            feat_extract_norm="layer", num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
                            classifier_proj_size=16, mask_time_prob=0.0, num_labels={num_labels})
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
    trainer = Trainer(model=Wav2Vec2ForSequenceClassification(config), args=args, train_dataset=data,
                      eval_dataset=data, processing_class=extractor, data_collator=DataCollatorWithPadding(extractor))
    trainer.train()
"""


def test_audio_classification_passes(project: pytest.Pytester) -> None:
    write(project, "train.py", AUDIO.format(label="i % 3", num_labels=3))
    result = run_script(project, REPORT)
    # Waveforms (input_values) are no token sequence: lengths and padding skip, with the reason; the class-id labels
    # are varied by the labels property, which passes.
    check_correct(
        project,
        result,
        passed=rest("lengths", "padding"),
        skipped={
            **not_causal("audio classification"),
            **dict.fromkeys(("lengths", "padding"), f"audio classification: {NO_TOKEN_SEQUENCE}"),
        },
    )


def test_audio_labels_beyond_the_head_fail_dataset(project: pytest.Pytester) -> None:
    write(project, "train.py", AUDIO.format(label="i % 3", num_labels=2))
    result = run_script(project)
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(["*dataset[[]cpu[]] failed*3 classes*2 outputs*", "*fix:*num_labels=3*"])


# ---------------------------------------------------------------------------------------------------------------
# 3. Multiple choice: input_ids of shape [choices][tokens] per row, as in transformers' run_swag.

MULTIPLE_CHOICE = """
    import random

    import tiny
    from datasets import Dataset
    from transformers import BertForMultipleChoice, DataCollatorForMultipleChoice, Trainer, TrainingArguments

    rng = random.Random(0)
    contexts = tiny.sentences(32, seed=1, shortest=2, longest=6)
    endings = [[" ".join(rng.choice(tiny.WORDS) for _ in range(rng.randint(1, 5))) for _ in range(4)] for _ in contexts]
    labels = [i % 4 for i in range(len(contexts))]
    {edit}
    raw = Dataset.from_dict({{"sent1": contexts, **{{f"ending{{j}}": [e[j] for e in endings] for j in range(4)}},
                             "label": labels}})
    tok = tiny.tokenizer()


    def preprocess(batch):
        first = [[context] * 4 for context in batch["sent1"]]
        second = [[batch[f"ending{{j}}"][i] for j in range(4)] for i in range(len(batch["sent1"]))]
        encoded = tok(sum(first, []), sum(second, []), truncation=True)
        return {{key: [values[i:i + 4] for i in range(0, len(values), 4)] for key, values in encoded.items()}}


    data = raw.map(preprocess, batched=True, remove_columns=["sent1", "ending0", "ending1", "ending2", "ending3"])
    # num_labels=2 is what a pretrained checkpoint's config brings; a multiple-choice head has one output per choice.
    model = BertForMultipleChoice(tiny.config(num_labels=2))
    # Trained from scratch: at 5e-5 this random model's loss moves by 1e-6 in 300 steps on one batch; at 1e-3 it
    # falls 0.1% within about 55 steps and to 0.3 by 100.
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, learning_rate=1e-3, report_to="none")
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data, processing_class=tok,
                      data_collator=DataCollatorForMultipleChoice(tok))
    trainer.train()
"""


def test_multiple_choice_passes(project: pytest.Pytester) -> None:
    write(project, "train.py", MULTIPLE_CHOICE.format(edit=""))
    result = run_script(project, REPORT)
    # Rows of [choices][tokens]: lengths resizes every choice and passes; the padding property does not cover the
    # choices axis, and skips with the reason (as the README's table of tasks says).
    check_correct(
        project,
        result,
        passed=rest("padding"),
        skipped={
            **not_causal("multiple choice"),
            "padding": "multiple choice pads every choice of a row to one length: the padding property "
            "does not cover a choices axis",
        },
    )


def test_slow_learning_at_a_fine_tuning_rate_is_no_false_alarm(project: pytest.Pytester) -> None:
    # The same random model at 5e-5 moves its loss too little in 150 steps; a faster rate shows the pipeline learns.
    write(project, "train.py", MULTIPLE_CHOICE.format(edit="").replace("learning_rate=1e-3", "learning_rate=5e-5"))
    result = run_script(project, "--trainer-stages=overfit", "--trainer-report=report.json")
    assert outcomes(result) == {"overfit[cpu]": "PASSED"}
    notes = [note for item in json.loads((project.path / "report.json").read_text())["items"] for note in item["notes"]]
    assert any(note.startswith("the loss fell only at ") and "at the script's rate: loss" in note for note in notes), (
        notes
    )


def test_multiple_choice_label_beyond_the_choices_fails_dataset(project: pytest.Pytester) -> None:
    write(project, "train.py", MULTIPLE_CHOICE.format(edit="labels[5] = 4"))
    result = run_script(project)
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(["*dataset[[]cpu[]] failed*4*choices*"])


# ---------------------------------------------------------------------------------------------------------------
# 4. Seq2seq with generate: a tiny T5, Seq2SeqTrainer(predict_with_generate=True), DataCollatorForSeq2Seq.

SEQ2SEQ = """
    import numpy as np
    import tiny
    from datasets import Dataset
    from transformers import (DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments, T5Config,
                              T5ForConditionalGeneration)

    tok = tiny.tokenizer()
    sources = tiny.sentences(32, seed=2, shortest=3, longest=10)
    targets = [" ".join(source.split()[:len(source.split()) // 2][::-1]) for source in sources]
    raw = Dataset.from_dict({"source": sources, "target": targets})


    def preprocess(batch):
        encoded = tok(batch["source"], truncation=True, max_length=32)
        encoded["labels"] = tok(text_target=batch["target"], truncation=True, max_length=8)["input_ids"]
        return encoded


    data = raw.map(preprocess, batched=True, remove_columns=["source", "target"])
    config = T5Config(vocab_size=len(tiny.VOCAB), d_model=16, d_ff=32, d_kv=8, num_layers=1, num_decoder_layers=1,
                      num_heads=2, pad_token_id=tok.pad_token_id, eos_token_id=tok.sep_token_id,
                      decoder_start_token_id=tok.pad_token_id)
    model = T5ForConditionalGeneration(config)


    def compute_metrics(prediction):
        predictions, label_ids = prediction
        label_ids = np.where(label_ids != -100, label_ids, tok.pad_token_id)
        predictions = np.where(predictions != -100, predictions, tok.pad_token_id)
        decoded = tok.batch_decode(predictions, skip_special_tokens=True)
        references = tok.batch_decode(label_ids, skip_special_tokens=True)
        return {"exact_match": float(np.mean([p.strip() == r.strip() for p, r in zip(decoded, references)]))}


    args = Seq2SeqTrainingArguments(output_dir="out", per_device_train_batch_size=8, per_device_eval_batch_size=8,
                                    predict_with_generate=True, generation_max_length=8, report_to="none")
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=data, eval_dataset=data, processing_class=tok,
                             data_collator=DataCollatorForSeq2Seq(tok, model=model), compute_metrics=compute_metrics)
    trainer.train()
"""


def test_seq2seq_with_generate_passes(project: pytest.Pytester) -> None:
    write(project, "train.py", SEQ2SEQ)
    result = run_script(project, REPORT)
    # Target token ids are no class labels: the labels property skips them. Padding the encoder input beside a
    # longer row changes nothing (labels are padded with -100 apart from the inputs): padding passes.
    check_correct(
        project,
        result,
        passed=rest("labels"),
        skipped={
            **not_causal("sequence to sequence"),
            "labels": "seq2seq labels are decoder target token ids, not classes",
        },
    )


def test_seq2seq_pad_ids_left_in_the_labels_fail_dataset(project: pytest.Pytester) -> None:
    script = SEQ2SEQ.replace(
        'tok(text_target=batch["target"], truncation=True',
        'tok(text_target=batch["target"], padding="max_length", truncation=True',
    )
    assert script != SEQ2SEQ
    write(project, "train.py", script)
    result = run_script(project)
    # The model still trains on them (a finding, which blocks nothing): the same split is the eval split, and the
    # collator passes the padded labels on, so each of those items names it too; every other item runs and passes.
    assert failures(result) == ["dataset[cpu]", "collate[cpu]", "eval[cpu]"]
    skipped = {item for item, outcome in outcomes(result).items() if outcome == "SKIPPED"}
    assert skipped <= {"targets[cpu]", "labels[cpu]"}, skipped  # not applicable to seq2seq: nothing blocked
    result.stdout.fnmatch_lines(["*dataset[[]cpu[]] failed*pad*", "*-100*"])


def test_seq2seq_metrics_decoding_minus_100_fail_eval(project: pytest.Pytester) -> None:
    script = SEQ2SEQ.replace("        label_ids = np.where(label_ids != -100, label_ids, tok.pad_token_id)\n", "")
    assert script != SEQ2SEQ
    write(project, "train.py", script)
    result = run_script(project)
    assert failures(result) == ["eval[cpu]"]
    result.stdout.fnmatch_lines(["*eval[[]cpu[]] failed*-100*"])


#: The model starts its decoder with [CLS], which the tokenizer also puts at the start of every target.
START_IN_LABELS = SEQ2SEQ.replace("decoder_start_token_id=tok.pad_token_id", "decoder_start_token_id=tok.cls_token_id")
#: The same targets without it: the model prepends it itself.
START_DROPPED = START_IN_LABELS.replace(
    'encoded["labels"] = tok(text_target=batch["target"], truncation=True, max_length=8)["input_ids"]',
    'encoded["labels"] = [ids[1:] for ids in tok(text_target=batch["target"], truncation=True, max_length=8)'
    '["input_ids"]]',
)


def test_seq2seq_labels_that_begin_with_the_decoder_start_token_are_named(project: pytest.Pytester) -> None:
    assert START_IN_LABELS != SEQ2SEQ
    write(project, "train.py", START_IN_LABELS)
    result = run_script(project, "--trainer-stages=collate")
    assert outcomes(result) == {"collate[cpu]": "FAILED"}
    result.stdout.fnmatch_lines(
        [
            "collate[[]cpu[]] failed: every label row of the first batch (8 rows) begins with '[[]CLS[]]' (id 2), the "
            "decoder start token that T5ForConditionalGeneration puts before the labels itself when it shifts them right*",
            "  fix: drop it from the labels, in the collator: *",
        ]
    )


def test_seq2seq_labels_without_the_decoder_start_token_pass(project: pytest.Pytester) -> None:
    assert START_DROPPED != START_IN_LABELS
    write(project, "train.py", START_DROPPED)
    result = run_script(project, "--trainer-stages=collate")
    assert outcomes(result) == {"collate[cpu]": "PASSED"}


# ---------------------------------------------------------------------------------------------------------------
# 5. DPO with TRL, and 6. packed SFT with TRL, on a tiny Llama.

DPO = """
    import copy

    import lm
    import tiny
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    prompts = tiny.sentences(32, seed=3, shortest=2, longest=6)
    data = Dataset.from_dict({"prompt": prompts,
                              "chosen": [" " + " ".join(p.split()[::-1]) for p in prompts],
                              "rejected": [" " + " ".join(sorted(p.split())) for p in prompts]})
    model = lm.model()
    args = DPOConfig(output_dir="out", bf16=False, per_device_train_batch_size=4, max_length=32, report_to=[])
    # A model built from a config has no checkpoint for DPOTrainer to load the reference from: pass a copy.
    trainer = DPOTrainer(model, ref_model=copy.deepcopy(model), args=args, train_dataset=data,
                         processing_class=lm.tokenizer())
    trainer.train()
"""

SFT_PACKED = """
    import lm
    import tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    data = Dataset.from_dict({"text": tiny.sentences(48, seed=4)})
    args = SFTConfig(output_dir="out", packing=True, max_length=32, bf16=False, per_device_train_batch_size=4,
                     report_to=[])
    trainer = SFTTrainer(lm.model(), args=args, train_dataset=data, eval_dataset=data, processing_class=lm.tokenizer())
    trainer.train()
"""

#: The model's embedding has 20 rows but the tokenizer's words go up to id 23.
SMALL_VOCAB = ("lm.model()", "lm.model(vocab_size=20)")


@pytest.fixture
def trl_project(project: pytest.Pytester) -> pytest.Pytester:
    project.makepyfile(lm=LM)
    return project


def test_dpo_passes(trl_project: pytest.Pytester) -> None:
    write(trl_project, "train.py", DPO)
    result = run_script(trl_project, REPORT)
    # No eval split; preference pairs have no label column, and the trainer tokenizes and pads them itself, so
    # lengths and padding skip too: each with its reason. `targets` compares each pair's chosen and rejected tokens.
    check_correct(
        trl_project,
        result,
        passed=(*rest("eval", "labels", "lengths", "padding"), "targets"),
        skipped={
            "eval": "the Trainer has no eval_dataset",
            "labels": "preference pairs have no label column",
            "lengths": "preference pairs are tokenized and padded by the trainer itself",
            "padding": "preference pairs are tokenized and padded by the trainer itself",
        },
    )


def test_dpo_token_ids_beyond_the_embedding_fail_dataset(trl_project: pytest.Pytester) -> None:
    write(trl_project, "train.py", DPO.replace(*SMALL_VOCAB))
    result = run_script(trl_project)
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(["*dataset[[]cpu[]] failed*token id*"])


def test_packed_sft_passes(trl_project: pytest.Pytester) -> None:
    write(trl_project, "train.py", SFT_PACKED)
    result = run_script(trl_project, REPORT)
    # A causal LM: its supervision is audited (targets passes). Token-id labels skip; packed rows (seq_lengths marks
    # the documents in each row) cannot be cut or padded without splitting their documents: lengths and padding skip.
    packed = "the training rows are packed ('seq_lengths' marks the documents in each row)"
    check_correct(
        trl_project,
        result,
        passed=(*CORE, "targets"),
        skipped={
            "labels": "a language model's labels are token ids, not classes",
            "lengths": packed,
            "padding": packed,
        },
    )


def test_packed_sft_token_ids_beyond_the_embedding_fail_dataset(trl_project: pytest.Pytester) -> None:
    write(trl_project, "train.py", SFT_PACKED.replace(*SMALL_VOCAB))
    result = run_script(trl_project)
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(["*dataset[[]cpu[]] failed*token id*"])


# ---------------------------------------------------------------------------------------------------------------
# 7. A model of the user's own: a torch.nn.Module with its own input names, its own collator.

OWN_MODEL = """
    import tiny
    import torch
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    tok = tiny.tokenizer()
    texts = tiny.sentences(48, seed=5)
    data = Dataset.from_dict({"tokens": tok(texts)["input_ids"], "target": [len(t.split()) % 3 for t in texts]})


    class BagOfWords(torch.nn.Module):
        def __init__(self, vocab_size, classes):
            super().__init__()
            self.embed = torch.nn.EmbeddingBag(vocab_size, 16, mode="mean", padding_idx=0)
            self.head = torch.nn.Linear(16, classes)

        def forward(self, tokens, target=None):
            logits = self.head(self.embed(tokens))
            loss = torch.nn.functional.cross_entropy(logits, target) if target is not None else None
            return {"loss": loss, "logits": logits}


    def collate(rows):
        longest = max(len(row["tokens"]) for row in rows)
        tokens = torch.tensor([row["tokens"] + [0] * (longest - len(row["tokens"])) for row in rows])
        return {"tokens": tokens, "target": torch.tensor([row["target"] for row in rows])}


    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, remove_unused_columns=False,
                             label_names=["target"], report_to="none")
    trainer = Trainer(model=BagOfWords(len(tiny.VOCAB), 3), args=args, train_dataset=data, eval_dataset=data,
                      data_collator=collate)
    trainer.train()
"""

RETURNS_DICT = 'return {"loss": loss, "logits": logits}'
RETURNS_TUPLE = "return (loss, logits) if loss is not None else (logits,)"


@pytest.mark.parametrize("returns", [RETURNS_DICT, RETURNS_TUPLE], ids=["dict", "tuple"])
def test_own_module_with_its_own_input_names_passes(project: pytest.Pytester, returns: str) -> None:
    write(project, "train.py", OWN_MODEL.replace(RETURNS_DICT, returns))
    result = run_script(project, REPORT)
    # The checks that need the task's conventions skip with the reason: what a label is, which input is the tokens.
    no_sequence = (
        "a model of your own (BagOfWords): pytest-trainer cannot tell which input of a model of your own is "
        "its token sequence"
    )
    check_correct(
        project,
        result,
        passed=rest("labels", "lengths", "padding"),
        skipped={
            **not_causal("a model of your own (BagOfWords)"),
            "labels": "what this model takes as labels is unknown to pytest-trainer",
            "lengths": no_sequence,
            "padding": no_sequence,
        },
    )
    assert "untokenized" not in result.stdout.str()


def test_own_module_loss_from_detached_logits_fails_backward(project: pytest.Pytester) -> None:
    script = OWN_MODEL.replace("cross_entropy(logits, target)", "cross_entropy(logits.detach(), target)")
    assert script != OWN_MODEL
    write(project, "train.py", script)
    result = run_script(project)
    assert failures(result) == ["backward[cpu]"]
    result.stdout.re_match_lines([r".*backward\[cpu\] failed.*(detached|no gradient).*"])


# ---------------------------------------------------------------------------------------------------------------
# 8. Multi-label classification: BCE-with-logits needs float multi-hot rows.

MULTI_LABEL = """
    import tiny
    from transformers import BertForSequenceClassification, Trainer, TrainingArguments

    tok = tiny.tokenizer()
    words = ("red", "blue", "big")


    def tag(batch):
        encoded = tok(batch["text"], truncation=True)
        encoded["labels"] = [{labels} for text in batch["text"]]
        return encoded


    data = tiny.text_dataset().map(tag, batched=True, remove_columns=["text", "label"])
    model = BertForSequenceClassification(tiny.config(num_labels=3, problem_type="multi_label_classification"))
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data, processing_class=tok)
    trainer.train()
"""

MULTI_HOT = "[float(word in text.split()) for word in words]"


def test_multi_label_with_float_multi_hot_rows_passes(project: pytest.Pytester) -> None:
    write(project, "train.py", MULTI_LABEL.format(labels=MULTI_HOT))
    result = run_script(project, REPORT)
    # Float multi-hot rows are varied by the labels property (the README's table of tasks): every item but targets
    # passes.
    check_correct(project, result, passed=rest(), skipped=not_causal("text classification (multi-label)"))


@pytest.mark.parametrize(
    "labels",
    [
        "sum(word in text.split() for word in words) % 3",  # one integer class id per row
        "[int(word in text.split()) for word in words]",  # multi-hot rows, but integers
    ],
    ids=["class-ids", "int-multi-hot"],
)
def test_multi_label_with_integer_labels_fails_naming_float_multi_hot(project: pytest.Pytester, labels: str) -> None:
    write(project, "train.py", MULTI_LABEL.format(labels=labels))
    result = run_script(project)
    assert failures(result) in (["dataset[cpu]"], ["forward[cpu]"])
    # The first line of the failure names the cause, not only torch's "result type Float can't be cast".
    result.stdout.re_match_lines([r"(?i).*(dataset|forward)\[cpu\] failed:.*multi.?label.*float.*"])


# ---------------------------------------------------------------------------------------------------------------
# 9. Extractive question answering: answer spans are positions in the tokenized sequence.

QA = """
    import tiny
    from datasets import Dataset
    from transformers import BertForQuestionAnswering, Trainer, TrainingArguments

    tok = tiny.tokenizer()
    encoded = tok(tiny.sentences(32, seed=5, shortest=4), tiny.sentences(32, seed=6, shortest=4), truncation=True)
    starts = [len(ids) // 2 for ids in encoded["input_ids"]]
    ends = [start + 1 for start in starts]
    {edit}
    data = Dataset.from_dict({{**encoded, "start_positions": starts, "end_positions": ends}})
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
    trainer = Trainer(model=BertForQuestionAnswering(tiny.config(num_labels=2)), args=args, train_dataset=data,
                      eval_dataset=data, processing_class=tok)
    trainer.train()
"""


def test_question_answering_passes(project: pytest.Pytester) -> None:
    write(project, "train.py", QA.format(edit=""))
    result = run_script(project, REPORT)
    check_correct(
        project,
        result,
        passed=rest("labels", "padding"),
        skipped={
            **not_causal("question answering"),
            "labels": "question-answering labels are start and end positions in each sequence",
            "padding": "question answering: the softmax over answer positions spans the padding too",
        },
    )


def test_question_answering_span_past_the_sequence_fails_dataset(project: pytest.Pytester) -> None:
    # Character offsets taken for token positions: the span lies beyond the tokens, and the loss ignores it.
    write(project, "train.py", QA.format(edit="ends[7] = starts[7] = 90"))
    result = run_script(project)
    assert failures(result) == ["dataset[cpu]", "eval[cpu]"]  # a finding: the later stages still run
    assert outcomes(result)["overfit[cpu]"] == "PASSED"
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: row 7 of the training dataset has an answer span 90..90 outside its * tokens*",
            "*fix: compute start_positions and end_positions on the tokenized sequence*",
        ]
    )


# ---------------------------------------------------------------------------------------------------------------
# 10. The transformers examples' style: HfArgumentParser dataclasses with required arguments.

ARGPARSE = """
    from dataclasses import dataclass, field

    import tiny
    from transformers import HfArgumentParser, Trainer, TrainingArguments


    @dataclass
    class ModelArguments:
        num_labels: int = field(metadata={"help": "classes of the head"})
        hidden_size: int = field(default=16)


    def main():
        parser = HfArgumentParser((ModelArguments, TrainingArguments))
        model_args, training_args = parser.parse_args_into_dataclasses()
        tok = tiny.tokenizer()
        data = tiny.tokenized(tiny.text_dataset(), tok)
        model = tiny.classifier(num_labels=model_args.num_labels, hidden_size=model_args.hidden_size)
        trainer = Trainer(model=model, args=training_args, train_dataset=data, eval_dataset=data,
                          processing_class=tok)
        trainer.train()


    if __name__ == "__main__":
        main()
"""


def test_hf_argument_parser_with_required_arguments(project: pytest.Pytester) -> None:
    write(project, "train.py", ARGPARSE)
    result = run_script(
        project,
        "--trainer-args=--num_labels 3 --output_dir out --per_device_train_batch_size 8",
        "--trainer-stages=dataset,forward,step",
    )
    assert outcomes(result) == dict.fromkeys(["dataset[cpu]", "forward[cpu]", "step[cpu]"], "PASSED")
    assert not (project.path / "out").exists()


def test_hf_argument_parser_missing_a_required_argument_names_trainer_args(project: pytest.Pytester) -> None:
    write(project, "train.py", ARGPARSE)
    result = run_script(project, "--trainer-args=--output_dir out", "--trainer-stages=dataset")
    assert failures(result) == ["load[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "*the script exited (sys.exit with code 2) before building a Trainer*",
            "*required*--num_labels*",
            "*fix: the script's argument parser rejected*--trainer-args=*",
        ]
    )


def test_hf_argument_parser_wrong_value_fails_at_its_stage(project: pytest.Pytester) -> None:
    write(project, "train.py", ARGPARSE)
    result = run_script(project, "--trainer-args=--num_labels 2 --output_dir out", "--trainer-stages=dataset")
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(["dataset[[]cpu[]] failed: labels range 0..2 (3 classes) but the model has 2 outputs*"])


def test_set_format_columns_are_what_is_fed(project: pytest.Pytester) -> None:
    # The text column stays stored, but set_format(columns=...) keeps it out of every sample the collator sees.
    write(
        project,
        "train.py",
        """
        import tiny
        from transformers import Trainer, TrainingArguments

        tok = tiny.tokenizer()
        data = tiny.text_dataset().map(lambda batch: tok(batch["text"], truncation=True), batched=True)
        data.set_format(type="torch", columns=["input_ids", "attention_mask", "label"])
        args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, remove_unused_columns=False,
                                 report_to="none")
        trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=data, processing_class=tok)
        trainer.train()
    """,
    )
    result = run_script(project, "--trainer-stages=dataset,collate,forward")
    assert outcomes(result) == dict.fromkeys(["dataset[cpu]", "collate[cpu]", "forward[cpu]"], "PASSED")


def test_dpo_forward_reports_the_chosen_and_rejected_log_probabilities(trl_project: pytest.Pytester) -> None:
    write(trl_project, "train.py", DPO)
    result = run_script(trl_project, "--trainer-stages=forward", "--trainer-report=report.json")
    assert outcomes(result) == {"forward[cpu]": "PASSED"}
    figures = next(
        item["figures"]
        for item in json.loads((trl_project.path / "report.json").read_text())["items"]
        if item["stage"] == "forward"
    )
    assert {"logps_chosen", "logps_rejected"} <= set(figures), figures
    assert figures["logps_chosen"] < 0 and figures["logps_rejected"] < 0, figures


def test_torch_dataset_of_tensors_is_read_as_fed(project: pytest.Pytester) -> None:
    # A torch Dataset whose samples are tensors: the token sequences are checked, not taken for missing.
    write(
        project,
        "train.py",
        """
        import tiny
        import torch
        from transformers import Trainer, TrainingArguments

        tok = tiny.tokenizer()
        texts = tiny.sentences(32)


        class Texts(torch.utils.data.Dataset):
            def __len__(self):
                return len(texts)

            def __getitem__(self, index):
                encoded = tok(texts[index], padding="max_length", max_length=16, truncation=True, return_tensors="pt")
                return {"input_ids": encoded["input_ids"][0], "attention_mask": encoded["attention_mask"][0],
                        "labels": torch.tensor(index % 3)}


        args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
        trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=Texts())
        trainer.train()
    """,
    )
    result = run_script(project, "--trainer-stages=dataset,collate,forward,labels,lengths")
    assert outcomes(result) == dict.fromkeys(
        ["dataset[cpu]", "collate[cpu]", "forward[cpu]", "labels[cpu]", "lengths[cpu]"], "PASSED"
    )


def test_columns_that_match_no_forward_parameter_are_named(project: pytest.Pytester) -> None:
    # remove_unused_columns=True drops every column a forward(**inputs) does not name: train() fails the same way.
    write(
        project,
        "train.py",
        """
        import torch
        from datasets import Dataset
        from transformers import Trainer, TrainingArguments


        class Scorer(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(4, 1)

            def forward(self, **inputs):
                prediction = self.linear(inputs["features"]).squeeze(-1)
                return {"loss": torch.nn.functional.mse_loss(prediction, inputs["target"])}


        data = Dataset.from_dict({"features": [[float(i), 1.0, 0.0, 2.0] for i in range(16)],
                                  "target": [float(i % 3) for i in range(16)]})
        args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, report_to="none")
        trainer = Trainer(model=Scorer(), args=args, train_dataset=data)
        trainer.train()
    """,
    )
    result = run_script(project, "--trainer-stages=dataset")
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: Scorer.forward(**inputs) names no input: the Trainer keeps only the columns the "
            "forward's signature names (and the labels), so it dropped 'features', 'target'*",
            "*fix: name the inputs: def forward(self, features, target), or keep every column with "
            "TrainingArguments(remove_unused_columns=False, *",
        ]
    )


BAG_OF_WORDS = """
        import tiny
        import torch
        from torch import nn
        from transformers import Trainer, TrainingArguments

        class BagOfWords(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.EmbeddingBag(len(tiny.VOCAB), 8, mode="sum")
                self.head = nn.Linear(8, 3)

            def forward(self, input_ids, attention_mask=None, labels=None):
                logits = self.head(self.embed(input_ids, per_sample_weights=attention_mask.float(){extra}))
                return {{"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}}

        tok = tiny.tokenizer()
        data = tiny.tokenized(tiny.text_dataset(), tok)
        args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
        trainer = Trainer(model=BagOfWords(), args=args, train_dataset=data, processing_class=tok)
        trainer.train()
"""


def test_a_model_of_your_own_says_why_lengths_are_not_varied(project: pytest.Pytester) -> None:
    write(project, "train.py", BAG_OF_WORDS.format(extra=""))
    result = run_script(project, "--trainer-stages=forward,lengths,padding")
    assert outcomes(result) == {"forward[cpu]": "PASSED", "lengths[cpu]": "SKIPPED", "padding[cpu]": "SKIPPED"}
    result.stdout.fnmatch_lines(
        [
            "*a model of your own (BagOfWords): pytest-trainer cannot tell which input of a "
            "model of your own is its token sequence, so it varies no length*"
        ]
    )


def test_a_keyword_the_forward_passes_wrongly_inside_is_not_blamed_on_the_batch(project: pytest.Pytester) -> None:
    write(project, "train.py", BAG_OF_WORDS.format(extra=', mode="sum"'))  # EmbeddingBag takes mode in __init__
    result = run_script(project, "--trainer-stages=forward")
    assert failures(result) == ["forward[cpu]"]
    result.stdout.fnmatch_lines(["forward[[]cpu[]] failed: *raised TypeError: *unexpected keyword argument 'mode'"])
    result.stdout.no_fnmatch_line("*the batch has 'mode'*")
