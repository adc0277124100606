"""Vision-language SFT (LLaVA-style): the task, decoded images, image tokens and the processor's checkpoint.

Every script runs the bundled example's tiny LLaVA (`conftest_examples/vlm_sft/train.py`, copied beside it as
`vlm.py`): a CLIP vision tower and a Llama text model built from configs, a word-level tokenizer holding `<image>`,
LLaVA's processor (each image fills 4 image tokens) and PIL-drawn images stored in a `datasets.Image` column.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import PIL.Image  # noqa: F401
import pytest
import torch
import transformers
import trl  # noqa: F401
from packaging.version import Version
from pipeline_runs import ITEMS, failures, outcomes, run_script, write
from transformers import LlavaForConditionalGeneration, LlavaProcessor  # noqa: F401
from trl import SFTConfig, SFTTrainer  # noqa: F401

# The libraries above are imported here, before pytester's in-process runs, for the reason conftest gives.

EXAMPLE = Path(__file__).resolve().parents[2] / "conftest_examples" / "vlm_sft"

#: TRL refuses an assistant-only loss on images before transformers 5.18 (it raises at the trainer's build).
ASSISTANT_ONLY = pytest.mark.skipif(
    Version(transformers.__version__) < Version("5.18"),
    reason="TRL's assistant-only loss on images needs transformers>=5.18, as TRL says when it is built",
)


@pytest.fixture
def vlm(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    shutil.copy(EXAMPLE / "train.py", pytester.path / "vlm.py")
    return pytester


#: TRL's SFTTrainer on conversations with images, as the example builds it; ARGS are more SFTConfig arguments.
SFT = """
    import vlm
    from trl import SFTConfig, SFTTrainer

    processor = vlm.build_processor()
    args = SFTConfig(output_dir="out", per_device_train_batch_size=8, bf16=False, report_to="none", ARGS)
    trainer = SFTTrainer(model=vlm.build_model(processor.tokenizer), args=args, processing_class=processor,
                         train_dataset=vlm.conversations(32, seed=0))
    trainer.train()
"""

#: A plain Trainer whose collator calls the processor on an image column and a text column; CUT shortens the batch.
PLAIN = """
    import vlm
    from datasets import Dataset, Features, Image, Value
    from transformers import Trainer, TrainingArguments

    processor = vlm.build_processor()
    rows = vlm.conversations(32, seed=0)
    data = Dataset.from_dict(
        {"image": [images[0] for images in rows["images"]],
         "text": [f"USER: <image> {m[0]['content'][1]['text']} ASSISTANT: {m[1]['content'][0]['text']} </s>"
                  for m in rows["messages"]]},
        features=Features({"image": Image(), "text": Value("string")}))
    IMAGE = processor.tokenizer.convert_tokens_to_ids("<image>")


    def collate(examples):
        batch = processor(text=[e["text"] for e in examples], images=[e["image"] for e in examples], padding=True,
                          return_tensors="pt")
        labels = batch["input_ids"].clone()
        labels[batch["attention_mask"] == 0] = -100
        labels[labels == IMAGE] = -100
        batch["labels"] = labels
        CUT
        return batch


    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none", ARGS)
    trainer = Trainer(model=vlm.build_model(processor.tokenizer), args=args, train_dataset=data,
                      data_collator=collate, processing_class=PROCESSING)
    trainer.train()
"""


def sft(args: str) -> str:
    return SFT.replace("ARGS", args)


def plain(args: str = "remove_unused_columns=False", cut: str = "", processing: str = "processor") -> str:
    return PLAIN.replace("ARGS", args).replace("CUT", cut or "pass").replace("PROCESSING", processing)


def run(vlm: pytest.Pytester, source: str, stages: str) -> pytest.RunResult:
    write(vlm, "train.py", source)
    return run_script(vlm, f"--trainer-stages={stages}")


def check_fails(result: pytest.RunResult, item: str, *patterns: str) -> None:
    assert failures(result) == [item], (outcomes(result), result.stdout.str()[-6000:])
    result.stdout.fnmatch_lines([f"*{item.replace('[', '[[]')} failed*{patterns[0]}", *patterns[1:]])


def check_passes(result: pytest.RunResult, *items: str) -> None:
    statuses = outcomes(result)
    assert failures(result) == [], result.stdout.str()[-6000:]
    for item in items:
        assert statuses.get(item) == "PASSED", (item, statuses, result.stdout.str()[-6000:])


# ---- the example, and the task a LLaVA-style model is -----------------------------------------------------------


@ASSISTANT_ONLY
def test_the_example_passes_every_item_that_applies(vlm: pytest.Pytester) -> None:
    shutil.copytree(EXAMPLE, vlm.path / "vlm_sft")
    result = vlm.runpytest("--trainer-module=vlm_sft/train.py", "--trainer-devices=cpu", "-v", "-rs")
    statuses = outcomes(result)
    assert len(statuses) == len(ITEMS), statuses
    skipped = {item for item, status in statuses.items() if status != "PASSED"}
    # Token ids are no classes (labels); the collator tokenizes on the fly: the stored rows hold no token sequence
    # whose length could vary (lengths, padding). Without a GPU the memory forecast has no budget (memory).
    idle = set() if torch.cuda.is_available() else {"memory[cpu]"}
    assert skipped == {"labels[cpu]", "lengths[cpu]", "padding[cpu]", *idle}, (statuses, result.stdout.str()[-6000:])
    result.stdout.fnmatch_lines(["*the training samples have no token sequence 'input_ids' whose length could vary*"])


def test_a_llava_style_model_is_a_causal_lm_whose_targets_are_audited(vlm: pytest.Pytester) -> None:
    """A decoder-only ...ForConditionalGeneration is no seq2seq model: `targets` audits it (it used to skip)."""
    result = run(vlm, plain(), "collate,targets,forward,memory")
    check_passes(result, "targets[cpu]", "forward[cpu]", "memory[cpu]")


@ASSISTANT_ONLY
def test_stored_images_reach_the_collator_decoded_in_batches_the_plugin_makes(vlm: pytest.Pytester) -> None:
    """memory and save collate rows of their own: their images are PIL images, as the Trainer's dataloader gives."""
    result = run(vlm, sft("assistant_only_loss=True"), "collate,memory,save")
    check_passes(result, "memory[cpu]", "save[cpu]")


# ---- targets: image tokens --------------------------------------------------------------------------------------


def _images_of(tokens_across: int, source: str) -> str:
    """The script with images of `tokens_across` x `tokens_across` image tokens (the example's fill 2 x 2)."""
    return source.replace(
        "processor = vlm.build_processor()", f"vlm.PATCH = {16 // tokens_across}\n    processor = vlm.build_processor()"
    )


def test_supervised_image_tokens_fail_targets(vlm: pytest.Pytester) -> None:
    """TRL's vision collator copies input_ids into labels: the image placeholders are trained (trl#1880, #2136).
    Images of 16 tokens beside a short question and answer, as real images fill hundreds: most labels are on them."""
    result = run(vlm, _images_of(4, sft("max_length=None")), "collate,targets")
    check_fails(
        result,
        "targets[cpu]",
        "* supervised label positions (*) are image tokens (id 4): the model is "
        "trained to predict the image placeholders it is always given*",
        "*fix: set the labels of image tokens to -100*",
        "*dataset row 0: 16 of its 16 image tokens carry labels*",
    )


def test_a_small_share_of_supervised_image_tokens_is_a_note(vlm: pytest.Pytester) -> None:
    """Images of 4 tokens beside the conversation: under a quarter of the labels, a loss the answers hardly miss."""
    write(vlm, "train.py", sft("max_length=None"))
    result = run_script(vlm, "--trainer-stages=collate,targets", "--trainer-report=report.json")
    check_passes(result, "targets[cpu]")
    items = json.loads((vlm.path / "report.json").read_text())["items"]
    targets = next(item for item in items if item["stage"] == "targets")
    assert any(
        "image tokens among supervised labels" in note and "below the 25% from which this check fails" in note
        for note in targets["notes"]
    ), targets["notes"]


@ASSISTANT_ONLY
def test_answers_only_pass_targets(vlm: pytest.Pytester) -> None:
    result = run(vlm, sft("assistant_only_loss=True"), "collate,targets")
    check_passes(result, "targets[cpu]")


def test_image_tokens_cut_by_the_collator_fail_targets_naming_the_row(vlm: pytest.Pytester) -> None:
    cut = 'batch = {k: v[:, 3:] if k in ("input_ids", "attention_mask", "labels") else v for k, v in batch.items()}'
    result = run(vlm, plain(cut=cut), "collate,targets")
    check_fails(
        result,
        "targets[cpu]",
        "*dataset row 0 holds 3 image tokens but its 1 image(s) fill 4*",
        "*fix: never truncate through image tokens*",
    )


def test_the_model_s_image_token_mismatch_is_explained_at_forward(vlm: pytest.Pytester) -> None:
    cut = 'batch = {k: v[:, 3:] if k in ("input_ids", "attention_mask", "labels") else v for k, v in batch.items()}'
    result = run(vlm, plain(cut=cut), "collate,forward")
    check_fails(
        result,
        "forward[cpu]",
        "*the batch's image tokens and its images' features differ in number*"
        "image tokens per row of the first batch [[]3, 3, 3, 3, 3, 3, 3, 3]*",
    )


@ASSISTANT_ONLY
def test_truncation_through_image_tokens_is_explained_at_collate(vlm: pytest.Pytester) -> None:
    """transformers 5's processor raises "Mismatch in `image` token count" inside the collator."""
    result = run(vlm, sft("assistant_only_loss=True, max_length=4"), "collate")
    check_fails(
        result,
        "collate[cpu]",
        "*truncation to max_length=4 cut image tokens from dataset row 0*",
        "*fix: never truncate through image tokens: max_length=None*",
    )


# ---- the images reach the collator --------------------------------------------------------------------------


def test_an_image_column_dropped_by_remove_unused_columns_fails_naming_it(vlm: pytest.Pytester) -> None:
    result = run(vlm, plain(args="remove_unused_columns=True"), "dataset")
    check_fails(
        result,
        "dataset[cpu]",
        "*the Trainer dropped the image column 'image' before the collator "
        "(remove_unused_columns=True: LlavaForConditionalGeneration.forward takes no 'image')*",
        "*fix: set remove_unused_columns=False*",
    )


# ---- save: the processor reloads -------------------------------------------------------------------------------


def test_a_tokenizer_saved_alone_beside_a_vision_language_model_fails_save(vlm: pytest.Pytester) -> None:
    result = run(vlm, plain(processing="processor.tokenizer"), "collate,save")
    check_fails(
        result,
        "save[cpu]",
        "*the Trainer saves a * without an image processor*",
        "*fix: pass the processor (image processor and tokenizer together) as processing_class=*",
    )


def test_a_tokenizer_saved_alone_beside_a_vision_language_model_trained_on_text_is_a_note(
    vlm: pytest.Pytester,
) -> None:
    # The script fine-tunes the model on text alone: images given to it later need the base checkpoint's processor.
    feeds = 'processor(text=[e["text"] for e in examples], images=[e["image"] for e in examples], padding=True,'
    text_only = 'processor.tokenizer([e["text"].replace("<image> ", "") for e in examples], padding=True,'
    source = plain(processing="processor.tokenizer").replace(feeds, text_only)
    assert text_only in source
    write(vlm, "train.py", source)
    result = run_script(vlm, "--trainer-stages=collate,save", "--trainer-report=report.json")
    check_passes(result, "save[cpu]")
    save = next(item for item in json.loads((vlm.path / "report.json").read_text())["items"] if item["stage"] == "save")
    assert any(
        "no image processor: the script trains this vision-language model on text alone" in note
        for note in save["notes"]
    ), save["notes"]


def test_the_processor_reloads_from_the_checkpoint(vlm: pytest.Pytester) -> None:
    result = run(vlm, plain(), "collate,save")
    check_passes(result, "save[cpu]")


# ---- a trainable vision tower: its pooled output is never used ----------------------------------------------------


def test_a_trainable_vision_tower_whose_pooled_output_llava_skips_passes_backward_with_a_note(
    vlm: pytest.Pytester,
) -> None:
    """LLaVA reads a vision layer's hidden states, not the tower's pooled output through post_layernorm: those
    parameters get no gradient and do not train, which DistributedDataParallel accepts as the Trainer sets it up
    (find_unused_parameters on): no false alarm."""
    unfrozen = plain().replace(
        "trainer.train()", "trainer.model.model.vision_tower.requires_grad_(True)\n    trainer.train()"
    )
    assert unfrozen != plain()
    write(vlm, "train.py", unfrozen)
    result = run_script(vlm, "--trainer-stages=collate,forward,backward", "--trainer-report=report.json")
    check_passes(result, "backward[cpu]")
    notes = " ".join(
        next(
            item["notes"]
            for item in json.loads((vlm.path / "report.json").read_text())["items"]
            if item["stage"] == "backward"
        )
    )
    assert "get no gradient from the loss, so they do not train" in notes and "post_layernorm" in notes, notes


def test_the_same_with_ddp_not_looking_for_unused_parameters_fails_backward(vlm: pytest.Pytester) -> None:
    unfrozen = plain("remove_unused_columns=False, ddp_find_unused_parameters=False").replace(
        "trainer.train()", "trainer.model.model.vision_tower.requires_grad_(True)\n    trainer.train()"
    )
    result = run(vlm, unfrozen, "collate,forward,backward")
    check_fails(
        result,
        "backward[cpu]",
        "*trainable parameters get no gradient from the loss*post_layernorm*",
        "*ddp_find_unused_parameters*",
    )


def test_an_image_processor_reloaded_with_the_other_backend_is_the_same_processor() -> None:
    """Where torchvision is installed, transformers reloads `LlavaImageProcessor` (its torchvision backend) for a
    processor trained with `LlavaImageProcessorPil` (`...Fast` and the slow one on 4.x): the same settings prepare the
    images alike, so a checkpoint reloaded on a GPU machine is no finding. Another processor class still is."""
    from pytest_trainer import vision_text

    pil = getattr(transformers, "LlavaImageProcessorPil", None) or transformers.CLIPImageProcessor
    other_backend = type(
        pil.__name__.removesuffix("Pil") + ("" if pil.__name__.endswith("Pil") else "Fast"), (pil,), {}
    )
    trained, reloaded = LlavaProcessor.__new__(LlavaProcessor), LlavaProcessor.__new__(LlavaProcessor)
    trained.image_processor, reloaded.image_processor = pil(), other_backend()
    differing = [
        (what, before, after)
        for what, before, after in vision_text.image_settings(trained, reloaded)
        if before != after
    ]
    assert differing == []
    reloaded.image_processor = (
        transformers.SiglipImageProcessor()
        if hasattr(transformers, "SiglipImageProcessor")
        else transformers.ViTImageProcessor()
    )
    assert any(
        what == "image processor class"
        for what, before, after in vision_text.image_settings(trained, reloaded)
        if before != after
    )


def test_image_tokens_the_processor_expands_are_no_other_prompt(vlm: pytest.Pytester) -> None:
    """The processor turns each image's placeholder into as many tokens as the image has features, at training and at
    inference alike; the tokenizer's template alone renders one. With the template on the tokenizer too, the prompt
    inference gives is compared with each placeholder's run taken as one token."""
    source = sft("max_length=None").replace(
        "processor = vlm.build_processor()",
        "processor = vlm.build_processor()\n    processor.tokenizer.chat_template = processor.chat_template",
    )
    result = run(vlm, source, "collate,targets")
    check_passes(result, "targets[cpu]")
