"""The images fed against their image processor's normalization (`pixels`), on pixel arrays built here: natural-ish
images (a smooth gradient with noise, mean about 0.45) and the ways they are fed wrong."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pytest_trainer.pixels import normalization_problem, statistics

IMAGENET = (np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225]))
HALF = (np.array([0.5, 0.5, 0.5]), np.array([0.5, 0.5, 0.5]))


def images(count: int = 8, seed: int = 0) -> np.ndarray:
    """`count` RGB images in [0, 1], 3 x 16 x 16: a gradient of random direction, plus noise."""
    rng = np.random.default_rng(seed)
    grid = np.linspace(0, 1, 16)
    made = []
    for _ in range(count):
        ramp = np.add.outer(grid * rng.uniform(-1, 1), grid * rng.uniform(-1, 1))
        channels = [ramp + rng.uniform(0.1, 0.8) + rng.normal(0, 0.1, ramp.shape) for _ in range(3)]
        made.append(np.clip(np.stack(channels), 0, 1))
    return np.stack(made)


def normalize(values: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    return (values - mean.reshape(1, -1, 1, 1)) / std.reshape(1, -1, 1, 1)


@pytest.mark.parametrize("stats", [IMAGENET, HALF], ids=["imagenet", "half"])
def test_images_normalized_as_the_processor_does_pass(stats: tuple[np.ndarray, np.ndarray]) -> None:
    assert normalization_problem(normalize(images(), *stats), *stats) is None


def test_augmentations_after_normalization_pass() -> None:
    fed = normalize(images(), *HALF)
    rng = np.random.default_rng(1)
    fed[:2, :, 4:10, 4:10] = rng.normal(0, 1, (2, 3, 6, 6))  # random erasing of a quarter of two images
    fed *= rng.uniform(0.9, 1.1)  # brightness jitter
    assert normalization_problem(fed, *HALF) is None


@pytest.mark.parametrize("stats", [IMAGENET, HALF], ids=["imagenet", "half"])
def test_images_not_normalized_are_named(stats: tuple[np.ndarray, np.ndarray]) -> None:
    found = normalization_problem(images(), *stats)
    assert found is not None and found.startswith("the images are fed unnormalized: their pixel values run from 0")
    raw = normalization_problem(images() * 255, *stats)
    assert raw is not None and raw.startswith("the images are fed unnormalized nor rescaled from 0..255")


@pytest.mark.parametrize("stats", [IMAGENET, HALF], ids=["imagenet", "half"])
def test_images_normalized_twice_are_named(stats: tuple[np.ndarray, np.ndarray]) -> None:
    twice = normalize(normalize(images(), *stats), *stats)
    found = normalization_problem(twice, *stats)
    assert found is not None and "normalized twice, with other statistics" in found


def test_images_normalized_with_other_statistics_are_named() -> None:
    found = normalization_problem(normalize(images(), *IMAGENET), *HALF)
    assert found is not None and "outside the from -1.00 to 1.00" in found


def test_a_single_image_or_another_layout_is_not_judged() -> None:
    assert normalization_problem(images(1), *HALF) is None
    assert normalization_problem(images().transpose(0, 2, 3, 1), *HALF) is None  # channels last: not the processor's


def test_the_statistics_are_those_of_a_processor_that_rescales_and_normalizes() -> None:
    given = SimpleNamespace(
        do_normalize=True, do_rescale=True, rescale_factor=1 / 255, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    found = statistics(given)
    assert found is not None and found[0].tolist() == [0.5] * 3
    assert statistics(SimpleNamespace(image_processor=given, tokenizer=None)) is not None  # a processor's
    assert statistics(SimpleNamespace(**{**vars(given), "do_normalize": False})) is None
    assert statistics(SimpleNamespace(**{**vars(given), "do_rescale": False})) is None
    assert statistics(SimpleNamespace()) is None  # a tokenizer
