"""Vision-language fine-tuning (LLaVA-style): what the image placeholders in the token sequence must be.

A vision-language model reads its images as features that fill the positions of an image token in `input_ids`
(the processor expands each `<image>` of the text into as many of them as the vision tower gives features). Its
batch is right only when each row holds exactly the image tokens its images need, when no image token is a
target of the loss (the model would be trained to predict placeholders), and when the images reach the collator
at all. The task (`tasks.Task.image_token`) says which token id that is; nothing here asks the model's class.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pytest_trainer import diagnosis, tasks
from pytest_trainer.catalogue import BATCH, CHECKPOINT, checks

if TYPE_CHECKING:
    import numpy as np

    from pytest_trainer.pipeline import Pipeline

#: Batch keys that carry the images to the model.
PIXEL_KEYS = ("pixel_values", "pixel_values_videos", "image_sizes", "image_grid_thw")
#: Sample keys that hold a row's images, as TRL's and most processors' collators read them.
IMAGE_KEYS = ("images", "image")
#: The share of supervised label positions on image placeholders from which they weaken training: the answers then get
#: at most three quarters of the loss's weight, and the logged loss falls with placeholders any model predicts. Real
#: images fill hundreds of tokens each beside answers of tens (most of the labels); below it (small images beside long
#: answers) the loss they take is a note.
IMAGE_TARGET_SHARE = 0.25
#: The processor's error when truncation cut the image tokens it inserted (transformers 5).
PROCESSOR_MISMATCH = "Mismatch in `image` token count"
#: The model's error when the image tokens of the batch and the features of its images differ in number.
MODEL_MISMATCH = "Image features and image tokens do not match"


def processor_of(pipeline: Pipeline) -> Any:
    """The Trainer's processor when it handles images (an image processor beside a tokenizer), else None."""
    processor = getattr(pipeline.trainer, "processing_class", None)
    if getattr(processor, "image_processor", None) is None or getattr(processor, "tokenizer", None) is None:
        return None
    return processor


def max_length_of(pipeline: Pipeline) -> int | None:
    """The max_length the collator truncates to, where the collator or the arguments say."""
    for owner in (pipeline.trainer.data_collator, pipeline.trainer.args):
        value = getattr(owner, "max_length", None)
        if isinstance(value, int):
            return value
    return None


def images_of(sample: dict[str, Any]) -> list[Any] | None:
    """The images of a sample as the collator reads them (a list under `images`, one under `image`), or None when
    the sample holds none this module can find (then nothing is checked for it)."""
    for key in IMAGE_KEYS:
        if key in sample:
            value = sample[key]
            found = list(value) if isinstance(value, (list, tuple)) else [value]
            return [image for image in found if image is not None]
    return None


# ---- targets: per row, the image tokens each row's images need, and none of them supervised ---------------------


@checks("targets", reads=BATCH)
def audit(
    pipeline: Pipeline, spread: Sequence[tuple[dict[str, np.ndarray], list[dict[str, Any]]]], sampled: int
) -> tuple[dict[str, float], list[str]]:
    """Check the batches of a vision-language task collated from `sampled` rows spread over the training split
    (`fed_data.Batches.spread`, as numpy); return figures and notes for the report."""
    token = pipeline.task.image_token
    if token is None:
        return {}, []
    positions = pipeline.batches.positions(sampled)
    training, start = pipeline.training, 0
    collated = []
    for batch, samples in spread:
        collated.append((batch, samples, [training.row(index) for index in positions[start : start + len(samples)]]))
        start += len(samples)
    check_image_token_counts(pipeline, collated)
    image_targets = total_targets = 0
    worst: tuple[int, int, int] | None = None  # (dataset row, supervised image tokens, image tokens)
    for batch, _, rows in collated:
        ids, labels = batch.get("input_ids"), batch.get("labels")
        if ids is None or labels is None or ids.shape != labels.shape or ids.ndim != 2:
            continue
        trained = labels != tasks.IGNORE_INDEX
        trained[:, 0] = False  # a causal LM predicts from the previous token: position 0 is never a target
        at_image = ids == token
        image_targets += int((trained & at_image).sum())
        total_targets += int(trained.sum())
        for index in range(ids.shape[0]):
            count = int((trained[index] & at_image[index]).sum())
            if count and worst is None and index < len(rows):
                worst = (rows[index], count, int(at_image[index].sum()))
    share = image_targets / max(total_targets, 1)
    figures = {"image_token_label_share": share, "image_tokens_supervised": float(image_targets)}
    if image_targets and share >= IMAGE_TARGET_SHARE:
        row = f"dataset row {worst[0]}: {worst[1]} of its {worst[2]} image tokens carry labels" if worst else ""
        raise diagnosis.PipelineFailure(
            f"{image_targets} of {total_targets} supervised label positions ({share:.0%}) are image tokens "
            f"(id {token}): the model is trained to predict the image placeholders it is always given, so that "
            f"share of the loss goes to them, the answers' gradients weaken and the logged loss falls with "
            "placeholders any model predicts",
            f"set the labels of image tokens to -100 in the collator (labels[labels == {token}] = -100), or train "
            "on the answers alone: SFTConfig(assistant_only_loss=True) with a chat template whose {% generation %} "
            "marks the assistant's turns, or prompt-completion data (completion_only_loss, TRL's default there)",
            [row] if row else [],
        )
    if image_targets:
        return figures, [
            f"image tokens among supervised labels: {image_targets} of {total_targets} ({share:.0%}), below the "
            f"{IMAGE_TARGET_SHARE:.0%} from which this check fails: they still take that share of the loss, on "
            f"placeholders the model is always given (labels[labels == {token}] = -100 in the collator leaves it to "
            "the text)"
        ]
    return figures, [f"image tokens among supervised labels: {image_targets} of {total_targets} ({share:.0%})"]


def expected_image_tokens(pipeline: Pipeline, images: list[Any]) -> int | None:
    """How many image tokens the processor inserts for `images`, asked of the processor itself, or None."""
    processor = processor_of(pipeline)
    marker = getattr(processor, "image_token", None)
    token = pipeline.task.image_token
    if processor is None or not isinstance(marker, str) or token is None or not images:
        return None
    try:
        encoded = processor(text=[marker * len(images)], images=[images], return_tensors="np")
    except Exception:
        return None  # a processor that wants other arguments: not this check's to guess
    return int((encoded["input_ids"] == token).sum())


@checks("targets", reads=BATCH)
def check_image_token_counts(
    pipeline: Pipeline, collated: Sequence[tuple[dict[str, np.ndarray], list[dict[str, Any]], list[int]]]
) -> None:
    """Each row holds as many image tokens as its images fill with features: a row with fewer lost some (cut by
    truncation, or dropped by the collator); the model then fails, or pairs features with the wrong tokens."""
    token = pipeline.task.image_token
    for batch, samples, rows in collated:
        ids = batch.get("input_ids")
        if ids is None or ids.ndim != 2 or len(samples) != ids.shape[0]:
            continue
        for index, sample in enumerate(samples):
            images = images_of(sample)
            if not images:
                continue
            expected = expected_image_tokens(pipeline, images)  # per row: an image's tokens may vary with its size
            found = int((ids[index] == token).sum())
            if expected is None or found == expected:
                continue
            limit = max_length_of(pipeline)
            cut = f" (max_length={limit}, row length {ids.shape[1]})" if limit else ""
            raise diagnosis.PipelineFailure(
                f"dataset row {rows[index] if index < len(rows) else index} holds {found} image tokens but its "
                f"{len(images)} image(s) fill {expected}{cut}: the image placeholders were cut from the sequence "
                "(truncation by max_length, or a collator that shortens input_ids), so the model cannot place the "
                "image's features",
                "never truncate through image tokens: max_length=None (or one above the longest row, image tokens "
                "included), or truncate the text before the processor inserts the image tokens",
            )


# ---- collate: the images reach the collator ----------------------------------------------------------------


@checks("collate", reads=BATCH)
def check_images_kept(pipeline: Pipeline, batch: dict[str, Any]) -> None:
    """An image column the Trainer drops (remove_unused_columns) leaves the collator rows without images: the batch
    has no pixel input, and the model trains on the text alone."""
    if pipeline.task.image_token is None or any(key in batch for key in PIXEL_KEYS):
        return
    training = pipeline.training
    features = getattr(training.given, "features", None) or {}
    dropped = [name for name in training.removed if _holds_images(features.get(name))]
    if dropped:
        raise _dropped(
            pipeline, dropped, "so the batch holds no pixel_values and the model is trained on the text alone"
        )


def images_dropped(pipeline: Pipeline, split: Any, columns: list[str]) -> diagnosis.PipelineFailure | None:
    """The failure to raise when the Trainer dropped every column of a split that holds images (its forward takes
    none of them) although a collator of the script would build the model's inputs from them; else None."""
    if pipeline.task.image_token is None:
        return None
    features = getattr(split.given, "features", None) or {}
    dropped = [name for name in columns if _holds_images(features.get(name))]
    if not dropped:
        return None
    others = [name for name in columns if name not in dropped]
    also = f"{', '.join(repr(name) for name in others)} too, so " if others else ""
    return _dropped(
        pipeline,
        dropped,
        f"and {also}no column is left: the collator that reads the images and calls the processor never gets them",
    )


def _dropped(pipeline: Pipeline, columns: list[str], consequence: str) -> diagnosis.PipelineFailure:
    quoted = ", ".join(repr(name) for name in columns)
    return diagnosis.PipelineFailure(
        f"the Trainer dropped the image column {quoted} before the collator (remove_unused_columns=True: "
        f"{type(pipeline.model).__name__}.forward takes no {columns[0]!r}) {consequence}",
        "set remove_unused_columns=False in the training arguments, so the collator gets each row's images",
    )


def _holds_images(feature: Any) -> bool:
    """Whether a `datasets` feature is an image column (or a list of images)."""
    import datasets

    while feature is not None and not isinstance(feature, datasets.Image):
        feature = getattr(feature, "feature", None)
    return isinstance(feature, datasets.Image)


# ---- errors the processor and the model raise, in the user's terms ------------------------------------------


def explain(error: BaseException, pipeline: Pipeline) -> diagnosis.PipelineFailure | None:
    """The image-token mismatches of the processor and of the model, explained; None for any other error."""
    message = str(error)
    if PROCESSOR_MISMATCH in message:
        limit = max_length_of(pipeline)
        row = _first_failing_row(pipeline)
        where = f"dataset row {row}" if row is not None else "a row"
        at = f"max_length={limit}" if limit else "the collator's max_length"
        return diagnosis.PipelineFailure(
            f"truncation to {at} cut image tokens from {where}: the processor expands each image into a fixed run "
            "of image tokens, and the row is longer than max_length, so its image no longer fits (the processor "
            'raised "Mismatch in `image` token count")',
            "never truncate through image tokens: max_length=None, or one above the longest row with its image "
            "tokens; shorten the text itself where rows are too long",
        )
    if MODEL_MISMATCH in message:
        return diagnosis.PipelineFailure(
            "the batch's image tokens and its images' features differ in number (the model raised \"Image features "
            f'and image tokens do not match"): {_counts(pipeline)}; a row lost image tokens (truncation, or a '
            "collator that shortens input_ids) or its text holds more or fewer image markers than it has images",
            "let the processor insert the image tokens (one image marker in the text per image) and never cut them: "
            "no truncation after the processor, max_length=None or above the longest row",
        )
    return None


def _first_failing_row(pipeline: Pipeline) -> int | None:
    """The dataset row of the first training sample the collator cannot batch alone."""
    training = pipeline.training
    for position in range(min(len(training), 64)):
        try:
            pipeline.batches.collate([dict(sample) for sample in training.samples([position])], "cpu")
        except Exception as error:
            if PROCESSOR_MISMATCH in str(error) or MODEL_MISMATCH in str(error):
                return training.row(position)
    return None


def _counts(pipeline: Pipeline) -> str:
    """The image tokens of each row of the first batch, for the failure's first line."""
    token = pipeline.task.image_token
    try:
        ids = pipeline.batches.first().get("input_ids")
    except Exception:
        return "the first batch cannot be read"
    if token is None or ids is None or getattr(ids, "ndim", 0) != 2:
        return "image tokens per row unknown"
    counts = [int(count) for count in (ids == token).sum(dim=1).tolist()]
    return f"image tokens per row of the first batch {counts}"


# ---- save: the processor that makes the model's inputs reloads from the checkpoint ------------------------------

#: Processor attributes that decide how many image tokens an image becomes, beside its image processor.
PROCESSOR_SETTINGS = (
    "image_token",
    "patch_size",
    "vision_feature_select_strategy",
    "num_additional_image_tokens",
    "image_seq_len",
    "num_image_tokens",
)


@checks("save", reads=CHECKPOINT)
def check_processor_saved(pipeline: Pipeline) -> str:
    """A vision-language model trained on images is saved with a processor that prepares them, not a tokenizer alone
    (trained on text alone, it is a note: the part of the save item's note that says it, if any)."""
    given = getattr(pipeline.trainer, "processing_class", None)
    if (
        pipeline.task.image_token is None
        or processor_of(pipeline) is not None
        or given is None
        or not hasattr(given, "save_pretrained")
    ):
        return ""
    if not any(key in pipeline.batches.first() for key in PIXEL_KEYS):
        return (
            f"; the checkpoint holds a {type(given).__name__} and no image processor: the script trains this "
            "vision-language model on text alone, and images given to it later need the base checkpoint's processor"
        )
    raise diagnosis.PipelineFailure(
        f"the Trainer saves a {type(given).__name__} without an image processor beside the vision-language "
        f"model: the checkpoint holds no image settings, so AutoProcessor.from_pretrained(checkpoint) cannot "
        "prepare images for it",
        "pass the processor (image processor and tokenizer together) as processing_class= to the Trainer, "
        "not its tokenizer alone",
    )


def image_settings(given: Any, reloaded: Any) -> list[tuple[str, Any, Any]]:
    """(what, as trained, as reloaded) for each setting of a processor that decides how images become inputs."""
    image_processor = getattr(given, "image_processor", None)
    if image_processor is None:
        return []
    again = getattr(reloaded, "image_processor", None)
    pairs: list[tuple[str, Any, Any]] = [
        ("image processor class", _family(type(image_processor).__name__), _family(type(again).__name__))
    ]
    ours = _plain(image_processor.to_dict())
    theirs = _plain(again.to_dict()) if again is not None else {}
    for settings in (ours, theirs):  # transformers 4.x names the backend's class here
        if isinstance(settings.get("image_processor_type"), str):
            settings["image_processor_type"] = _family(settings["image_processor_type"])
    for key in sorted(ours):
        if "processor_class" not in key:
            pairs.append((f"image processor setting {key!r}", ours[key], theirs.get(key)))
    for key in PROCESSOR_SETTINGS:
        if hasattr(given, key):
            pairs.append((f"processor setting {key!r}", getattr(given, key), getattr(reloaded, key, None)))
    return pairs


def _family(name: str) -> str:
    """An image processor's class without its backend: transformers loads `LlavaImageProcessor` (torchvision) where
    torchvision is installed and `LlavaImageProcessorPil` where it is not (`...Fast` and the slow one on 4.x), with
    the same settings; a reload on another machine may pick the other backend, which prepares images alike."""
    for backend in ("Pil", "Fast"):
        if name.endswith(backend) and len(name) > len(backend):
            return name.removesuffix(backend)
    return name


def _plain(value: Any) -> Any:
    """A settings value with tuples as lists, so that what JSON reads back compares equal."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value
