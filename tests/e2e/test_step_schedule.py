"""`step`: the learning rate over the whole run, from the Trainer's own scheduler (or the script's), computed over the
run's length, not trained: a warmup longer than the run, a scheduler made for fewer steps than the run trains."""

from __future__ import annotations

import json

import pytest
import transformers
from pipeline_runs import failures, run_script, write

#: A warmup given in steps that still works in both transformers 4 and 5.
SCRIPT = """
    import json
    import tiny
    from datasets import load_dataset
    from transformers import Trainer, TrainingArguments, get_linear_schedule_with_warmup

    tok = tiny.tokenizer()
    data = load_dataset("json", data_files={{"train": "rows.jsonl"}})["train"]
    data = data.map(lambda batch: tok(batch["text"], truncation=True), batched=True, remove_columns=["text"])
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, num_train_epochs={epochs},
                             learning_rate=1e-3, {warmup}report_to="none")
    model = tiny.classifier()
    optimizers = (None, None)
    if {own_schedule!r}:
        optimizer = __import__("torch").optim.AdamW(model.parameters(), lr=1e-3)
        optimizers = (optimizer, get_linear_schedule_with_warmup(optimizer, 0, num_training_steps={own_schedule}))
    trainer = Trainer(model=model, args=args, train_dataset=data, processing_class=tok, optimizers=optimizers)
    trainer.train()
"""
#: A warmup as a share of the run, in the form of the transformers installed.
SHARE = (
    "warmup_ratio=0.1, "
    if "warmup_ratio" in transformers.TrainingArguments.__dataclass_fields__
    else "warmup_steps=0.1, "
)


def project_with(project: pytest.Pytester, rows: int, epochs: int = 1, warmup: str = "", own: int = 0) -> None:
    lines = [{"text": "the cat sat on the mat " * (1 + i % 5), "label": i % 3} for i in range(rows)]
    (project.path / "rows.jsonl").write_text("\n".join(json.dumps(line) for line in lines))
    write(project, "train.py", SCRIPT.format(epochs=epochs, warmup=warmup, own_schedule=own))


def step_item(project: pytest.Pytester) -> dict:
    report = json.loads((project.path / "report.json").read_text())
    return next(item for item in report["items"] if item["stage"] == "step")


def run(project: pytest.Pytester, *args: str) -> pytest.RunResult:
    return run_script(project, "--trainer-stages=step", "--trainer-report=report.json", *args)


def test_a_warmup_longer_than_the_run_fails_step(project: pytest.Pytester) -> None:
    project_with(project, 48, warmup="warmup_steps=500, ")
    result = run(project)
    assert failures(result) == ["step[cpu]"]
    result.stdout.fnmatch_lines(
        ["step[[]cpu[]] failed: the learning rate never reaches its peak 0.001: over the run's 6 optimizer steps *"]
    )


def test_a_warmup_as_a_share_of_the_run_passes(project: pytest.Pytester) -> None:
    project_with(project, 48, warmup=SHARE)
    assert failures(run(project)) == []
    assert "schedule: 6 optimizer steps, peak 0.001, last rate 0.0002" in step_item(project)["notes"]


def test_a_scheduler_made_for_one_epoch_of_three_fails_step(project: pytest.Pytester) -> None:
    project_with(project, 48, epochs=3, own=6)
    result = run(project)
    assert failures(result) == ["step[cpu]"]
    result.stdout.fnmatch_lines(
        ["step[[]cpu[]] failed: the learning rate reaches 0 at step 6 of the run's 18 optimizer steps: the last 12 *"]
    )


def test_a_scheduler_made_for_the_whole_run_passes(project: pytest.Pytester) -> None:
    project_with(project, 48, epochs=3, own=18)
    assert failures(run(project)) == []


def test_a_sampled_split_is_judged_at_its_stored_length(project: pytest.Pytester) -> None:
    # 600 stored rows, 64 kept: 8 steps of the sample would end inside a 50-step warmup, the real run's 75 do not.
    project_with(project, 600, warmup="warmup_steps=50, ")
    assert failures(run(project, "--trainer-sample=64")) == []
    notes = step_item(project)["notes"]
    assert any(
        note.startswith("schedule: 75 optimizer steps (the training split's length estimated from the 600 stored rows")
        for note in notes
    ), notes
    project_with(project, 600, warmup="warmup_steps=500, ")
    assert failures(run(project, "--trainer-sample=64")) == ["step[cpu]"]
