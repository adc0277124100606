"""The bundled examples behave as their READMEs say, offline, as a new user would run them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pipeline_runs import ITEMS, failures, outcomes

from pytest_trainer import devices

EXAMPLES = Path(__file__).resolve().parents[2] / "conftest_examples"
#: Where CUDA is missing the cuda items skip; on a GPU machine they run.
CUDA_MISSING = devices.unavailable_reason("cuda") is not None
#: Without a GPU the memory forecast has no budget, and the default suite skips it (no --trainer-gpu-memory here).
NO_BUDGET = {"memory[cpu]"} if CUDA_MISSING else set()


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.mark.slow  # the pretrained MiniLM
@pytest.mark.usefixtures("offline")
def test_mnli_example_on_pretrained_minilm(pytester: pytest.Pytester) -> None:
    shutil.copytree(EXAMPLES / "mnli", pytester.path / "mnli")
    scripts = ["train", "train_raw_dataset", "train_no_padding", "train_two_labels"]
    result = pytester.runpytest(*(f"--trainer-module=mnli/{name}.py" for name in scripts), "-v", "-rs")
    fixed = outcomes(result, "train.py")
    assert {item for item, outcome in fixed.items() if outcome == "PASSED" and item.endswith("[cpu]")} == {
        f"{stage}[cpu]"
        for stage in ITEMS
        if stage != "targets"  # targets audits causal LMs only
    } - NO_BUDGET
    on = ["cpu"] if CUDA_MISSING else ["cpu", "cuda"]
    assert failures(result, "train_raw_dataset.py") == [f"dataset[{device}]" for device in on]
    assert failures(result, "train_no_padding.py") == [f"collate[{device}]" for device in on]
    assert failures(result, "train_two_labels.py") == [f"dataset[{device}]" for device in on]
    result.stdout.fnmatch_lines_random(
        [
            "dataset[[]cpu[]] failed: the training dataset has text columns 'premise', 'hypothesis' but no 'input_ids'*",
            "collate[[]cpu[]] failed: samples of different lengths (input_ids lengths of the first rows: *) reach a collator that does not pad*",
            "dataset[[]cpu[]] failed: labels range 0..2 (3 classes) but the model has 2 outputs*",
            "*fix: pass num_labels=3 when building the model, e.g. AutoModelForSequenceClassification.from_pretrained(..., "
            "num_labels=3)",  # a pretrained model: the fix keeps from_pretrained
            "*SKIPPED*CUDA is not available on this machine*" if CUDA_MISSING else "*SKIPPED*save[[]cpu[]] covers it*",
        ]
    )
    assert not (pytester.path / "mnli-minilm").exists()


@pytest.mark.slow  # the pretrained MiniLM
@pytest.mark.usefixtures("offline")
def test_advice_on_the_learning_rate_of_a_pretrained_model_is_a_fine_tuning_rate(pytester: pytest.Pytester) -> None:
    shutil.copytree(EXAMPLES / "mnli", pytester.path / "mnli")
    script = pytester.path / "mnli/train.py"
    script.write_text(script.read_text().replace("learning_rate=2e-5", "learning_rate=0.0"))
    result = pytester.runpytest("--trainer-module=mnli/train.py", "--trainer-stages=step", "--trainer-devices=cpu")
    result.assert_outcomes(passed=1, failed=1)  # load passed
    result.stdout.fnmatch_lines(
        [
            "step[[]cpu[]] failed: the learning rate is 0*",
            "  fix: set learning_rate in TrainingArguments (or in the config a framework builds "
            "them from): fine-tuning a pretrained model usually "
            "takes 1e-5 to 5e-5 (1e-4 to 2e-4 for LoRA adapters)",
        ]
    )


def test_marker_example(pytester: pytest.Pytester) -> None:
    shutil.copytree(EXAMPLES / "marker", pytester.path / "marker")
    result = pytester.runpytest("marker", "--strict-markers")
    if CUDA_MISSING:
        result.assert_outcomes(passed=13, skipped=17)  # targets audits causal LMs only, memory has no GPU: they skip
    else:  # the cuda items run too; save and targets read what the cpu items did
        result.assert_outcomes(passed=27, skipped=3)


TASKS = ["regression", "causal_lm", "masked_lm", "token_classification", "custom_trainer", "sft_lora"]
#: Examples of causal LMs, whose supervision `targets` audits; it skips for the others.
CAUSAL = ("causal_lm", "sft_lora")


@pytest.mark.usefixtures("offline")
def test_every_task_example_passes_its_suite(pytester: pytest.Pytester) -> None:
    for task in TASKS:
        shutil.copytree(EXAMPLES / task, pytester.path / task)
    result = pytester.runpytest(
        *(f"--trainer-module={task}/train.py" for task in TASKS), "--trainer-devices=cpu", "-v", "-rs"
    )
    for task in TASKS:
        statuses = _outcomes_of(result, f"{task}/train.py")
        skipped = {item: status for item, status in statuses.items() if status != "PASSED"}
        idle = dict.fromkeys(NO_BUDGET, "SKIPPED")
        if task in CAUSAL:
            assert skipped == {"labels[cpu]": "SKIPPED", **idle}, (task, statuses)  # an LM's labels are token ids
        else:
            assert skipped in (
                {"targets[cpu]": "SKIPPED", **idle},
                {"targets[cpu]": "SKIPPED", "labels[cpu]": "SKIPPED", **idle},
            ), (task, statuses)
        assert len(statuses) == len(ITEMS) + 1  # and load
    warned = result.stdout.str().partition("warnings summary")[2].partition("-- Docs")[0]
    assert "pytest_trainer" not in warned and "return_outputs=True" not in warned, warned  # none the plugin causes


#: The examples of other kinds of pipeline, and the items their task skips: neither is a causal LM (`targets`);
#: seq2seq labels are decoder token ids, not classes (`labels`); images have no token length (`lengths`, `padding`).
OTHER_KINDS = {"seq2seq": {"targets[cpu]", "labels[cpu]"}, "vision": {"targets[cpu]", "lengths[cpu]", "padding[cpu]"}}


@pytest.mark.usefixtures("offline")
def test_seq2seq_and_vision_examples_pass_their_suites(pytester: pytest.Pytester) -> None:
    for name in OTHER_KINDS:
        shutil.copytree(EXAMPLES / name, pytester.path / name)
    result = pytester.runpytest(
        *(f"--trainer-module={name}/train.py" for name in OTHER_KINDS), "--trainer-devices=cpu", "-v", "-rs"
    )
    for name, skips in OTHER_KINDS.items():
        statuses = _outcomes_of(result, f"{name}/train.py")
        assert {item for item, status in statuses.items() if status != "PASSED"} == skips | NO_BUDGET, (name, statuses)
        assert {statuses[item] for item in skips | NO_BUDGET} == {"SKIPPED"}
        assert len(statuses) == len(ITEMS) + 1  # and load
    warned = result.stdout.str().partition("warnings summary")[2].partition("-- Docs")[0]
    assert "pytest_trainer" not in warned and "return_outputs=True" not in warned, warned  # none the plugin causes
    assert sorted(path.name for path in pytester.path.iterdir() if not path.name.startswith(".")) == sorted(
        OTHER_KINDS
    )  # the scripts' output_dir went to the plugin's temporary folder


def _outcomes_of(result: pytest.RunResult, script: str) -> dict[str, str]:
    prefix = f"{script}::"
    found = {}
    for line in result.outlines:
        if line.startswith(prefix) and " " in line:
            item, outcome = line[len(prefix) :].split()[:2]
            found[item] = outcome
    return found


@pytest.mark.usefixtures("offline")
def test_grpo_example_passes_every_item_that_checks_online_rl(pytester: pytest.Pytester) -> None:
    shutil.copytree(EXAMPLES / "grpo", pytester.path / "grpo")
    result = pytester.runpytest("--trainer-module=grpo/train.py", "--trainer-devices=cpu", "-v", "-rs")
    passed = {item for item, outcome in outcomes(result).items() if outcome == "PASSED"}
    assert failures(result) == [], result.stdout.str()[-4000:]
    assert passed == {
        f"{stage}[cpu]"
        for stage in ("dataset", "collate", "targets", "forward", "backward", "step", "overfit", "precision")
    }
    assert not (pytester.path / "grpo-tiny-llama").exists()
