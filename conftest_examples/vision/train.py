"""Tell a red square from a green circle and a blue triangle with a tiny ViT (image classification).

The images are drawn with PIL when the script starts (seeded, so every run draws the same ones): one
shape of random size and position on a random pale background. They go into a ``datasets.Dataset``
with an ``Image`` column and a ``ClassLabel`` column, and ``with_transform`` turns each batch into
``pixel_values`` with a ``ViTImageProcessorPil`` (resize to 32x32, rescale, normalise) when the
Trainer reads it. The model is built from a ``ViTConfig`` (no download).
Run directly with ``python train.py`` or test it with
``pytest --trainer-module=conftest_examples/vision/train.py``.
"""

import random

import numpy as np
import torch
from datasets import ClassLabel, Dataset, Features, Image
from PIL import Image as PILImage
from PIL import ImageDraw
from transformers import Trainer, TrainingArguments, ViTConfig, ViTForImageClassification

try:  # transformers 5: the PIL-based processor has its own name (the default one would want torchvision)
    from transformers import ViTImageProcessorPil
except ImportError:  # transformers 4: the default processor is the PIL-based one
    from transformers import ViTImageProcessor as ViTImageProcessorPil

LABELS = ["red_square", "green_circle", "blue_triangle"]
IMAGE_SIZE = 32
DRAWN_SIZE = 48  # drawn larger than the model's input, so the processor really resizes


def draw_shape(label, rng):
    """One RGB image: the shape of class ``label`` on a random pale background."""
    background = tuple(rng.randint(170, 255) for _ in range(3))
    image = PILImage.new("RGB", (DRAWN_SIZE, DRAWN_SIZE), background)
    size = rng.randint(14, 28)
    left, top = rng.randint(0, DRAWN_SIZE - size), rng.randint(0, DRAWN_SIZE - size)
    box = (left, top, left + size, top + size)
    draw = ImageDraw.Draw(image)
    if LABELS[label] == "red_square":
        draw.rectangle(box, fill=(rng.randint(180, 230), 30, 30))
    elif LABELS[label] == "green_circle":
        draw.ellipse(box, fill=(30, rng.randint(130, 180), 30))
    else:
        draw.polygon([(left + size // 2, top), (left, top + size), (left + size, top + size)], fill=(30, 30, 200))
    return image


def make_split(rows, seed):
    """A dataset of ``rows`` images, the classes in turn, with an ``Image`` and a ``ClassLabel`` column."""
    rng = random.Random(seed)
    labels = [index % len(LABELS) for index in range(rows)]
    features = Features({"image": Image(), "label": ClassLabel(names=LABELS)})
    images = [draw_shape(label, rng) for label in labels]
    return Dataset.from_dict({"image": images, "label": labels}, features=features)


def make_transform(processor):
    def transform(batch):
        """Run on each batch as the Trainer reads it: PIL images in, normalised pixel values out."""
        images = [image.convert("RGB") for image in batch["image"]]
        return {
            "pixel_values": processor(images, return_tensors="pt")["pixel_values"],
            "label": batch["label"],
        }

    return transform


def collate_fn(examples):
    return {
        "pixel_values": torch.stack([example["pixel_values"] for example in examples]),
        "labels": torch.tensor([example["label"] for example in examples]),
    }


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


def main():
    # The PIL-based ViT processor (ViTImageProcessor itself would want torchvision).
    processor = ViTImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    transform = make_transform(processor)
    train_dataset = make_split(120, seed=0).with_transform(transform)
    eval_dataset = make_split(30, seed=1).with_transform(transform)

    config = ViTConfig(
        image_size=IMAGE_SIZE,
        patch_size=8,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=len(LABELS),
        id2label=dict(enumerate(LABELS)),
        label2id={label: index for index, label in enumerate(LABELS)},
    )
    model = ViTForImageClassification(config)

    args = TrainingArguments(
        output_dir="vision-tiny-vit",
        eval_strategy="epoch",
        save_strategy="epoch",
        save_total_limit=1,
        remove_unused_columns=False,  # keep "image": the transform needs it, and it is not a forward argument
        learning_rate=2e-3,
        num_train_epochs=8,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=16,
        report_to="none",
    )

    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=processor,
        data_collator=collate_fn,
        compute_metrics=compute_metrics,
    )
    trainer.train()


if __name__ == "__main__":
    main()
