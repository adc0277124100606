"""Every check, declared where it lives with the stages that run it and the subject it reads.

    @checks("collate", reads=BATCH)
    def check_start_token(labels, start, model, token): ...

A check is a function that finds a defect: it raises (or returns) a `diagnosis.Finding` for one that spoils training
or a `diagnosis.PipelineFailure` for one that breaks it, with the cause in the user's terms and the fix. A message that
several checks raise is built by a function beside them declared `@message`. Its private
helpers in the same module are parts of it; a stage's `run` is declared by its `STAGE`. `declared()` lists them all
(docs/checks.md is written from it), and tests/unit/test_catalogue.py fails on a check that is not declared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

F = TypeVar("F", bound=Callable[..., object])

#: The subjects a check reads, and what each one is.
BATCH = "batch"
SPLIT = "split"
MODEL = "model"
TEMPLATE = "template"
RUN = "run"
SETTINGS = "settings"
CHECKPOINT = "checkpoint"
COMPLETIONS = "completions"
PROCESSES = "processes"
SUBJECTS: dict[str, str] = {
    BATCH: "a batch the Trainer's collator made",
    SPLIT: "a split's rows as its dataloader feeds them",
    MODEL: "the model: its config, heads, parameters and input embeddings",
    TEMPLATE: "the tokenizer and chat template against the rows they render",
    RUN: "what a short run does: the loss, the gradients, the optimizer's updates, the learning rate",
    SETTINGS: "the training arguments, the Trainer's settings and callbacks",
    CHECKPOINT: "what the Trainer saves and loads back",
    COMPLETIONS: "the completions an online RL trainer samples, and their rewards",
    PROCESSES: "what several processes do together",
}


@dataclass(frozen=True)
class Check:
    """One declared check."""

    #: `module.function` (or `module.Class.method`) under `pytest_trainer`.
    name: str
    #: The stages that run it.
    stages: tuple[str, ...]
    #: What it reads (a key of SUBJECTS).
    reads: str
    #: The first sentence of its docstring.
    summary: str


_DECLARED: dict[str, Check] = {}


def checks(*stages: str, reads: str) -> Callable[[F], F]:
    """Declare the decorated function a check run by `stages`, reading `reads`."""
    if not stages or reads not in SUBJECTS:
        raise ValueError(f"a check is declared with at least one stage and a subject of {sorted(SUBJECTS)}")

    def declare(function: F) -> F:
        module = getattr(function, "__module__", "").removeprefix("pytest_trainer.")
        name = f"{module}.{getattr(function, '__qualname__', '')}"
        doc = (getattr(function, "__doc__", None) or "").strip()
        summary = " ".join(doc.split("\n\n")[0].split())
        _DECLARED[name] = Check(name, tuple(stages), reads, summary)
        return function

    return declare


def message(function: F) -> F:
    """Declare the decorated function a message builder: it words the failure the checks beside it raise, from the
    facts they found (a row, a count, a width), and reads no subject itself, so it is no check."""
    return function


def declared() -> list[Check]:
    """Every check of the modules imported so far, by stage order of their first stage, then name."""
    return sorted(_DECLARED.values(), key=lambda check: check.name)
