"""A trainer family and a stage added by another package, through the public entry points (`extensions`).

The package is written beside the script with the dist-info folder pip writes for it, and pytest runs in a process of
its own, where the installed packages are read afresh."""

from __future__ import annotations

import pytest
from pipeline_runs import write

#: A library's Trainer, and what it tells pytest-trainer: its family and a stage of its own.
PACKAGE = '''
"""acmetrain: a Trainer that smooths its labels, and how pytest-trainer tests it."""
import torch
from transformers import Trainer

from pytest_trainer import Family, Finding, Stage, StageResult


class AcmeTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = torch.nn.functional.cross_entropy(outputs.logits, labels, label_smoothing=0.1)
        return (loss, outputs) if return_outputs else loss


class AcmeFamily(Family):
    trainers = ("AcmeTrainer",)
    name = "AcmeTrainer"

    def not_covered(self, stage):
        if stage == "save":
            return "AcmeTrainer writes its checkpoints with acme.save, which this family does not check yet"
        return None


def check_no_empty_rows(pipeline, device):
    batch = pipeline.batches.first()
    empty = [index for index, row in enumerate(batch["attention_mask"].tolist()) if sum(row) <= 2]
    if empty:
        raise Finding(f"rows {empty} of the first batch hold no text", "drop empty texts before tokenizing")
    return StageResult("acme_rows", device)


STAGE = Stage("acme_rows", rank=25, run=check_no_empty_rows, needs=("collate",), same_on_every_device="it reads data")
'''

#: The same names without the library behind them, for the refusals, which come before any script runs: a Trainer named
#: where a family is wanted, a check function where a stage is, and a stage that would run before what it needs.
REFUSED = '''
"""acmetrain as its entry points name it, without the library behind them (nothing here trains)."""
from pytest_trainer import Stage, StageResult


class AcmeTrainer:
    """A Trainer of the library's own."""


def check_no_empty_rows(pipeline, device):
    return StageResult("acme_rows", device)


STAGE = Stage("acme_rows", rank=5, run=check_no_empty_rows, needs=("collate",), same_on_every_device="it reads data")
'''

SCRIPT = """
    import tiny
    from acmetrain import AcmeTrainer
    from transformers import TrainingArguments

    tok = tiny.tokenizer()
    raw = tiny.text_dataset()
    raw = raw.map(lambda row, index: {{"text": {text}}}, with_indices=True)
    data = tiny.tokenized(raw, tok)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
    trainer = AcmeTrainer(model=tiny.classifier(), args=args, train_dataset=data, processing_class=tok)
    trainer.train()
"""
TEXT = 'row["text"]'
EMPTY = '"" if index % 5 == 0 else row["text"]'


def install(project: pytest.Pytester, entry_points: str, package: str = PACKAGE) -> None:
    """The package `acmetrain` as pip installs it: the module, and a dist-info folder naming its entry points."""
    (project.path / "acmetrain.py").write_text(package)
    info = project.path / "acmetrain-0.1.dist-info"
    info.mkdir()
    info.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: acmetrain\nVersion: 0.1\n")
    info.joinpath("entry_points.txt").write_text(entry_points)


ENTRY_POINTS = """
[pytest_trainer.families]
acme = acmetrain:AcmeFamily

[pytest_trainer.stages]
acme_rows = acmetrain:STAGE
"""


def run(project: pytest.Pytester, *args: str) -> pytest.RunResult:
    return project.runpytest_subprocess("--trainer-module=train.py", "--trainer-devices=cpu", "-v", "-rs", *args)


def test_a_family_and_a_stage_of_another_package_run_in_the_pipeline(project: pytest.Pytester) -> None:
    install(project, ENTRY_POINTS)
    write(project, "train.py", SCRIPT.format(text=TEXT))
    result = run(project, "--trainer-stages=collate,acme_rows,forward,backward,save")
    result.stdout.fnmatch_lines(
        [
            "*train.py::collate[[]cpu[]] PASSED*",
            "*train.py::acme_rows[[]cpu[]] PASSED*",
            "*train.py::forward[[]cpu[]] PASSED*",
            "*train.py::backward[[]cpu[]] PASSED*",
            "*train.py::save[[]cpu[]] SKIPPED*",
        ]
    )
    result.stdout.fnmatch_lines(["SKIPPED*AcmeTrainer writes its checkpoints with acme.save*"])
    assert result.ret == 0


def test_the_added_stage_fails_with_its_finding(project: pytest.Pytester) -> None:
    install(project, ENTRY_POINTS)
    write(project, "train.py", SCRIPT.format(text=EMPTY))
    result = run(project, "--trainer-stages=collate,acme_rows,forward")
    result.stdout.fnmatch_lines(
        ["*train.py::acme_rows[[]cpu[]] FAILED*", "acme_rows[[]cpu[]] failed: rows * of the first batch hold no text"]
    )
    assert result.ret == 1


@pytest.mark.parametrize(
    ("entry_points", "why"),
    [
        ("[pytest_trainer.families]\nacme = acmetrain_gone:AcmeFamily\n", "loading it raised ModuleNotFoundError*"),
        ("[pytest_trainer.families]\nacme = acmetrain:AcmeTrainer\n", "it is <class 'acmetrain.AcmeTrainer'>, not a*"),
        ("[pytest_trainer.stages]\nacme_rows = acmetrain:check_no_empty_rows\n", "it is <function *, not a*"),
    ],
    ids=["missing-module", "not-a-family", "not-a-stage"],
)
def test_what_cannot_be_taken_stops_the_run_naming_the_package(
    project: pytest.Pytester, entry_points: str, why: str
) -> None:
    install(project, entry_points, REFUSED)
    write(project, "train.py", SCRIPT.format(text=TEXT))
    result = run(project)
    result.stderr.fnmatch_lines([f"ERROR: the package acmetrain declares acme* in the entry-point group *, and {why}"])
    result.stderr.fnmatch_lines(["*Fix or update that package, or uninstall it*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_a_stage_that_cannot_follow_what_it_needs_is_refused(project: pytest.Pytester) -> None:
    install(project, "[pytest_trainer.stages]\nacme_rows = acmetrain:STAGE\n", REFUSED)
    write(project, "train.py", SCRIPT.format(text=TEXT))
    result = run(project)
    result.stderr.fnmatch_lines(
        [
            "ERROR: *acme_rows = 'acmetrain:STAGE'*and its needs [[]'collate'] are not stages of a lower rank than its own (5)*"
        ]
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
