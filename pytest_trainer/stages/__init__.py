"""The pipeline stages, one module each, and `TrainerStage`, which runs one of them on one device."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_trainer import devices, diagnosis
from pytest_trainer.timeouts import time_limit

if TYPE_CHECKING:
    from pytest_trainer.pipeline import Pipeline


@dataclass
class StageResult:
    """What a stage produced, for the user's own assertions and for the report."""

    stage: str
    device: str
    batch: dict[str, Any] | None = None
    outputs: Any = None
    loss: float | None = None
    gradients: dict[str, Any] | None = None
    figures: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


Check = Callable[["Pipeline", str], StageResult]


#: The module of each stage's check, where it is not named as the stage; imported when its stage first runs.
_MODULES = {"eval": "evaluation"}


def _check(stage: str) -> Check:
    import importlib

    module = importlib.import_module(f"pytest_trainer.stages.{_MODULES.get(stage, stage)}")
    check: Check = module.run
    return check


class TrainerStage:
    """One stage of one Trainer's pipeline on one device; `run()` checks it and returns what it produced."""

    def __init__(
        self,
        load: Callable[[], Pipeline],
        stage: str,
        device: str,
        seed: int,
        on_cuda_broken: Callable[[str], None],
        shares_training: bool = False,
    ) -> None:
        self._load, self.stage, self.device, self.seed = load, stage, device, seed
        self._on_cuda_broken = on_cuda_broken
        #: Whether the next stage may continue the training this one did (a script's own items); else, and after
        #: a failure, the model gets its starting weights back when the stage ends.
        self.shares_training = shares_training
        #: What the last run() produced, for the report.
        self.result: StageResult | None = None

    @functools.cached_property
    def pipeline(self) -> Pipeline:
        """The pipeline under test, loaded on first use (its script runs once per process)."""
        return self._load()

    @property
    def trainer(self) -> Any:
        return self.pipeline.trainer

    def run(self) -> StageResult:
        """Check the stage; raise PipelineFailure with cause and fix, or return what it produced."""
        __tracebackhide__ = True
        import torch

        pipeline = self.pipeline
        name = f"{self.stage}[{self.device}] of {pipeline.name}"

        def hung() -> diagnosis.PipelineFailure:
            return diagnosis.PipelineFailure(
                f"{name} did not finish within {pipeline.settings.timeout:g} s: "
                "it hangs or is far slower than it should be",
                "look for a loop or a blocking call in the collator, the model's forward or compute_loss; "
                "raise --trainer-timeout if it is only slow",
            )

        ended = False
        try:
            with torch.random.fork_rng(devices=[]), time_limit(pipeline.settings.timeout, hung):
                torch.manual_seed(self.seed)
                if self.device != "cuda":
                    self.result = _explained(self.stage, pipeline, self.device)
                else:
                    self.result = self._run_on_cuda(pipeline)
            ended = True
        finally:
            if not (ended and self.shares_training):
                pipeline.settle()
        return self.result

    def _run_on_cuda(self, pipeline: Pipeline) -> StageResult:
        __tracebackhide__ = True
        try:
            return _check(self.stage)(pipeline, self.device)
        except diagnosis.PipelineFailure:
            raise
        except Exception as cuda_error:
            broken = devices.context_is_broken(cuda_error)
            if diagnosis.part_of(cuda_error) is None and not broken:
                raise diagnosis.InternalError(self.stage, cuda_error) from cuda_error
            # GPU errors surface late and point at the wrong line: the CPU tells what really failed.
            if broken:
                self._on_cuda_broken(f"a device-side assert in {self.stage}[cuda] of {pipeline.name}")
            try:
                _explained(self.stage, pipeline, "cpu")
            except diagnosis.PipelineFailure as failure:
                replayed = [*failure.details, "(found by replaying the failed CUDA step on the CPU)"]
                raise type(failure)(failure.cause, failure.fix, replayed) from (
                    failure.__cause__ or cuda_error
                )
            raise _user_failure(cuda_error, pipeline, self.stage) from cuda_error


def _explained(stage: str, pipeline: Pipeline, device: str) -> StageResult:
    """Run a stage's check: the user's errors become failures in their terms, the plugin's own an internal error."""
    __tracebackhide__ = True
    try:
        return _check(stage)(pipeline, device)
    except diagnosis.PipelineFailure:
        raise
    except Exception as error:
        raise _user_failure(error, pipeline, stage) from error


def _user_failure(error: Exception, pipeline: Pipeline, stage: str) -> Exception:
    """A failure naming the cause, when a part of the user's pipeline raised `error`; else an internal error."""
    part = diagnosis.part_of(error)
    if part is None:
        return diagnosis.InternalError(stage, error)
    try:
        return diagnosis.explain(error, pipeline) or diagnosis.raised_by(error, part)
    except Exception as crash:  # explaining is the plugin's own work
        return diagnosis.InternalError(stage, crash)
