"""One Trainer as the stages see it in this process.

The script runs once; every stage reuses what it built. The pipeline keeps the training and
evaluation splits as the Trainer feeds them, one fixed batch, the model's place on each device,
and puts back any weights or optimizer state a stage changes, so stages never leak into each other.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_trainer import adapters, diagnosis, fed, tables, tasks
from pytest_trainer.options import Settings
from pytest_trainer.training import Pristine, Trajectory

if TYPE_CHECKING:
    import pyarrow as pa
    import torch
    from transformers import Trainer

#: What torch and the tokenizers say when a collator meets samples of different lengths that nothing padded.
UNEQUAL_LENGTHS = ("stack expects each tensor to be equal size", "expected sequence of length",
                   "Unable to create tensor", "must be of equal size", "too many dimensions",
                   "does not have a padding token")
TRAIN_LOADER = "the training dataloader (its dataset and data_collator)"
#: Seed of the sampler that draws the fixed batch, so every stage and every run sees the same rows.
BATCH_SEED = 0


class Pipeline:
    def __init__(self, trainer: Trainer, name: str, settings: Settings | None = None) -> None:
        self.trainer = trainer
        self.name = name
        self.settings = settings or Settings()
        #: Facts about how the pipeline was loaded, for the report (sampling, say).
        self.notes: list[str] = []
        self._batch: dict[str, Any] | None = None
        self._cpu_replica: torch.nn.Module | None = None
        self._pristine: dict[int, Pristine] = {}
        self._runs: dict[str, Trajectory] = {}
        self._start_losses: dict[str, float] = {}
        #: How the Trainer checkpoints activations in training ("" for not at all), once it is turned on.
        self.checkpointing: str | None = None
        #: Precision settings the script asked for that this machine turned off (bf16 without a GPU, say).
        self.asked_precision: frozenset[str] = frozenset()

    # ---- data, as fed -----------------------------------------------------------------------

    @functools.cached_property
    def task(self) -> tasks.Task:
        """What kind of task this is: what the model takes and what its labels mean."""
        return tasks.detect(self.model, self.trainer)

    @functools.cached_property
    def splits(self) -> list[fed.FedSplit]:
        """The training split and every evaluation split, as the Trainer feeds them."""
        return fed.splits(self.trainer, self.settings.sample)

    @property
    def training(self) -> fed.FedSplit:
        found = next((split for split in self.splits if split.description == "training"), None)
        if found is None:
            raise diagnosis.PipelineFailure("the Trainer has no train_dataset", "pass train_dataset= to the Trainer")
        return found

    def training_table(self) -> pa.Table:
        """The training samples as fed, as an Arrow table."""
        return self.training.table

    def rows(self, indices: list[int]) -> list[dict[str, Any]]:
        """Training samples as the collator receives them."""
        return self.training.samples(indices)

    def spread_batches(self, rows: int) -> list[tuple[list[dict[str, Any]], dict[str, Any]]]:
        """(samples, batch) of the script's batch size, collated by the Trainer's own collator on the CPU from rows
        spread over the training split."""
        count = len(self.training)
        indices = sorted({int(index) for index in np.linspace(0, count - 1, min(rows, count))}) if count else []
        size = max(1, int(self.trainer.args.train_batch_size))
        found = []
        for start in range(0, len(indices), size):
            samples = self.rows(indices[start:start + size])
            found.append((samples, self.collate([dict(sample) for sample in samples], "cpu")))
        return found

    def collate(self, features: list[dict[str, Any]], device: str) -> dict[str, Any]:
        """A batch made by the Trainer's own collator, on `device`."""
        import datasets
        import torch

        collator = self.trainer.data_collator
        if not isinstance(self.trainer.train_dataset, datasets.Dataset):
            collator = self.trainer._get_collator_with_removed_columns(collator, description="training")
        with diagnosis.pipeline_part("the data collator"):
            batch = collator(features)
        return {key: value.to(device) if torch.is_tensor(value) else value for key, value in batch.items()}

    def decoded(self, token_ids: Any) -> str:
        """The text of token ids when the Trainer knows a tokenizer, else an empty string."""
        tokenizer = getattr(self.trainer, "processing_class", None)
        decode = getattr(tokenizer, "decode", None)
        while isinstance(token_ids, list) and token_ids and isinstance(token_ids[0], list):
            token_ids = token_ids[0]  # the first choice of a multiple-choice row
        if not callable(decode) or not isinstance(token_ids, list) or not token_ids:
            return ""
        return str(decode(token_ids))

    def label_column(self, table: pa.Table) -> str | None:
        names = [*(getattr(self.trainer, "label_names", None) or ["labels"]), "label", "label_ids"]
        return next((name for name in names if name in table.column_names), None)

    def first_batch(self) -> dict[str, Any]:
        """The first batch of the Trainer's own train dataloader, drawn with a fixed seed, on the CPU."""
        import torch

        if self._batch is None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(BATCH_SEED)
                try:
                    with diagnosis.pipeline_part(TRAIN_LOADER):
                        batch = next(iter(self.trainer.get_train_dataloader()))
                except (ValueError, TypeError, RuntimeError) as error:
                    # Explaining is the plugin's own work, outside the pipeline's part: its bugs stay its own.
                    problem = self.padding_problem() if any(sign in str(error) for sign in UNEQUAL_LENGTHS) else None
                    if problem is None:
                        raise
                    raise problem from error
            self._batch = {key: value.cpu() if torch.is_tensor(value) else value for key, value in batch.items()}
        return self._batch

    def batch_on(self, device: str) -> dict[str, Any]:
        import torch

        return {
            key: value.to(device) if torch.is_tensor(value) else value for key, value in self.first_batch().items()
        }

    # ---- model ----------------------------------------------------------------------------

    @property
    def model(self) -> torch.nn.Module:
        model = self.trainer.model
        if model is None:  # only with model_init, which the Trainer calls at train()
            raise diagnosis.PipelineFailure(
                "the Trainer has no model yet (it was given model_init, which runs only inside train())",
                "pass model= to the Trainer, or test a factory that builds one (--trainer-factory)",
            )
        return model

    def model_on(self, device: str) -> torch.nn.Module:
        """The model on `device` at its starting weights (a shared training run ends and is undone).

        Moved once; a CPU copy is kept before it goes to CUDA, to replay failures.
        """
        self.settle()  # before a move: the CPU copy kept for replays must have the starting weights too
        return self._moved(device)

    def _moved(self, device: str) -> torch.nn.Module:
        if device == "cpu" and self._cpu_replica is not None:
            return self._cpu_replica
        with diagnosis.pipeline_part(f"moving the model to {device}"):
            if device != "cpu" and self._cpu_replica is None:
                self._cpu_replica = copy.deepcopy(self.model).to("cpu")
            model = self.model.to(device)
        if self.checkpointing is None:
            self.checkpointing = adapters.enable_checkpointing(self.trainer, model) or ""
        return model

    def settle(self, device: str | None = None) -> None:
        """End the shared training run on `device` (on every device when None): starting weights back, no gradients."""
        for on in [device] if device else list(self._runs):
            run = self._runs.pop(on, None)
            if run is not None:
                run.close()
                self._starting_weights(run.model).restore(run.model)

    def trajectory(self, device: str, factor: float = 1.0, within: int | None = None) -> Trajectory:
        """The training run on the fixed batch shared on `device`, continued where another stage left it.

        A run at another rate, or further than `within` steps, is ended and a new one starts from the starting weights.
        """
        run = self._runs.get(device)
        if run is not None and (run.factor != factor or (within is not None and run.steps > within)):
            self.settle(device)
            run = None
        if run is None:
            model = self.model_on(device)
            self._starting_weights(model)
            run = Trajectory(self, model, device, factor, lambda: self.starting_loss(device))
            self._runs[device] = run
        return run

    def starting_loss(self, device: str) -> float:
        """The fixed batch's loss at the starting weights, in eval mode (the forward stage's figure)."""
        if device not in self._start_losses:
            from pytest_trainer.stages.forward import checked_loss

            self._start_losses[device] = checked_loss(self.eval_loss(self._moved(device), self.batch_on(device))[0])
        return self._start_losses[device]

    def remember_starting_loss(self, device: str, value: float) -> None:
        self._start_losses[device] = value

    def changed_weights(self, model: torch.nn.Module) -> list[str]:
        """The trainable parameters of `model` that differ from their starting values."""
        return self._starting_weights(model).changed(model)

    def _starting_weights(self, model: torch.nn.Module) -> Pristine:
        saved = self._pristine.get(id(model))
        if saved is None:
            saved = self._pristine[id(model)] = Pristine(model)
        return saved

    def loss(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        """The Trainer's own loss (its compute_loss, subclasses included) and the model's outputs."""
        with diagnosis.pipeline_part("the model's forward (through the Trainer's compute_loss)"), \
                self.trainer.compute_loss_context_manager():
            result = self.trainer.compute_loss(model, dict(batch), return_outputs=True)
        loss, outputs = result if isinstance(result, tuple) else (result, None)
        return loss, outputs

    def eval_loss(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        """The Trainer's loss and the outputs in eval mode without gradients; the model's mode is put back."""
        import torch

        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                return self.loss(model, batch)
        finally:
            model.train(was_training)

    @contextmanager
    def weights_kept(self, model: torch.nn.Module) -> Iterator[None]:
        """Run a block that trains `model` from its starting weights, then put them, and its mode, back and drop its
        gradients. The starting weights are kept in a temporary file, not as a copy in memory."""
        self.settle()
        saved = self._starting_weights(model)
        was_training = model.training
        try:
            yield
        finally:
            saved.restore(model)
            model.zero_grad(set_to_none=True)
            model.train(was_training)

    def optimizer_for(self, model: torch.nn.Module) -> tuple[Any, Any, Callable[[], None]]:
        """The Trainer's own optimizer and scheduler for `model`, and how to put the Trainer's own back as they were."""
        trainer = self.trainer
        saved = (trainer.model, trainer.optimizer, trainer.lr_scheduler)
        given_state = copy.deepcopy(trainer.optimizer.state_dict()) if trainer.optimizer is not None else None
        trainer.model = model
        try:
            with diagnosis.pipeline_part("the Trainer's optimizer and scheduler"):
                trainer.create_optimizer_and_scheduler(num_training_steps=self.planned_steps())
            made = (trainer.optimizer, trainer.lr_scheduler)
        finally:
            trainer.model, trainer.optimizer, trainer.lr_scheduler = saved

        def put_back() -> None:
            if given_state is not None and trainer.optimizer is not None:
                trainer.optimizer.load_state_dict(given_state)

        return made[0], made[1], put_back

    @contextmanager
    def trainer_optimizer(self, model: torch.nn.Module) -> Iterator[tuple[Any, Any]]:
        """The Trainer's own optimizer and scheduler for `model`; the Trainer's state is put back afterwards."""
        optimizer, scheduler, put_back = self.optimizer_for(model)
        try:
            with self.trainer_holding(model, optimizer, scheduler):
                yield optimizer, scheduler
        finally:
            put_back()

    @contextmanager
    def trainer_holding(self, model: torch.nn.Module, optimizer: Any, scheduler: Any) -> Iterator[None]:
        """The Trainer with `model`, `optimizer` and `scheduler` as its own, for its checkpoint code."""
        trainer = self.trainer
        saved = (trainer.model, trainer.optimizer, trainer.lr_scheduler)
        trainer.model, trainer.optimizer, trainer.lr_scheduler = model, optimizer, scheduler
        try:
            yield
        finally:
            trainer.model, trainer.optimizer, trainer.lr_scheduler = saved

    def precision(self) -> str | None:
        """The mixed precision the script trains in, "fp16" or "bf16", or None for fp32."""
        from pytest_trainer.loading import GPU_PRECISION

        asked = self.asked_precision | {name for name in GPU_PRECISION if getattr(self.trainer.args, name, None)}
        return "fp16" if "fp16" in asked else "bf16" if "bf16" in asked else None

    def planned_steps(self) -> int:
        """Optimizer steps the script would train for, which shapes the learning-rate schedule."""
        args = self.trainer.args
        if args.max_steps > 0:
            return int(args.max_steps)
        try:
            batches = math.ceil(len(self.trainer.train_dataset) / args.train_batch_size)  # type: ignore[arg-type]
        except TypeError:
            return 1000
        return max(1, math.ceil(batches / args.gradient_accumulation_steps * args.num_train_epochs))

    # ---- explanations for errors the libraries raise -----------------------------------------

    def label_problem(self) -> diagnosis.PipelineFailure | None:
        """Why labels crash the loss, read from the whole training split."""
        from pytest_trainer.stages import dataset

        return _first_failure(lambda: dataset.check_labels(self, self.training))

    def token_problem(self) -> diagnosis.PipelineFailure | None:
        """Why an embedding lookup is out of range: a token id or a position too large."""
        from pytest_trainer.stages import collate, dataset

        return _first_failure(lambda: dataset.check_tokens(self, self.training)) or _first_failure(
            lambda: collate.check_batch_tokens(self, self.first_batch())
        )

    def padding_problem(self) -> diagnosis.PipelineFailure | None:
        """Samples of different lengths that nothing pads, named with the lengths of the first rows."""
        if self.trainer.train_dataset is None:
            return None
        table = self.training_table()
        first_rows = table.slice(0, max(2, self.trainer.args.train_batch_size))
        for column in first_rows.column_names:
            if not tables.is_numeric(first_rows.schema.field(column).type) or \
                    tables.depth(first_rows.schema.field(column).type) == 0:
                continue
            counts = tables.row_lengths(first_rows, column)
            if counts.size and np.unique(counts).size > 1:
                return diagnosis.unpadded(column, counts.tolist(), self.trainer)
        return None


def _first_failure(action: Any) -> diagnosis.PipelineFailure | None:
    """The failure a check of the data finds, if any; a check that cannot read the data finds none."""
    try:
        action()
    except diagnosis.PipelineFailure as failure:
        return failure
    except Exception as error:
        if diagnosis.part_of(error) is None:
            raise
    return None
