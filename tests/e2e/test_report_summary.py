"""The pipeline summary, the JSON and Markdown reports, and regression baselines."""

from __future__ import annotations

import json
from xml.etree import ElementTree

import pytest
from pipeline_runs import GOOD_SCRIPT, failures, outcomes, write

from pytest_trainer import devices

#: The smallest correct script, evaluated on rows it does not train on (its training split evaluated is shown).
HELD_OUT_SCRIPT = GOOD_SCRIPT.replace(
    "eval_dataset=data", "eval_dataset=tiny.tokenized(tiny.text_dataset(seed=1), tok)"
)


def test_summary_is_one_line_when_everything_passed(project: pytest.Pytester) -> None:
    write(project, "train.py", HELD_OUT_SCRIPT)
    result = project.runpytest("--trainer-module=train.py", "--trainer-stages=dataset,collate", "--trainer-devices=cpu")
    section = result.outlines[
        result.outlines.index(next(line for line in result.outlines if "pytest-trainer: train.py" in line)) :
    ]
    assert section[1] == "all 3 items that ran passed"  # load, dataset, collate
    assert section[2].startswith("=") and " 3 passed in " in section[2]


@pytest.mark.skipif(devices.unavailable_reason("cuda") is None, reason="this machine has CUDA: the cuda items run")
def test_items_of_a_device_this_machine_lacks_are_one_line(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)
    result = project.runpytest("--trainer-module=train.py", "--trainer-stages=dataset,collate")
    result.assert_outcomes(passed=3, skipped=2)  # pytest still counts them: they are items the plan has
    result.stdout.fnmatch_lines(
        [
            "*pytest-trainer: train.py*",
            "all 3 items that ran passed",
            "  cuda: 2 items not run: CUDA is not available on this machine (torch *)",
        ]
    )
    assert sum("CUDA is not available" in line for line in result.outlines) == 1


def test_each_diagnosis_is_printed_once_and_what_it_blocks_is_one_line(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT.replace("tiny.classifier()", "tiny.classifier(num_labels=2)"))
    result = project.runpytest(
        "--trainer-module=train.py", "--trainer-stages=dataset,collate,forward,labels", "--trainer-devices=cpu", "-vv"
    )
    cause = "labels range 0..2 (3 classes) but the model has 2 outputs (row 2 of the training dataset has label 2)"
    result.stdout.fnmatch_lines(
        [
            f"dataset[[]cpu[]] failed: {cause}",  # the item's own report: cause, fix, what the library said
            "  fix: pass num_labels=3 when building the model, e.g. BertConfig(..., num_labels=3)",
            "*pytest-trainer: train.py*",
            "  stage    cpu",
            "  load     passed",
            "  dataset  FAILED",
            "  cpu: 3 items not run, blocked by dataset[[]cpu[]]: collate, forward, labels",
            "*short test summary info*",
            f"FAILED train.py::dataset[[]cpu[]] - {cause}",  # one line, whole with -vv, as on CI
            "*1 failed, 1 passed, 3 skipped*",
        ]
    )
    assert sum(cause in line for line in result.outlines) == 2
    assert sum("fix: pass num_labels=3" in line for line in result.outlines) == 1


@pytest.mark.parametrize("color", ["yes", "no"])
def test_the_summary_is_coloured_as_pytest_is(project: pytest.Pytester, color: str) -> None:
    write(project, "train.py", GOOD_SCRIPT.replace("tiny.classifier()", "tiny.classifier(num_labels=2)"))
    result = project.runpytest(
        "--trainer-module=train.py", "--trainer-stages=dataset,forward", "--trainer-devices=cpu", f"--color={color}"
    )
    section = "\n".join(
        result.outlines[
            next(index for index, line in enumerate(result.outlines) if "pytest-trainer: train.py" in line) :
        ]
    )
    red, green = "\x1b[31m", "\x1b[32m"
    if color == "yes":
        assert f"{red}\x1b[1mFAILED" in section and f"{green}passed" in section, section
    else:
        assert "\x1b[" not in section, section


def test_json_report_junit_and_github_step_summary(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    write(project, "train.py", GOOD_SCRIPT.replace("tiny.classifier()", "tiny.classifier(num_labels=2)"))
    write(project, "good.py", GOOD_SCRIPT)
    summary = project.path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    project.runpytest(
        "--trainer-module=train.py",
        "--trainer-module=good.py",
        "--trainer-devices=cpu",
        "--trainer-stages=dataset,forward,backward,overfit",
        "--trainer-report=out/report.json",
        "--junitxml=out/junit.xml",
    )
    items = {
        (item["script"], item["stage"]): item
        for item in json.loads((project.path / "out/report.json").read_text())["items"]
    }
    failed = items[("train.py", "dataset")]
    assert failed["outcome"] == "failed"
    assert failed["diagnosis"].startswith("labels range 0..2 (3 classes) but the model has 2 outputs")
    assert failed["fix"].startswith("pass num_labels=3")
    blocked = items[("train.py", "forward")]
    assert blocked["reason"] == "blocked by dataset[cpu]" and blocked["blocked"] and not blocked["unavailable"]
    good = items[("good.py", "backward")]
    assert good["outcome"] == "passed" and good["device"] == "cpu" and good["duration"] > 0
    assert good["figures"]["trainable_parameters"] > 1000 and good["figures"]["gradient_norm"] > 0
    assert items[("good.py", "forward")]["figures"]["loss_at_init"] == pytest.approx(1.1, abs=0.1)
    assert (
        items[("good.py", "overfit")]["figures"]["loss_after"] < items[("good.py", "overfit")]["figures"]["loss_before"]
    )
    assert items[("good.py", "dataset")]["figures"]["rows_training"] == 48

    # junit: each item's facts are one JSON property a dashboard can read
    cases = ElementTree.parse(project.path / "out/junit.xml").getroot().iter("testcase")
    facts = {
        case.get("name"): json.loads(prop.get("value"))
        for case in cases
        for prop in case.iter("property")
        if prop.get("name") == "pytest_trainer" and case.get("classname") == "good"
    }
    assert facts["backward[cpu]"]["figures"]["gradient_norm"] == pytest.approx(good["figures"]["gradient_norm"])
    assert facts["overfit[cpu]"]["stage"] == "overfit" and facts["overfit[cpu]"]["device"] == "cpu"

    markdown = summary.read_text()
    assert "### pytest-trainer: `train.py`" in markdown
    assert "| dataset | **FAILED** |" in markdown
    assert "cpu: 3 items not run, blocked by dataset[cpu]: forward, backward, overfit" in markdown
    assert "| backward | passed |" in markdown
    data = [json.loads(block.split("```", 1)[0]) for block in markdown.split("```json\n")[1:]]
    assert [{item["script"] for item in block} for block in data] == [{"train.py"}, {"good.py"}]
    assert {item["stage"]: item["outcome"] for item in data[1]} == {
        "load": "passed",
        "dataset": "passed",
        "forward": "passed",
        "backward": "passed",
        "overfit": "passed",
    }


BASELINE = (
    "--trainer-module=train.py",
    "--trainer-devices=cpu",
    "--trainer-stages=baseline",
    "--trainer-baseline=baselines",
    "-v",
)


def test_baseline_round_trip(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)
    recorded = project.runpytest(*BASELINE)
    assert outcomes(recorded) == {"baseline[cpu]": "PASSED"}
    recorded.stdout.fnmatch_lines(
        ["baseline: recorded 8 figures to */baselines/train.txt: commit it, so that later runs compare against it"]
    )
    recorded.stdout.fnmatch_lines(["  baseline[[]cpu[]] took *.* s (opt-in: --trainer-baseline)"])  # its own cost
    text = (project.path / "baselines/train.txt").read_text()
    names = [line.split(":")[0] for line in text.splitlines() if not line.startswith("#")]
    assert names == [
        "parameters",
        "trainable_parameters",
        "output_shape",
        "learning_rate",
        "loss_at_init",
        "gradient_norm_at_init",
        "overfit_steps",
        "loss_after_overfit",
    ]
    assert "output_shape: 8x3" in text and "learning_rate: 5e-05" in text

    assert failures(project.runpytest(*BASELINE)) == []  # deterministic: the same figures again

    write(project, "train.py", GOOD_SCRIPT.replace('report_to="none"', 'report_to="none", learning_rate=5e-4'))
    moved = project.runpytest(*BASELINE)
    assert failures(moved) == ["baseline[cpu]"]
    moved.stdout.fnmatch_lines(
        [
            "baseline[[]cpu[]] failed: the pipeline's figures moved from the baseline *train.txt:",
            "    learning_rate: 5e-05 -> 0.0005",
            "    overfit_steps: * -> *",
            "*fix: *--trainer-baseline-update*",
        ]
    )
    assert (project.path / "baselines/train.txt").read_text() == text  # a failing run never rewrites

    project.runpytest(*BASELINE, "--trainer-baseline-update")
    assert "learning_rate: 0.0005" in (project.path / "baselines/train.txt").read_text()
    assert failures(project.runpytest(*BASELINE)) == []


@pytest.mark.parametrize("asked", ["--trainer-baseline-strict", "ini"])
def test_a_strict_baseline_that_is_missing_fails_instead_of_being_recorded(
    project: pytest.Pytester, asked: str
) -> None:
    write(project, "train.py", GOOD_SCRIPT)
    if asked == "ini":
        project.makeini("[pytest]\ntrainer_baseline_strict = true\n")
    strict = project.runpytest(*BASELINE, *([asked] if asked != "ini" else []))
    assert failures(strict) == ["baseline[cpu]"]
    strict.stdout.fnmatch_lines(
        [
            "baseline[[]cpu[]] failed: no baseline of train.py at */baselines/train.txt, and --trainer-baseline-strict "
            "(trainer_baseline_strict) asks for one*",
            "  fix: record it where the change is reviewed: run once without --trainer-baseline-strict (or with "
            "--trainer-baseline-update) and commit train.txt in */baselines",
        ]
    )
    assert not (project.path / "baselines").exists()
    project.runpytest(*BASELINE, "--trainer-baseline-update")  # recorded on purpose
    assert failures(project.runpytest(*BASELINE, *([asked] if asked != "ini" else []))) == []


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
    result = project.runpytest(
        "--trainer-module=train.py",
        "--trainer-module=labels.py",
        "--trainer-devices=cpu",
        "--trainer-stages=collate,forward",
        "--trainer-report=out/report.json",
    )
    result.stdout.fnmatch_lines(
        [
            "collate[[]cpu[]] failed: the training dataloader (its dataset and data_collator) raised RuntimeError: my "
            "collator is broken",
            "*pytest-trainer: train.py*",
            "1 failure shown with the library's own error only (not yet explained by pytest-trainer): collate[[]cpu[]]",
        ]
    )
    report = json.loads((project.path / "out/report.json").read_text())
    assert report["unexplained"] == {"count": 1, "items": ["train.py::collate[cpu]"]}
    items = {(item["script"], item["stage"]): item for item in report["items"]}
    assert items[("train.py", "collate")]["unexplained"] is True
    assert items[("labels.py", "forward")]["outcome"] == "failed"
    assert items[("labels.py", "forward")]["unexplained"] is False  # explained: labels beyond the head
