"""Gradient accumulation: the same samples must give the same loss and gradients at any accumulation.

With `gradient_accumulation_steps > 1` the Trainer either divides each micro-batch's loss by the number of
accumulation steps, or, when the model takes loss kwargs (its forward has `**kwargs`), passes the batch's count of
labelled items as `num_items_in_batch` and leaves the scaling to the loss. A loss that ignores `num_items_in_batch`
(a `compute_loss` of the user's own, or a model whose loss is a plain mean) then makes every step's gradients and
logged loss `gradient_accumulation_steps` times too large, silently. The check runs the Trainer's own
`training_step` (its `compute_loss`, its counting of items, its scaling) over one batch (its first rows, where the
loss takes the count) at accumulation 1 and over the same rows as micro-batches, in eval mode so that dropout cannot
tell them apart, and compares the gradients.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pytest_trainer import diagnosis
from pytest_trainer.catalogue import RUN, checks

#: A ratio of gradients beyond this (or below its inverse) is a scaling bug, not rounding or uneven micro-batches.
TOLERANCE = 1.5
#: Rows in each micro-batch compared where the Trainer passes the batch's count of labelled items to the loss: a
#: correct loss then gives the whole batch's gradients exactly at any size, a scaling bug scales them by the
#: accumulation steps, and each pass costs a training step of its rows (over a checkpoint's whole vocabulary, on a
#: twin). Two, so that each micro-batch still pads rows of different lengths beside each other, as training's do.
#: Where the Trainer averages each micro-batch's own mean loss instead, micro-batches of few rows weigh their tokens
#: unevenly: the whole batch is compared.
ROWS_PER_MICRO_BATCH = 2


@dataclass(frozen=True)
class Comparison:
    """One batch at accumulation 1 against the same rows as `micro` micro-batches."""

    rows: int
    micro: int
    gradient_ratio: float
    loss_ratio: float


def rows_of(batch: dict[str, Any]) -> int | None:
    """The rows of a batch whose every value is a tensor with the same first axis; else None (it cannot be split)."""
    import torch

    sizes = {value.shape[0] if torch.is_tensor(value) and value.dim() > 0 else None for value in batch.values()}
    return next(iter(sizes)) if len(sizes) == 1 else None


def compare(trainer: Any, model: Any, batch: dict[str, Any]) -> Comparison | None:
    """Gradients and logged loss of `batch` (its first rows, ROWS_PER_MICRO_BATCH to each micro-batch, where the loss
    takes the count of labelled items) split as the script accumulates, against the same rows whole.

    None when the script does not accumulate, the batch cannot be split, or either pass gives no usable gradient.
    The parameters' gradients and the random state are left as they were.
    """
    import torch

    steps = int(getattr(trainer.args, "gradient_accumulation_steps", 1) or 1)
    rows = rows_of(batch)
    if steps <= 1 or rows is None or rows < 2:
        return None
    on = next((parameter.device for parameter in model.parameters()), None)
    if on is None or on.type != torch.device(trainer.args.device).type:
        return None  # training_step moves the inputs to the Trainer's device: only the item on it can compare
    micro = min(steps, rows)
    if getattr(trainer, "model_accepts_loss_kwargs", False):
        rows = min(rows, micro * ROWS_PER_MICRO_BATCH)
        batch = {key: value[:rows] for key, value in batch.items()}
    parts = [
        dict(zip(batch, values, strict=True))
        for values in zip(*(torch.tensor_split(value, micro) for value in batch.values()), strict=True)
    ]
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    with _kept_gradients(trainable), _without_dropout(model), _accumulating(trainer), torch.random.fork_rng(devices=[]):
        whole_loss, whole = _accumulated(trainer, model, trainable, [batch])
        try:
            split_loss, split = _accumulated(trainer, model, trainable, parts)
        except Exception as error:  # a model that cannot take fewer rows tells nothing about accumulation
            if diagnosis.part_of(error) is None:
                raise
            return None
    if whole is None or split is None:
        return None
    reference = float(whole.dot(whole))
    if (
        reference == 0
        or not math.isfinite(reference)
        or not math.isfinite(whole_loss)
        or whole_loss == 0
        or not math.isfinite(split_loss)
    ):
        return None  # a micro-batch with nothing to score (no pair, no label) tells nothing about the scaling
    return Comparison(rows, micro, float(split.dot(whole)) / reference, split_loss / whole_loss)


def _accumulated(trainer: Any, model: Any, trainable: list[Any], batches: list[dict[str, Any]]) -> tuple[float, Any]:
    """The logged loss (the sum of training_step's returns) and the accumulated gradients of `batches`."""
    import torch

    for parameter in trainable:
        parameter.grad = None
    _, items = trainer.get_batch_samples(iter(batches), len(batches), trainer.args.device)
    trainer.current_gradient_accumulation_steps = len(batches)
    loss = 0.0
    with diagnosis.pipeline_part("the Trainer's training_step (its compute_loss and backward)"):
        for part in batches:
            loss += float(trainer.training_step(model, dict(part), items).detach().float())
    grads = [parameter.grad.detach().double().reshape(-1) for parameter in trainable if parameter.grad is not None]
    return loss, torch.cat(grads) if grads else None


@contextmanager
def _kept_gradients(trainable: list[Any]) -> Iterator[None]:
    saved = [parameter.grad for parameter in trainable]
    try:
        yield
    finally:
        for parameter, grad in zip(trainable, saved, strict=True):
            parameter.grad = grad


@contextmanager
def _without_dropout(model: Any) -> Iterator[None]:
    """Eval mode through training_step, which calls model.train(): dropout would draw other masks for each split."""
    was_training = model.training
    model.eval()
    model.train = lambda mode=True: model  # an instance attribute, deleted below: the class's method is back
    try:
        yield
    finally:
        del model.train
        model.train(was_training)


@contextmanager
def _accumulating(trainer: Any) -> Iterator[None]:
    missing = object()
    saved = getattr(trainer, "current_gradient_accumulation_steps", missing)
    try:
        yield
    finally:
        if saved is missing:
            trainer.__dict__.pop("current_gradient_accumulation_steps", None)
        else:
            trainer.current_gradient_accumulation_steps = saved


@checks("backward", reads=RUN)
def finding(trainer: Any, model: Any, found: Comparison) -> diagnosis.Finding | None:
    """A Finding when accumulation changes the gradients of the same samples, naming what ignores the count."""
    from pytest_trainer.model_facts import base_model

    ratio = found.gradient_ratio
    if 1 / TOLERANCE <= ratio <= TOLERANCE:
        return None
    steps = int(trainer.args.gradient_accumulation_steps)
    measured = (
        f"with gradient_accumulation_steps={steps}, the {found.rows} rows of one batch taken as {found.micro} "
        f"accumulated micro-batches get gradients {ratio:.1f}x (and a logged loss {found.loss_ratio:.1f}x) "
        "those of the same rows at accumulation 1"
    )
    owner = next(cls for cls in type(trainer).__mro__ if "compute_loss" in vars(cls))
    own = owner.__module__.split(".")[0] not in ("transformers", "trl")  # else the library's own compute_loss
    accepts = bool(getattr(trainer, "model_accepts_loss_kwargs", False))
    details = (
        [
            f"in training that is {steps}x: the logged loss is {steps}x the real one, max_grad_norm clips "
            f"{steps}x larger gradients, and with SGD it is a {steps}x larger learning rate"
        ]
        if ratio > 1
        else []
    )
    if ratio > 1 and accepts and own:
        name = f"{owner.__name__}.compute_loss"
        return diagnosis.Finding(
            f"{measured}: {name} returns each micro-batch's mean loss and ignores num_items_in_batch, while the "
            "Trainer, because the model takes loss kwargs, leaves the division by the accumulation steps to it",
            f"in {name}, pass num_items_in_batch on to the model (model(**inputs, num_items_in_batch="
            "num_items_in_batch)) or divide a summed loss by it when it is given; or set model.accepts_loss_kwargs "
            "= False before building the Trainer, so that the Trainer divides by the accumulation steps itself",
            details,
        )
    if ratio > 1 and accepts:
        name = type(base_model(model)).__name__
        return diagnosis.Finding(
            f"{measured}: {name}'s loss is a mean over each micro-batch that ignores num_items_in_batch, but its "
            "forward takes **kwargs, so the Trainer passes the count and skips its own division by the accumulation "
            "steps",
            "set model.accepts_loss_kwargs = False before building the Trainer, so that the Trainer divides each "
            "micro-batch's loss by the accumulation steps",
            details,
        )
    return diagnosis.Finding(
        f"{measured}: the loss is scaled for accumulation {'too little' if ratio > 1 else 'more than once'}",
        "scale the loss once: either return the micro-batch's mean and let the Trainer divide by "
        "gradient_accumulation_steps (model.accepts_loss_kwargs = False), or divide a summed loss by "
        "num_items_in_batch, not both",
        details,
    )
