"""One Trainer as the stages see it in this process.

The script runs once; every stage reuses what it built. The pipeline keeps the trainer's family, its task, the
training and evaluation splits as the Trainer feeds them (`fed_data`), its batches, the model's place on each device,
and puts back any weights or optimizer state a stage changes, so stages never leak into each other.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_trainer import adapters, diagnosis, families, fed_data, tasks, training
from pytest_trainer.catalogue import SETTINGS, checks
from pytest_trainer.devices import GPU_PRECISION
from pytest_trainer.losses import checked_loss
from pytest_trainer.settings import Settings
from pytest_trainer.training import FixedBatchRun, SavedWeights

if TYPE_CHECKING:
    import pyarrow as pa
    import torch
    from transformers import Trainer

    from pytest_trainer.commands import Command
    from pytest_trainer.engines import DeepSpeed
    from pytest_trainer.script_runner import Cut
    from pytest_trainer.twin.loading import Twin


@dataclass(frozen=True)
class Origin:
    """How the Trainer came to be, as the session loaded it: the command and the factory that built it, and what the
    script runner saw while the script ran. A Trainer from a fixture has the default, empty origin."""

    #: The command (a script, as --trainer-module runs it) that built the Trainer, and the factory called in it.
    command: Command | None = None
    factory: str | None = None
    #: The fsdp_config of a script that asks for FSDP, which this process runs without (None: it asks for none).
    asked_fsdp: dict[str, Any] | None = None
    #: The DeepSpeed config the script's arguments ask for, run here or not (None: they ask for none).
    asked_deepspeed: DeepSpeed | None = None
    #: The splits --trainer-sample cut as the script loaded them (the run's length is estimated from them).
    cuts: tuple[Cut, ...] = ()
    #: The datasets in scope where the script called train(): its data as stored before map() (`script_runner`).
    sources: tuple[Any, ...] = ()
    #: Precision settings the script asked for that this machine turned off (bf16 without a GPU, say).
    asked_precision: frozenset[str] = frozenset()
    #: The models the script asked for that were built as twins (see `twin.loading`).
    twins: tuple[Twin, ...] = ()
    #: Facts about how the pipeline was loaded, for the report (sampling, say).
    notes: tuple[str, ...] = ()
    #: What the load item reports that the script's settings get wrong (a DeepSpeed config at odds with its arguments).
    findings: tuple[diagnosis.Finding, ...] = ()


class Pipeline:
    """One Trainer of this process as the stages see it: loaded once, shared by its items."""

    def __init__(
        self, trainer: Trainer, name: str, settings: Settings | None = None, origin: Origin = Origin()
    ) -> None:
        self.trainer = trainer
        self.name = name
        self.settings = settings or Settings()
        self.command, self.factory, self.asked_fsdp = origin.command, origin.factory, origin.asked_fsdp
        self.asked_deepspeed = origin.asked_deepspeed
        self.cuts, self.sources = origin.cuts, origin.sources
        self.asked_precision, self.twins = origin.asked_precision, origin.twins
        #: What the load item reports that the script's settings get wrong.
        self.load_findings = origin.findings
        #: Facts about how the pipeline was loaded, for the report (sampling, say).
        self.notes: list[str] = list(origin.notes)
        #: How this kind of trainer makes its batches and takes its loss.
        self.family = families.family_of(trainer)
        #: The batches the model is fed, made as the Trainer makes them.
        self.batches = fed_data.Batches(trainer, self.family, lambda: self.training, lambda: self.task.label_collator)
        self._cpu_replica: torch.nn.Module | None = None
        self._saved_weights: dict[int, SavedWeights] = {}
        self._runs: dict[str, FixedBatchRun] = {}
        self._start_losses: dict[str, float] = {}
        #: How the Trainer checkpoints activations in training ("" for not at all), once it is turned on.
        self.checkpointing: str | None = None
        #: Where the Trainer put the model (the GPU, where there is one): a marked test finds it there after a stage.
        self._trainer_device = (
            next((parameter.device for parameter in trainer.model.parameters()), None)
            if trainer.model is not None
            else None
        )

    # ---- data, as fed -----------------------------------------------------------------------

    @functools.cached_property
    def task(self) -> tasks.Task:
        """What kind of task this is: what the model takes and what its labels mean."""
        return self.family.task(self.model)

    @functools.cached_property
    def splits(self) -> list[fed_data.FedSplit]:
        """The training split and every evaluation split, as the Trainer feeds them."""
        return fed_data.splits(self.trainer, self.settings.sample, self.family.keeps_columns)

    @property
    @checks("dataset", reads=SETTINGS)
    def training(self) -> fed_data.FedSplit:
        """The training split as fed; a failure where the Trainer has none."""
        found = next((split for split in self.splits if split.description == "training"), None)
        if found is None:
            raise diagnosis.PipelineFailure("the Trainer has no train_dataset", "pass train_dataset= to the Trainer")
        return found

    def label_column(self, table: pa.Table) -> str | None:
        return fed_data.label_column(self.trainer, table)

    def decoded(self, token_ids: Any) -> str:
        """The text of token ids when the Trainer knows a tokenizer, else an empty string."""
        return fed_data.decoded(self.trainer, token_ids)

    # ---- model ----------------------------------------------------------------------------

    @property
    @checks("forward", reads=SETTINGS)
    def model(self) -> torch.nn.Module:
        """The Trainer's model; a failure where it has none before train() (model_init)."""
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
        self.end_fixed_batch_runs()  # before a move: the CPU copy kept for replays must have the starting weights too
        model = self._moved(device)
        adapters.quantized_for_training(model)
        return model

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

    def end_fixed_batch_runs(self, device: str | None = None) -> None:
        """End the shared training run on `device` (on every device when None): starting weights back, no gradients."""
        for on in [device] if device else list(self._runs):
            run = self._runs.pop(on, None)
            if run is not None:
                run.close()
                self._starting_weights(run.model).restore(run.model)

    def move_model_back(self) -> None:
        """The model back where the Trainer put it, for the user's own assertions after a stage moved it."""
        model: Any = self.trainer.model
        now = next((parameter.device for parameter in model.parameters()), None) if model is not None else None
        if self._trainer_device is not None and now is not None and now != self._trainer_device:
            with diagnosis.pipeline_part(f"moving the model back to {self._trainer_device}"):
                model.to(self._trainer_device)

    def fixed_batch_run(self, device: str, factor: float = 1.0, within: int | None = None) -> FixedBatchRun:
        """The training run on the fixed batch shared on `device`, continued where another stage left it.

        A run at another rate, or further than `within` steps, is ended and a new one starts from the starting weights.
        """
        run = self._runs.get(device)
        if run is not None and (run.factor != factor or (within is not None and run.steps > within)):
            self.end_fixed_batch_runs(device)
            run = None
        if run is None:
            model = self.model_on(device)
            self._starting_weights(model)
            batch = self.batches.first_on(device)
            if self.family.judged_as == "loss":
                run = FixedBatchRun(
                    self.trainer, self.loss_only, model, batch, factor, lambda: self.starting_loss(device)
                )
            else:  # judged by a figure of its own, at the starting weights too
                run = FixedBatchRun(
                    self.trainer,
                    self.loss_only,
                    model,
                    batch,
                    factor,
                    lambda: checked_loss(training.eval_loss(self.judged, model, batch)[0]),
                    self.judged,
                )
            self._runs[device] = run
        return run

    def starting_loss(self, device: str) -> float:
        """The fixed batch's loss at the starting weights, in eval mode (the forward stage's figure)."""
        if device not in self._start_losses:
            self._start_losses[device] = checked_loss(
                training.eval_loss(self.loss_only, self._moved(device), self.batches.first_on(device))[0]
            )
        return self._start_losses[device]

    def remember_starting_loss(self, device: str, value: float) -> None:
        self._start_losses[device] = value

    def changed_weights(self, model: torch.nn.Module) -> list[str]:
        """The trainable parameters of `model` that differ from their starting values."""
        return self._starting_weights(model).changed(model)

    def unmoved_weights(self, model: torch.nn.Module) -> list[tuple[str, int, int]]:
        """Per trainable parameter below float32 precision: (name, elements a step left as they were, elements with a
        gradient)."""
        return self._starting_weights(model).unmoved(model)

    def _starting_weights(self, model: torch.nn.Module) -> SavedWeights:
        saved = self._saved_weights.get(id(model))
        if saved is None:
            saved = self._saved_weights[id(model)] = SavedWeights(model)
        return saved

    def loss(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        """The trainer's own loss on `batch` (its family's way of taking it) and the model's outputs."""
        return self.family.loss(self.trainer, model, batch)

    def loss_only(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, None]:
        """The trainer's own loss on `batch` without the outputs, as a training step takes it (no output is built that
        the step would not hold)."""
        return self.family.loss_value(self.trainer, model, batch), None

    def judged(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        """The figure that falls as the model learns `batch` (the loss, unless the family says otherwise)."""
        return self.family.judged(self.trainer, model, batch)

    def eval_loss(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        """The loss and the outputs in eval mode without gradients; the model's mode is put back."""
        return training.eval_loss(self.loss, model, batch)

    @contextmanager
    def weights_kept(self, model: torch.nn.Module) -> Iterator[None]:
        """Run a block that trains `model` from its starting weights, then put them, and its mode, back and drop its
        gradients. The starting weights are kept in a temporary file, not as a copy in memory."""
        self.end_fixed_batch_runs()
        saved = self._starting_weights(model)
        was_training = model.training
        try:
            yield
        finally:
            saved.restore(model)
            model.zero_grad(set_to_none=True)
            model.train(was_training)

    def precision(self) -> str | None:
        """The mixed precision the script trains in, "fp16" or "bf16", or None for fp32."""
        asked = self.asked_precision | {name for name in GPU_PRECISION if getattr(self.trainer.args, name, None)}
        return "fp16" if "fp16" in asked else "bf16" if "bf16" in asked else None
