"""The pipeline summary, the JSON and Markdown reports, and regression baselines."""

from __future__ import annotations

import json

import pytest
from conftest import GOOD_SCRIPT, failures, outcomes, write


def test_summary_is_one_line_when_everything_passed(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)
    result = project.runpytest("--trainer-module=train.py", "--trainer-stages=dataset,collate")
    result.stdout.fnmatch_lines([
        "*pytest-trainer: train.py*",
        "all 3 items that ran passed, 2 skipped (CUDA is not available on this machine*)",  # load, dataset, collate
    ])


def test_summary_table_names_each_failure_with_its_fix(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT.replace("tiny.classifier()", "tiny.classifier(num_labels=2)"))
    result = project.runpytest("--trainer-module=train.py", "--trainer-stages=dataset,collate,forward")
    result.stdout.fnmatch_lines([
        "*pytest-trainer: train.py*",
        "  stage    cpu          cuda",
        "  dataset  FAILED       skipped [[]1[]]",
        "  collate  skipped [[]2[]]  skipped [[]1[]]",
        "  forward  skipped [[]2[]]  skipped [[]1[]]",
        "  [[]1[]] CUDA is not available on this machine*",
        "  [[]2[]] blocked by dataset[[]cpu[]]",
        "FAILED dataset[[]cpu[]]: labels range 0..2 (3 classes) but the model has 2 outputs*",
        "  fix: pass num_labels=3 when building the model*",
    ])


def test_json_report_and_github_step_summary(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    write(project, "train.py", GOOD_SCRIPT.replace("tiny.classifier()", "tiny.classifier(num_labels=2)"))
    write(project, "good.py", GOOD_SCRIPT)
    summary = project.path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    project.runpytest("--trainer-module=train.py", "--trainer-module=good.py", "--trainer-devices=cpu",
                      "--trainer-stages=dataset,forward,backward,overfit", "--trainer-report=out/report.json")
    items = {(item["script"], item["stage"]): item for item in json.loads((project.path / "out/report.json").read_text())["items"]}
    failed = items[("train.py", "dataset")]
    assert failed["outcome"] == "failed"
    assert failed["diagnosis"].startswith("labels range 0..2 (3 classes) but the model has 2 outputs")
    assert failed["fix"].startswith("pass num_labels=3")
    assert items[("train.py", "forward")]["reason"] == "blocked by dataset[cpu]"
    good = items[("good.py", "backward")]
    assert good["outcome"] == "passed" and good["device"] == "cpu" and good["duration"] > 0
    assert good["figures"]["trainable_parameters"] > 1000 and good["figures"]["gradient_norm"] > 0
    assert items[("good.py", "forward")]["figures"]["loss_at_init"] == pytest.approx(1.1, abs=0.1)
    assert items[("good.py", "overfit")]["figures"]["loss_after"] < items[("good.py", "overfit")]["figures"]["loss_before"]
    assert items[("good.py", "dataset")]["figures"]["rows_training"] == 48
    markdown = summary.read_text()
    assert "### pytest-trainer: `train.py`" in markdown
    assert "| dataset | **FAILED** |" in markdown
    assert "| forward | skipped: blocked by dataset[cpu] |" in markdown
    assert "| backward | passed |" in markdown


BASELINE = ("--trainer-module=train.py", "--trainer-devices=cpu", "--trainer-stages=baseline",
            "--trainer-baseline=baselines", "-v")


def test_baseline_round_trip(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)
    recorded = project.runpytest(*BASELINE)
    assert outcomes(recorded) == {"baseline[cpu]": "PASSED"}
    text = (project.path / "baselines/train.txt").read_text()
    names = [line.split(":")[0] for line in text.splitlines() if not line.startswith("#")]
    assert names == ["parameters", "trainable_parameters", "output_shape", "learning_rate", "loss_at_init",
                     "gradient_norm_at_init", "overfit_steps", "loss_after_overfit"]
    assert "output_shape: 8x3" in text and "learning_rate: 5e-05" in text

    assert failures(project.runpytest(*BASELINE)) == []  # deterministic: the same figures again

    write(project, "train.py", GOOD_SCRIPT.replace('report_to="none"', 'report_to="none", learning_rate=5e-4'))
    moved = project.runpytest(*BASELINE)
    assert failures(moved) == ["baseline[cpu]"]
    moved.stdout.fnmatch_lines([
        "baseline[[]cpu[]] failed: the pipeline's figures moved from the baseline *train.txt:",
        "    learning_rate: 5e-05 -> 0.0005",
        "    overfit_steps: * -> *",
        "*fix: *--trainer-baseline-update*",
    ])
    assert (project.path / "baselines/train.txt").read_text() == text  # a failing run never rewrites

    project.runpytest(*BASELINE, "--trainer-baseline-update")
    assert "learning_rate: 0.0005" in (project.path / "baselines/train.txt").read_text()
    assert failures(project.runpytest(*BASELINE)) == []


def test_baseline_runs_only_when_asked(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)
    result = project.runpytest("--trainer-module=train.py", "--collect-only", "-q")
    assert not any("::baseline[" in line for line in result.outlines)
    assert any("::overfit[cpu]" in line for line in result.outlines)


BROKEN_COLLATOR = GOOD_SCRIPT.replace(
    "processing_class=tok)",
    "processing_class=tok,\n                  data_collator=lambda rows: (_ for _ in ()).throw(RuntimeError('my collator is broken')))",
)


def test_failures_nobody_explained_yet_are_counted(project: pytest.Pytester) -> None:
    write(project, "train.py", BROKEN_COLLATOR)
    write(project, "labels.py", GOOD_SCRIPT.replace("tiny.classifier()", "tiny.classifier(num_labels=2)"))
    result = project.runpytest("--trainer-module=train.py", "--trainer-module=labels.py", "--trainer-devices=cpu",
                               "--trainer-stages=collate,forward", "--trainer-report=out/report.json")
    result.stdout.fnmatch_lines([
        "*pytest-trainer: train.py*",
        "FAILED collate[[]cpu[]]: the training dataloader (its dataset and data_collator) raised RuntimeError: my "
        "collator is broken",
        "1 failure shown with the library's own error only (not yet explained by pytest-trainer): collate[[]cpu[]]",
    ])
    report = json.loads((project.path / "out/report.json").read_text())
    assert report["unexplained"] == {"count": 1, "items": ["train.py::collate[cpu]"]}
    items = {(item["script"], item["stage"]): item for item in report["items"]}
    assert items[("train.py", "collate")]["unexplained"] is True
    assert items[("labels.py", "forward")]["outcome"] == "failed"
    assert items[("labels.py", "forward")]["unexplained"] is False  # explained: labels beyond the head
