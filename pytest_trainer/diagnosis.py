"""Failures in the user's terms: what is wrong, why it breaks training, and the fix.

Everything the plugin reports is a `TrainerError`: a check's `PipelineFailure` (a `Finding` when training still
runs), a script's `ScriptError`, the plugin's own `InternalError`. `pipeline_part` marks an exception as raised by
a part of the user's pipeline; `explanations.pipeline_rows` turns the known ones into failures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from pytest_trainer.schema import Pictures

#: Set on an exception raised by the user's pipeline (collator, transform, model, loss, optimizer,
#: metrics); any other exception a check raises is a bug of pytest-trainer.
_PIPELINE_PART = "_pytest_trainer_pipeline_part"


class TrainerError(Exception):
    """Everything pytest-trainer reports to a user: the cause in their terms, the fix, and lines shown below them."""

    #: Whether the stages that need the one that failed lose their meaning (no batch, no loss, no gradients).
    blocks = True
    #: Whether this is the library's own error with nothing of pytest-trainer's to explain it (counted in the report).
    unexplained = False

    def __init__(self, cause: str, fix: str, details: Sequence[str] = ()) -> None:
        self.cause, self.fix, self.details = cause, fix, tuple(details)
        #: What the reports draw of the stage that failed (JSON values by name, as `StageResult.pictures`).
        self.pictures: Pictures = {}
        super().__init__(self.render())

    def render(self) -> str:
        lines = [self.cause, f"  fix: {self.fix}", *(f"  {line}" for line in self.details)]
        return "\n".join(lines)


class PipelineFailure(TrainerError):
    """A pipeline problem found by a stage, with its cause and its fix.

    It blocks the stages that need this one: they are skipped rather than fail again on what failed here.
    """


class Finding(PipelineFailure):
    """A defect that spoils training but leaves what this stage makes usable (the batch, the loss, the gradients).

    Unused parameters, a frozen head, a precision risk, a supervision mistake: one process still trains, so the
    stages after this one still run and report their own problems.
    """

    blocks = False


def combined(findings: Sequence[Finding]) -> Finding:
    """One failure for several findings of a stage: the first cause and fix first, the others below it."""
    first, *others = findings
    details = [*first.details]
    for other in others:
        details += [f"also: {other.cause}", f"  fix: {other.fix}", *(f"  {line}" for line in other.details)]
    found = Finding(first.cause, first.fix, details)
    for finding in findings:
        found.pictures.update(finding.pictures)
    return found


def also(failure: TrainerError, findings: Sequence[Finding]) -> TrainerError:
    """One failure that reports `findings` too, so that none is hidden behind it: findings together, a pipeline failure
    with each finding below it; an internal error stays as it is."""
    if not findings or not isinstance(failure, PipelineFailure):
        return failure
    if isinstance(failure, Finding):
        return combined([failure, *findings])
    details = [*failure.details]
    for finding in findings:
        details += [f"also: {finding.cause}", f"  fix: {finding.fix}"]
    made = type(failure)(failure.cause, failure.fix, details)
    made.pictures.update(failure.pictures)
    made.unexplained = failure.unexplained
    return made


def findings_last(checks: Iterable[Callable[[], object]]) -> None:
    """Run every check: a failure that breaks training is raised at once, findings together after the last."""
    found: list[Finding] = []
    for check in checks:
        try:
            check()
        except Finding as finding:
            found.append(finding)
    if found:
        raise combined(found)


class InternalError(TrainerError):
    """An exception in pytest-trainer's own code: a bug of the plugin, never the user's failure."""

    def __init__(self, check: str, error: BaseException) -> None:
        self.check, self.error = check, error
        first = str(error).splitlines()[0] if str(error) else ""
        super().__init__(
            f"internal error of pytest-trainer in the {check} check ({type(error).__name__}: {first})",
            "this is a bug of pytest-trainer, not of your pipeline: please report it with the traceback below",
        )


class ScriptError(TrainerError):
    """The script gave no Trainer; says why, where, and what to do. Every other item of the script is skipped."""

    def __init__(self, script: Path, cause: str, fix: str, where: str | None = None) -> None:
        self.script, self.where = script, where
        #: What the message names: the script's file name, or the command as given (`--trainer-command`).
        self.name = script.name
        super().__init__(cause, fix)

    def render(self) -> str:
        where = f"\n  at {self.where}" if self.where else ""
        return f"{self.name}: {self.cause}{where}\n  fix: {self.fix}"


@contextmanager
def pipeline_part(what: str) -> Iterator[None]:
    """Run a part of the user's pipeline: an exception it raises is the pipeline's, named by `what`."""
    try:
        yield
    except Exception as error:
        if not hasattr(error, _PIPELINE_PART):  # the innermost part names it
            setattr(error, _PIPELINE_PART, what)
        raise


def part_of(error: BaseException) -> str | None:
    """The part of the user's pipeline that raised `error`, or None when the plugin's own code did."""
    return getattr(error, _PIPELINE_PART, None)


def owned_by_pipeline(error: BaseException) -> bool:
    """A failure found in the pipeline, or an exception a part of it raised (not a bug of the plugin)."""
    return isinstance(error, PipelineFailure) or part_of(error) is not None


#: The fix of a library error no explanation row knows, raised while a stage ran a part of the pipeline.
UNEXPLAINED_FIX = (
    "the traceback below shows the call in which {part} raised it; pytest-trainer knows no cause or fix for this "
    "error yet"
)


def raised_by(error: BaseException, part: str) -> PipelineFailure:
    """A library error nothing else explains, with the part of the pipeline that raised it first."""
    message = str(error).strip().splitlines()
    failure = PipelineFailure(
        f"{part} raised {type(error).__name__}: {message[0] if message else '(no message)'}",
        UNEXPLAINED_FIX.format(part=part),
    )
    failure.unexplained = True
    return failure
