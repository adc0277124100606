"""The training run on the fixed batch that backward, step, overfit and save share, and the weights it starts from.

Those stages all begin the same way: the Trainer's loss on the fixed batch, its backward, then the Trainer's own
optimizer at its peak learning rate. The items of one script share one such run per device, each taking it as far
as it needs (backward: the gradients; step: one step; overfit: a few more; save: any trained state), instead of
taking the same first step again. Every other stage gets the model back at its starting weights, kept in a
temporary file rather than as a second copy in memory. Dropout draws from a fixed seed per step, so a stage finds
the same numbers whichever items ran before it.
"""

from __future__ import annotations

import copy
import math
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from pytest_trainer import diagnosis, model_facts
from pytest_trainer.catalogue import SETTINGS, checks
from pytest_trainer.losses import checked_loss, detached_loss

if TYPE_CHECKING:
    import torch
    from transformers import Trainer

#: A family's loss on a batch: (loss, outputs) of `model` on `batch` (`families.Family.loss` for one trainer).
LossOf = Callable[["torch.nn.Module", dict[str, Any]], tuple["torch.Tensor", Any]]

#: Seed of the dropout masks of the shared run's steps (step n uses SEED + n).
SEED = 0


def changeable(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors a training step can change: trainable parameters and buffers (batch-norm statistics, say)."""
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            yield name, parameter
    yield from model.named_buffers()


class SavedWeights:
    """The changeable tensors of a model as they were, in a temporary file: restored in place, compared in place."""

    def __init__(self, model: torch.nn.Module) -> None:
        # Open for the pipeline's life; the file has no name on disk, so nothing is left behind at exit.
        self._file = tempfile.TemporaryFile(prefix="pytest-trainer-weights-")  # noqa: SIM115
        self._spans: dict[str, tuple[int, int]] = {}
        for name, tensor in changeable(model):
            data = _bytes(tensor.detach().cpu())  # one tensor at a time in memory
            self._spans[name] = (self._file.tell(), data.numel())
            self._file.write(data.numpy().data)
        self._file.flush()

    def _read(self, name: str, like: torch.Tensor) -> torch.Tensor | None:
        """The saved value of `name` as a CPU tensor shaped like `like`, or None when it was not saved."""
        import torch

        span = self._spans.get(name)
        if span is None or span[1] != like.numel() * like.element_size():
            return None
        value = torch.empty(like.shape, dtype=like.dtype)
        self._file.seek(span[0])
        if self._file.readinto(_bytes(value).numpy()) != span[1]:  # type: ignore[arg-type]
            raise OSError(f"the saved starting weights of {name} are cut short")
        return value

    def restore(self, model: torch.nn.Module) -> None:
        import torch

        with torch.no_grad():
            for name, tensor in changeable(model):
                value = self._read(name, tensor)
                if value is not None:
                    tensor.copy_(value)

    def changed(self, model: torch.nn.Module) -> list[str]:
        """Names of the trainable parameters that differ from their starting values."""
        import torch

        found = []
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                value = self._read(name, parameter) if parameter.requires_grad else None
                if value is not None and not torch.equal(value.to(parameter.device), parameter):
                    found.append(name)
        return found

    def unmoved(self, model: torch.nn.Module) -> list[tuple[str, int, int]]:
        """(name, elements unchanged, elements with a gradient) of each trainable parameter of a precision below
        float32 that has a gradient: an element the optimizer was asked to move but that kept its starting value."""
        import torch

        found = []
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if (
                    not parameter.requires_grad
                    or parameter.grad is None
                    or parameter.dtype not in (torch.bfloat16, torch.float16)
                ):
                    continue
                value = self._read(name, parameter)
                pushed = parameter.grad != 0
                count = int(pushed.sum())
                if value is None or not count:
                    continue
                kept = int(((value.to(parameter.device) == parameter) & pushed).sum())
                found.append((name, kept, count))
        return found

    def close(self) -> None:
        self._file.close()


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor, as a flat uint8 view of the same memory."""
    import torch

    return tensor.reshape(-1).view(torch.uint8)


def non_finite(named: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """Names of the tensors holding NaN or inf, read once each without a copy: NaN and inf survive a float32 sum,
    and a sum that is not finite is confirmed element by element (finite values can overflow it)."""
    import torch

    with torch.no_grad():
        return [
            name
            for name, tensor in named
            if tensor.is_floating_point()
            and not math.isfinite(float(tensor.sum(dtype=torch.float32)))
            and not bool(torch.isfinite(tensor).all())
        ]


@checks("step", reads=SETTINGS)
def at_peak_learning_rate(optimizer: Any, model: Any) -> tuple[float, bool]:
    """Set every group to its peak learning rate; a warmup that starts at 0 must not hide it.

    Returns the peak and whether the schedule had started below it. A peak of 0 is a failure.
    """
    peak = max(group.get("initial_lr", group["lr"]) for group in optimizer.param_groups)
    if peak == 0:
        raise diagnosis.PipelineFailure(
            "the learning rate is 0, so no optimizer step can change the weights",
            f"set learning_rate in TrainingArguments (or in the config a framework builds them from): "
            f"{model_facts.usual_learning_rates(model)}",
        )
    below = max(group["lr"] for group in optimizer.param_groups) < peak
    for group in optimizer.param_groups:
        group["lr"] = group.get("initial_lr", group["lr"])
    return peak, below


def one_step(loss_of: LossOf, model: torch.nn.Module, batch: dict[str, Any], optimizer: Any, scheduler: Any) -> float:
    """One training step as the Trainer takes it: loss, backward, optimizer and scheduler step; returns the loss."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss = loss_of(model, batch)[0]  # the outputs are dropped before backward, as in the Trainer's step
    value = checked_loss(loss)
    with diagnosis.pipeline_part("backward() through the model"):
        loss.backward()
    with diagnosis.pipeline_part("the optimizer's step"):
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return value


class FixedBatchRun:
    """Steps of the Trainer's optimizer on the fixed batch from the starting weights, at `factor` x the peak rate.

    The scheduler steps too, so its code runs, but every step is taken at the peak rate: a warmup that starts at 0
    would otherwise hide whether a step can change anything.
    """

    def __init__(
        self,
        trainer: Trainer,
        loss_of: LossOf,
        model: torch.nn.Module,
        batch: dict[str, Any],
        factor: float,
        start_loss: Callable[[], float],
        judge: LossOf | None = None,
    ) -> None:
        self.trainer, self.loss_of, self.model, self.batch, self.factor = trainer, loss_of, model, batch, factor
        #: What the run is judged by in eval mode (`starting_loss`, `eval_loss`): the loss unless said otherwise.
        self.judge = judge or loss_of
        self._start_loss = start_loss
        #: The loss of the batch at the starting weights, in eval mode (known before the first step).
        self.loss_before: float | None = None
        #: The train-mode loss of every step taken.
        self.curve: list[float] = []
        #: Whether the gradients of the next step are on the parameters, and whether the loss reached them.
        self.pending = False
        self.attached = True
        self._loss_value = math.nan
        self.clip = float(getattr(trainer.args, "max_grad_norm", 0) or 0)
        self._made: tuple[Any, Any, Callable[[], None]] | None = None
        self._rates: list[float] = []
        self.peak, self.warmup = math.nan, False

    @property
    def optimizer(self) -> Any:
        return self._optimizer_and_scheduler()[0]

    @property
    def scheduler(self) -> Any:
        return self._optimizer_and_scheduler()[1]

    def _optimizer_and_scheduler(self) -> tuple[Any, Any, Callable[[], None]]:
        """Made at the first step, so that a learning rate of 0 fails the stage that steps, not backward."""
        if self._made is None:
            made = optimizer_for(self.trainer, self.model)
            try:
                self.peak, self.warmup = at_peak_learning_rate(made[0], self.model)
            except diagnosis.PipelineFailure:
                made[2]()
                raise
            self._made = made
            self._rates = [group["lr"] * self.factor for group in made[0].param_groups]
            self._set_rates()
        return self._made

    def starting_loss(self) -> float:
        """The batch's loss at the starting weights, in eval mode."""
        if self.loss_before is None:
            if self.curve:
                raise RuntimeError("the starting loss is asked for after the first step")
            self.loss_before = self._start_loss()
        return self.loss_before

    @property
    def rate(self) -> float:
        return self.peak * self.factor

    @property
    def steps(self) -> int:
        return len(self.curve)

    def _set_rates(self) -> None:
        for group, rate in zip(self.optimizer.param_groups, self._rates, strict=True):
            group["lr"] = rate

    @contextmanager
    def _seeded(self) -> Iterator[None]:
        import torch

        device = self.model_device
        trainer = self.trainer
        optimizer, scheduler = self._made[:2] if self._made else (trainer.optimizer, trainer.lr_scheduler)
        with (
            torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []),
            holding(trainer, self.model, optimizer, scheduler),
        ):
            torch.manual_seed(SEED + self.steps)
            yield

    @property
    def model_device(self) -> torch.device:
        import torch

        return next((p.device for p in self.model.parameters()), torch.device("cpu"))

    def gradients(self) -> float:
        """The next step's train-mode loss, backward into the parameters' gradients (once); returns the loss.

        A loss detached from the model (no grad_fn) leaves `attached` False and no gradient.
        """
        if self.pending:
            return self._loss_value
        if not self.curve:
            self.starting_loss()
        with self._seeded():
            self.model.train()
            self.model.zero_grad(set_to_none=True)
            loss = self.loss_of(self.model, self.batch)[0]  # outputs dropped before backward, as the Trainer
            value = checked_loss(loss) if not self.curve else float(loss.detach().float())
            self.attached = loss.grad_fn is not None
            if self.attached and math.isfinite(value):
                with diagnosis.pipeline_part("backward() through the model"):
                    loss.backward()
        self.pending, self._loss_value = True, value
        return value

    def step(self) -> float:
        """Take the next optimizer step (clipping gradients as the Trainer does); returns its train-mode loss."""
        import torch

        optimizer = self.optimizer
        value = self.gradients()
        if not self.attached:
            raise detached_loss()
        self.pending = False
        self.curve.append(value)
        if not math.isfinite(value):
            return value
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad], self.clip)
        with diagnosis.pipeline_part("the optimizer's step"):
            optimizer.step()
        if self.scheduler is not None:
            with diagnosis.pipeline_part("the learning-rate scheduler's step"):
                self.scheduler.step()
            self._set_rates()
        return value

    def eval_loss(self) -> float:
        """The batch's loss (or the figure the run is judged by) at the current weights, in eval mode; NaN stays NaN."""
        with self._seeded():
            loss, _ = eval_loss(self.judge, self.model, self.batch)
        return float(loss.detach().float())

    def close(self) -> None:
        """Put the Trainer's own optimizer back as it was; the caller restores the weights."""
        self.model.zero_grad(set_to_none=True)
        if self._made is not None:
            self._made[2]()
            self._made = None


def eval_loss(loss_of: LossOf, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, Any]:
    """The loss and the outputs in eval mode without gradients; the model's mode is put back."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return loss_of(model, batch)
    finally:
        model.train(was_training)


def planned_steps(trainer: Trainer) -> int:
    """Optimizer steps the script would train for, which shapes the learning-rate schedule."""
    args = trainer.args
    if args.max_steps > 0:
        return int(args.max_steps)
    try:
        batches = math.ceil(len(trainer.train_dataset) / args.train_batch_size)  # type: ignore[arg-type]
    except TypeError:
        return 1000
    return max(1, math.ceil(batches / args.gradient_accumulation_steps * args.num_train_epochs))


def optimizer_for(
    trainer: Trainer, model: torch.nn.Module, steps: int | None = None
) -> tuple[Any, Any, Callable[[], None]]:
    """The Trainer's own optimizer and scheduler for `model` (the scheduler made for `steps`, else for the steps of the
    data at hand), and how to put the Trainer's own back as they were."""
    saved = (trainer.model, trainer.optimizer, trainer.lr_scheduler)
    given_state = copy.deepcopy(trainer.optimizer.state_dict()) if trainer.optimizer is not None else None
    trainer.model = model
    try:
        with diagnosis.pipeline_part("the Trainer's optimizer and scheduler"):
            trainer.create_optimizer_and_scheduler(num_training_steps=steps or planned_steps(trainer))
        made = (trainer.optimizer, trainer.lr_scheduler)
    finally:
        trainer.model, trainer.optimizer, trainer.lr_scheduler = saved

    def put_back() -> None:
        if given_state is not None and trainer.optimizer is not None:
            trainer.optimizer.load_state_dict(given_state)

    return made[0], made[1], put_back


@contextmanager
def trainer_optimizer(trainer: Trainer, model: torch.nn.Module) -> Iterator[tuple[Any, Any]]:
    """The Trainer's own optimizer and scheduler for `model`; the Trainer's state is put back afterwards."""
    optimizer, scheduler, put_back = optimizer_for(trainer, model)
    try:
        with holding(trainer, model, optimizer, scheduler):
            yield optimizer, scheduler
    finally:
        put_back()


@contextmanager
def holding(trainer: Trainer, model: torch.nn.Module, optimizer: Any, scheduler: Any) -> Iterator[None]:
    """The Trainer with `model`, `optimizer` and `scheduler` as its own, for its checkpoint code."""
    saved = (trainer.model, trainer.optimizer, trainer.lr_scheduler)
    trainer.model, trainer.optimizer, trainer.lr_scheduler = model, optimizer, scheduler
    try:
        yield
    finally:
        trainer.model, trainer.optimizer, trainer.lr_scheduler = saved


@contextmanager
def inputs_on(trainer: Trainer, device: str) -> Iterator[None]:
    """The Trainer's own code with the inputs it prepares placed on `device` instead of its own (`args.device`).

    The Trainer moves every batch to the one device it trains on; an item on another device (the CPU items of a
    machine with a GPU) runs the Trainer's prediction step on its own device.
    """
    import torch

    if torch.device(trainer.args.device).type == device:
        yield
        return

    def placed(data: Any) -> Any:
        if isinstance(data, Mapping):
            return type(data)({key: placed(value) for key, value in data.items()})  # type: ignore[call-arg]
        if isinstance(data, (tuple, list)):
            return type(data)(placed(value) for value in data)
        return data.to(device) if torch.is_tensor(data) else data

    trainer._prepare_input = placed  # type: ignore[method-assign]
    try:
        yield
    finally:
        del trainer._prepare_input  # the class's own method again
