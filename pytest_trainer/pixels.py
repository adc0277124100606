"""The images a vision model is fed, against its image processor: normalized once, as the processor normalizes them
(inference will feed the model through that processor), and, in an evaluation split, the same on every pass.

Normalized pixels of [0, 1] images lie between (0 - mean) / std and (1 - mean) / std in each channel. Pixels that are
never below 0 where that range goes well below it were not normalized; a large share outside the range were
normalized twice, with other statistics, or not rescaled from 0..255.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_trainer import diagnosis
from pytest_trainer.catalogue import BATCH, checks

if TYPE_CHECKING:
    from pytest_trainer.pipeline import Pipeline

#: Share of the pixel values outside the normalized range (widened by MARGIN) that says they were not normalized as
#: the processor normalizes: above what augmentations after normalization put there (random erasing fills about 4%
#: of the pixels with noise, a third of it outside).
OUTSIDE = 0.1
#: Of the normalized range, on each side: resampling overshoots a little (bicubic), colour jitter moves the values.
MARGIN = 0.1
#: The normalized range must reach this far below 0 for pixels that never are to count as unnormalized.
BELOW = -0.5
#: Values closer than this are the same pixel on two passes.
SAME = 1e-5
#: Inputs a vision model reads as images.
IMAGE_INPUTS = ("pixel_values",)


def statistics(processor: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """The mean and std the processor (or a processor's image processor) normalizes with, or None where it does not
    normalize or rescale to [0, 1] first."""
    images = getattr(processor, "image_processor", None) or processor
    mean, std = getattr(images, "image_mean", None), getattr(images, "image_std", None)
    if not getattr(images, "do_normalize", False) or mean is None or std is None:
        return None
    if not getattr(images, "do_rescale", False) or abs(float(getattr(images, "rescale_factor", 0)) - 1 / 255) > 1e-6:
        return None
    return np.asarray(mean, dtype=np.float64).reshape(-1), np.asarray(std, dtype=np.float64).reshape(-1)


def normalization_problem(values: np.ndarray, mean: np.ndarray, std: np.ndarray) -> str | None:
    """What is wrong with pixel values `values` (images x channels x ...) for a processor that normalizes with `mean`
    and `std`, or None."""
    if values.ndim < 3 or values.shape[0] < 2 or values.shape[1] != mean.size or not np.isfinite(values).all():
        return None
    low, high = (0 - mean) / std, (1 - mean) / std
    margin = MARGIN * (high - low)
    shape = (1, -1) + (1,) * (values.ndim - 2)
    outside = (values < (low - margin).reshape(shape)) | (values > (high + margin).reshape(shape))
    expected = (
        f"{_range(low.min(), high.max())}, as the image processor's mean {_listed(mean)} and std {_listed(std)} give"
    )
    seen = _range(float(values.min()), float(values.max()))
    if values.min() >= 0 and low.min() < BELOW:
        scaled = " nor rescaled from 0..255" if values.max() > 2 * high.max() else ""
        return (
            f"the images are fed unnormalized{scaled}: their pixel values run {seen}, never below 0, where normalized "
            f"ones run {expected}"
        )
    share = float(outside.mean())
    if share >= OUTSIDE:
        return (
            f"{share:.0%} of the pixel values fed lie outside the {expected} (they run {seen}): the images are "
            "normalized twice, with other statistics, or not rescaled from 0..255"
        )
    return None


def _range(low: float, high: float) -> str:
    return f"from {low:.2f} to {high:.2f}"


def _listed(values: np.ndarray) -> str:
    return "[" + ", ".join(f"{value:g}" for value in values) + "]"


@checks("collate", "eval", reads=BATCH)
def check_normalized(pipeline: Pipeline, batch: dict[str, Any], description: str) -> None:
    """The images of a batch are normalized as the Trainer's image processor normalizes them."""
    found = statistics(getattr(pipeline.trainer, "processing_class", None))
    if found is None:
        return
    for name in IMAGE_INPUTS:
        value = batch.get(name)
        if value is None or not hasattr(value, "detach") or not value.is_floating_point():
            continue
        problem = normalization_problem(value.detach().float().cpu().numpy(), *found)
        if problem is not None:
            raise diagnosis.Finding(
                f"{problem} ({name} of the first {description} batch)",
                "normalize once, with the image processor's own statistics, as inference will: call the processor "
                "without do_normalize=False (it rescales and normalizes), or end your own transforms with "
                "Normalize(mean=processor.image_mean, std=processor.image_std) on [0, 1] images, not both",
            )


@checks("eval", reads=BATCH)
def check_repeatable(first: dict[str, Any], again: dict[str, Any], description: str) -> None:
    """An evaluation split gives the same batch on every pass: random transforms there make its metrics move between
    evaluations by chance."""
    for name, value in first.items():
        other: Any = again.get(name)
        if not hasattr(value, "is_floating_point") or not value.is_floating_point():
            continue  # token ids may be masked at random on purpose (a masked LM's evaluation)
        if not hasattr(other, "shape") or other.shape != value.shape:
            continue
        differ = float((value.detach().float() - other.detach().float()).abs().max())
        if differ > SAME:
            raise diagnosis.Finding(
                f"the {description} batches change from one pass to the next: {name} of the first batch differs "
                f"between two passes (by up to {differ:.3g}), so the split gets random transforms and its metrics "
                "move between evaluations by chance (a best checkpoint is picked by luck)",
                "give the evaluation split deterministic transforms of its own (resize and center-crop, then the "
                "processor's normalization), e.g. eval_dataset.set_transform(eval_transform), and keep random "
                "augmentations (RandomResizedCrop, flips, ColorJitter) for the training split",
            )
