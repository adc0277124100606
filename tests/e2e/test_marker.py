"""The trainer_pipeline marker in a repository's own tests, with a `trainer` fixture or a script."""

from __future__ import annotations

import re

import pytest
from pipeline_runs import GOOD_SCRIPT, write

from pytest_trainer import devices

CONFTEST = """
    import pytest
    import tiny
    from transformers import Trainer, TrainingArguments

    @pytest.fixture(scope="session")
    def trainer(tmp_path_factory):
        tok = tiny.tokenizer()
        args = TrainingArguments(output_dir=str(tmp_path_factory.mktemp("out")), per_device_train_batch_size=8,
                                 learning_rate={lr})
        return Trainer(model=tiny.classifier(), args=args, processing_class=tok,
                       train_dataset=tiny.tokenized(tiny.text_dataset(), tok))
"""

TESTS = """
    import pytest
    import torch

    @pytest.mark.trainer_pipeline(stages=["forward", "backward", "step"])
    def test_pipeline(trainer_stage, trainer, pipeline_device, train_batch):
        before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
        result = trainer_stage.run()
        assert result.device == pipeline_device
        assert train_batch["input_ids"].shape[0] == 8
        if trainer_stage.stage == "forward":
            assert result.outputs.logits.shape == (8, 3)
        if trainer_stage.stage == "backward":
            assert set(result.gradients) == {n for n, p in trainer.model.named_parameters() if p.requires_grad}
        after = dict(trainer.model.named_parameters())
        assert all(torch.equal(before[name], after[name]) for name in before), "a stage leaked weights"
"""


def test_marker_with_conftest_trainer(project: pytest.Pytester) -> None:
    write(project, "conftest.py", CONFTEST.replace("{lr}", "1e-3"))
    write(project, "test_pipeline.py", TESTS)
    result = project.runpytest("-v", "--strict-markers", "-rs")
    cpu = [
        "test_pipeline.py::test_pipeline[[]forward-cpu[]] PASSED*",
        "test_pipeline.py::test_pipeline[[]backward-cpu[]] PASSED*",
        "test_pipeline.py::test_pipeline[[]step-cpu[]] PASSED*",
    ]
    if devices.unavailable_reason("cuda") is not None:
        result.assert_outcomes(passed=3, skipped=3)
        result.stdout.fnmatch_lines([*cpu, "*SKIPPED*CUDA is not available*"])
    else:  # the Trainer put the model on the GPU: after each stage the test finds it there again
        result.assert_outcomes(passed=6)
        result.stdout.fnmatch_lines([*cpu, "test_pipeline.py::test_pipeline[[]forward-cuda[]] PASSED*"])


def test_a_stage_that_does_not_apply_is_skipped_at_the_marked_test(project: pytest.Pytester) -> None:
    """The skip names the marked test's file and line, not a file of the plugin."""
    write(project, "conftest.py", CONFTEST.replace("{lr}", "1e-3"))
    write(
        project,
        "test_pipeline.py",
        """
        import pytest

        @pytest.mark.trainer_pipeline(stages=["targets"], devices=["cpu"])
        def test_pipeline(trainer_stage):
            trainer_stage.run()
    """,
    )
    result = project.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_pipeline.py:*: text classification: no causal-LM supervision*"])


def test_marker_failure_blocks_later_stages_of_that_test(project: pytest.Pytester) -> None:
    write(
        project,
        "conftest.py",
        CONFTEST.replace("{lr}", "0.0").replace("tiny.classifier()", "tiny.classifier(num_labels=2)"),
    )
    write(project, "test_pipeline.py", TESTS)
    result = project.runpytest("-rs", "--trainer-devices=cpu")
    result.assert_outcomes(failed=1, skipped=2)
    result.stdout.fnmatch_lines(
        [
            "forward[[]cpu[]] failed: labels range 0..2 (3 classes) but the model has 2 outputs*",
            "  fix: pass num_labels=3 when building the model*",
            "*SKIPPED*blocked by forward[[]cpu[]]*",
        ]
    )
    result.stdout.no_fnmatch_line("*pytest_trainer/*.py*")  # told as a pipeline item's failure, not the plugin's frames


#: A marked test of the script train.py on the CPU, its stages= filled in.
MARKED = """
    import pytest

    @pytest.mark.trainer_pipeline(module="train.py", devices=["cpu"]{stages})
    def test_pipeline(trainer_stage):
        trainer_stage.run()
"""


def test_marker_with_module_runs_the_script(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)
    write(project, "test_pipeline.py", MARKED.format(stages=""))
    result = project.runpytest("-v")
    result.assert_outcomes(passed=13, skipped=2)  # targets audits causal LMs only; memory has no GPU to hold to
    result.stdout.fnmatch_lines(["*test_pipeline[[]load-cpu[]] PASSED*", "*test_pipeline[[]dataset-cpu[]] PASSED*"])


def test_the_marker_and_the_command_line_give_the_same_items(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)
    write(project, "test_pipeline.py", MARKED.format(stages=""))
    marked = project.runpytest("test_pipeline.py", "-v")
    command_line = project.runpytest("--trainer-module=train.py", "--trainer-devices=cpu", "-v")
    by_marker = {
        match[1]: match[2]
        for match in map(re.compile(r"^test_pipeline.py::test_pipeline\[(\w+)-cpu\] (\w+)").match, marked.outlines)
        if match
    }
    by_option = {
        match[1]: match[2]
        for match in map(re.compile(r"^train.py::(\w+)\[cpu\] (\w+)").match, command_line.outlines)
        if match
    }
    assert by_marker == by_option, (by_marker, by_option)
    assert by_marker["memory"] == "SKIPPED"


def test_a_stage_the_marker_names_runs_even_with_nothing_to_hold_it_to(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)
    write(project, "test_pipeline.py", MARKED.format(stages=', stages=["memory"]'))
    result = project.runpytest("-v")
    result.assert_outcomes(passed=1)  # the forecast alone, as --trainer-stages=memory reports it


@pytest.mark.parametrize("module", ["broken.py", "missing.py"])
def test_a_script_that_does_not_load_fails_its_load_item_once(project: pytest.Pytester, module: str) -> None:
    """As with --trainer-module: the load is its own item, the stages are not run, each said once."""
    write(project, "broken.py", "import json\njson.loads('{')\n")
    write(
        project,
        "test_pipeline.py",
        f"""
        import pytest

        @pytest.mark.trainer_pipeline(module="{module}", devices=["cpu"])
        def test_pipeline(trainer_stage):
            trainer_stage.run()
    """,
    )
    result = project.runpytest("-rfs")
    result.assert_outcomes(failed=1, skipped=14)
    cause = "JSONDecodeError: Expecting property name*" if module == "broken.py" else "*missing.py does not exist"
    result.stdout.fnmatch_lines(
        [
            f"load[[]cpu[]] failed: {module}: {cause}",
            "*pytest-trainer: test_pipeline.py::test_pipeline*",
            "  cpu: 14 items not run, the Trainer did not load (see load[[]cpu[]]): dataset, collate, *, padding",
            "FAILED test_pipeline.py::test_pipeline[[]load-cpu[]] - *",
        ]
    )
    assert not any("dataset[cpu] failed" in line for line in result.outlines)


def test_marker_without_any_trainer_says_what_to_define(project: pytest.Pytester) -> None:
    write(
        project,
        "test_pipeline.py",
        """
        import pytest

        @pytest.mark.trainer_pipeline(stages=["forward"], devices=["cpu"])
        def test_pipeline(trainer_stage):
            trainer_stage.run()
    """,
    )
    result = project.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*no Trainer to test. Define a `trainer` fixture in conftest.py*"])


def test_marked_test_without_the_fixture_says_how_to_take_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_pipeline="""
        import pytest

        @pytest.mark.trainer_pipeline(stages=["forward"])
        def test_pipeline():
            pass
    """
    )
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(
        [
            "*a test marked trainer_pipeline must take the trainer_stage fixture, "
            "e.g. def test_pipeline(trainer_stage): trainer_stage.run()*"
        ]
    )
    result.stdout.no_fnmatch_line("*plugin.py*")
