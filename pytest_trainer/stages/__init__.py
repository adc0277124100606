"""The pipeline stages, one module each, collected into one registry; `TrainerStage` runs one on one device.

A stage module declares itself with `STAGE = Stage(...)` (see `base`): its name, its rank in the plan, the stages it
needs, the devices it runs on and the tasks or trainer families it applies to. Adding a stage is adding a module.
Stage modules import nothing heavy at import time: the registry is read while pytest parses its options.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from pytest_trainer import devices, diagnosis, extensions
from pytest_trainer.stages.base import Stage, StageResult, everywhere
from pytest_trainer.timeouts import time_limit

if TYPE_CHECKING:
    from pytest_trainer.pipeline import Pipeline

__all__ = ["Stage", "StageResult", "TrainerStage", "registry"]


@functools.cache
def registry() -> dict[str, Stage]:
    """Every stage declared by a module of this package, and by an installed package's entry point (a stage that
    cannot take its place is refused, with the reason: `extensions.problems`), by name, in rank order."""
    found: list[Stage] = []
    for info in pkgutil.iter_modules(__path__):
        declared = getattr(importlib.import_module(f"{__name__}.{info.name}"), "STAGE", None)
        if isinstance(declared, Stage):
            found.append(declared)
    ranks = {stage.name: stage.rank for stage in found}
    for entry, stage in extensions.loaded(
        extensions.STAGES, "a pytest_trainer.Stage", lambda value: isinstance(value, Stage)
    ):
        wrong = [need for need in stage.needs if ranks.get(need, stage.rank) >= stage.rank]
        if stage.name in ranks or stage.first or wrong:
            why = (
                f"a stage named {stage.name!r} exists already"
                if stage.name in ranks
                else "only the load stage may be first"
                if stage.first
                else f"its needs {wrong} are not stages of a lower rank than its own ({stage.rank})"
            )
            extensions.refuse(entry, why)
            continue
        found.append(stage)
        ranks[stage.name] = stage.rank
    ordered = sorted(found, key=lambda stage: stage.rank)
    by_name = {stage.name: stage for stage in ordered}
    for stage in ordered:
        wrong = [need for need in stage.needs if need not in by_name or by_name[need].rank >= stage.rank]
        if len(by_name) != len(ordered) or wrong:
            raise RuntimeError(
                f"stage {stage.name!r} is declared with needs {wrong} that are not stages of a lower "
                "rank (or two stages share a name)"
            )
    return by_name


class TrainerStage:
    """One stage of one Trainer's pipeline on one device; `run()` checks it and returns what it produced."""

    def __init__(
        self,
        load: Callable[[], Pipeline],
        stage: str,
        device: str,
        seed: int,
        shares_training: bool = False,
        named: bool = True,
    ) -> None:
        self._load, self.stage, self.device, self.seed = load, stage, device, seed
        #: What left the CUDA context unusable in this run (a device-side assert), for the session to skip the later
        #: cuda items with; None while it is usable.
        self.cuda_broken: str | None = None
        #: Whether the next stage may continue the training this one did (a script's own items); else, and after
        #: a failure, the model gets its starting weights back when the stage ends.
        self.shares_training = shares_training
        #: Whether the stage was named (by --trainer-stages or a marked test): it runs even with nothing to check.
        self.named = named
        #: What the last run() produced, for the report.
        self.result: StageResult | None = None

    @functools.cached_property
    def pipeline(self) -> Pipeline:
        """The pipeline under test, loaded on first use (its script runs once per process)."""
        return self._load()

    @property
    def trainer(self) -> Any:
        return self.pipeline.trainer

    @property
    def declared(self) -> Stage:
        return registry()[self.stage]

    def run(self) -> StageResult:
        """Check the stage; raise PipelineFailure with cause and fix, or return what it produced."""
        __tracebackhide__ = True
        import torch

        pipeline = self.pipeline
        self._skip_unless_it_applies(pipeline)
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
                    self.result = _explained(self.declared, pipeline, self.device)
                else:
                    self.result = self._run_on_cuda(pipeline)
            ended = True
        finally:
            if not (ended and self.shares_training):
                pipeline.end_fixed_batch_runs()
            if ended and not self.shares_training:  # a marked test's own assertions read the model where it was
                pipeline.move_model_back()
        return self.result

    def _skip_unless_it_applies(self, pipeline: Pipeline) -> None:
        """Skip, with the reason, a stage declared for other tasks, trainer families or a device other than this one."""
        stage = self.declared
        uncovered = pipeline.family.not_covered(stage.name)
        if uncovered:
            pytest.skip(uncovered)
        if stage.applies is not everywhere:
            self._skip_for(lambda: stage.applies(pipeline.task, pipeline.family))
        if stage.idle is not None and not self.named:
            idle = stage.idle
            self._skip_for(lambda: idle(pipeline))
        first = next((device for device in devices.DEVICES if device in pipeline.settings.devices), self.device)
        if stage.same_on_every_device and self.device != first:
            pytest.skip(f"{stage.same_on_every_device}: {self.stage}[{first}] covers it")

    def _skip_for(self, reason_of: Callable[[], str | None]) -> None:
        """Skip with the reason a stage's declaration gives (`applies`, `idle`); its own error is the plugin's."""
        try:
            reason = reason_of()
        except diagnosis.TrainerError:
            raise
        except Exception as error:
            raise diagnosis.InternalError(self.stage, error) from error
        if reason:
            pytest.skip(reason)

    def _run_on_cuda(self, pipeline: Pipeline) -> StageResult:
        __tracebackhide__ = True
        try:
            return self.declared.run(pipeline, self.device)
        except diagnosis.PipelineFailure:
            raise
        except Exception as cuda_error:
            broken = devices.context_is_broken(cuda_error)
            if diagnosis.part_of(cuda_error) is None and not broken:
                raise diagnosis.InternalError(self.stage, cuda_error) from cuda_error
            # GPU errors surface late and point at the wrong line: the CPU tells what really failed.
            if broken:
                self.cuda_broken = f"a device-side assert in {self.stage}[cuda] of {pipeline.name}"
            try:
                _explained(self.declared, pipeline, "cpu")
            except diagnosis.PipelineFailure as failure:
                replayed = [*failure.details, "(found by replaying the failed CUDA step on the CPU)"]
                raise type(failure)(failure.cause, failure.fix, replayed) from (failure.__cause__ or cuda_error)
            raise _user_failure(cuda_error, pipeline, self.stage) from cuda_error


def _explained(stage: Stage, pipeline: Pipeline, device: str) -> StageResult:
    """Run a stage's check: the user's errors become failures in their terms, the plugin's own an internal error."""
    __tracebackhide__ = True
    try:
        return stage.run(pipeline, device)
    except diagnosis.PipelineFailure:
        raise
    except Exception as error:
        raise _user_failure(error, pipeline, stage.name) from error


def _user_failure(error: Exception, pipeline: Pipeline, stage: str) -> Exception:
    """A failure naming the cause, when a part of the user's pipeline raised `error`; else an internal error. (A row
    that finds the error comes of what this machine cannot run as the GPU would skips the item itself.)"""
    part = diagnosis.part_of(error)
    if part is None:
        return diagnosis.InternalError(stage, error)
    from pytest_trainer.explanations import pipeline_rows

    try:
        return pipeline_rows.explain(error, pipeline) or diagnosis.raised_by(error, part)
    except Exception as crash:  # explaining is the plugin's own work
        return diagnosis.InternalError(stage, crash)
