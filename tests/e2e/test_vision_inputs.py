"""Images as the model is fed them, against the image processor inference will feed them through: normalized once
(`collate`, `eval`), and the same on every pass of the evaluation split (`eval`). The pipeline is the bundled vision
example (a tiny ViT, PIL images, `with_transform`), changed where each bug lives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pipeline_runs import failures, run_script, write

EXAMPLE = (Path(__file__).resolve().parents[2] / "conftest_examples" / "vision" / "train.py").read_text()
#: The example's transform, which every case below changes.
PIXELS = '"pixel_values": processor(images, return_tensors="pt")["pixel_values"],'
#: The example's evaluation split, given the training transform.
EVAL_SPLIT = "eval_dataset = make_split(30, seed=1).with_transform(transform)"
STAGES = "--trainer-stages=collate,eval"


def pipeline(project: pytest.Pytester, *changes: tuple[str, str]) -> dict[str, dict]:
    source = EXAMPLE
    for old, new in changes:
        assert old in source
        source = source.replace(old, new)
    write(project, "train.py", source)
    result = run_script(project, STAGES, "--trainer-report=report.json")
    report = json.loads((project.path / "report.json").read_text())
    items = {item["stage"]: item for item in report["items"]}
    items["failed"] = {"items": failures(result)}
    return items


def test_the_example_and_random_augmentation_of_its_training_split_pass(project: pytest.Pytester) -> None:
    flips = (
        PIXELS,
        '"pixel_values": processor([image.transpose(0) if random.random() < 0.5 else image for image in images], '
        'return_tensors="pt")["pixel_values"],',
    )
    own_eval = (EVAL_SPLIT, "eval_dataset = make_split(30, seed=1).with_transform(make_plain(processor))")
    plain = (
        "def collate_fn(examples):",
        "def make_plain(processor):\n"
        "    def transform(batch):\n"
        '        images = [image.convert("RGB") for image in batch["image"]]\n'
        '        return {"pixel_values": processor(images, return_tensors="pt")["pixel_values"], '
        '"label": batch["label"]}\n'
        "    return transform\n\n\n"
        "def collate_fn(examples):",
    )
    assert pipeline(project)["failed"]["items"] == []
    assert pipeline(project, flips, plain, own_eval)["failed"]["items"] == []


def test_random_transforms_of_the_evaluation_split_fail_eval(project: pytest.Pytester) -> None:
    jitter = (PIXELS, f"{PIXELS[:-1]} * (0.9 + 0.2 * torch.rand(1)),")
    items = pipeline(project, jitter)
    assert items["failed"]["items"] == ["eval[cpu]"]
    assert items["eval"]["diagnosis"].startswith(
        "the evaluation batches change from one pass to the next: pixel_values of the first batch differs between "
        "two passes"
    )
    assert "keep random augmentations" in items["eval"]["fix"]


def test_images_the_transform_does_not_normalize_fail_collate(project: pytest.Pytester) -> None:
    unnormalized = (PIXELS, PIXELS.replace('return_tensors="pt"', 'return_tensors="pt", do_normalize=False'))
    items = pipeline(project, unnormalized)
    assert items["failed"]["items"] == ["collate[cpu]", "eval[cpu]"]
    assert items["collate"]["diagnosis"].startswith("the images are fed unnormalized: their pixel values run from 0")
    assert "(pixel_values of the first training batch)" in items["collate"]["diagnosis"]


def test_images_normalized_twice_fail_collate(project: pytest.Pytester) -> None:
    twice = (PIXELS, '"pixel_values": (processor(images, return_tensors="pt")["pixel_values"] - 0.5) / 0.5,')
    darker = ("rng.randint(170, 255) for _ in range(3)", "rng.randint(0, 255) for _ in range(3)")
    items = pipeline(project, twice, darker)
    assert items["failed"]["items"] == ["collate[cpu]", "eval[cpu]"]
    assert "the images are normalized twice, with other statistics" in items["collate"]["diagnosis"]
