"""Node ids, order, selection, and the options, ini keys, markers and fixtures pytest shows."""

from __future__ import annotations

import pytest
from pipeline_runs import GOOD_SCRIPT, ITEMS, failures, outcomes, write

from pytest_trainer import devices


def test_one_item_per_stage_and_device_cpu_first(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)
    write(project, "other.py", GOOD_SCRIPT)
    result = project.runpytest("--trainer-module=train.py", "--trainer-module=other.py", "--collect-only", "-q")
    ids = [line for line in result.outlines if "::" in line]
    stages = ITEMS
    expected_cpu = [f"{script}::{stage}[cpu]" for script in ("train.py", "other.py") for stage in ("load", *stages)]
    expected_cuda = [f"{script}::{stage}[cuda]" for script in ("train.py", "other.py") for stage in stages]
    assert ids == expected_cpu + expected_cuda


def test_keyword_selection_and_narrowing_options(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)
    result = project.runpytest("--trainer-module=train.py", "-k", "forward and cpu", "-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["train.py::forward[[]cpu[]] PASSED*"])
    narrowed = project.runpytest(
        "--trainer-module=train.py", "--trainer-stages=step,dataset", "--trainer-devices=cpu", "--collect-only", "-q"
    )
    assert [line for line in narrowed.outlines if "::" in line] == [
        "train.py::load[cpu]",
        "train.py::dataset[cpu]",
        "train.py::step[cpu]",
    ]
    only_cuda = project.runpytest("--trainer-module=train.py", "--trainer-devices=cuda", "--collect-only", "-q")
    if devices.unavailable_reason("cuda") is None:
        assert [line for line in only_cuda.outlines if "::" in line][:2] == [
            "train.py::load[cuda]",
            "train.py::dataset[cuda]",
        ]
    else:  # a GPU gate on a machine without one fails the run instead of skipping every item
        assert only_cuda.ret == pytest.ExitCode.USAGE_ERROR
        only_cuda.stderr.fnmatch_lines(
            ["ERROR: --trainer-devices on the command line asks for cuda, but CUDA is not available on this machine*"]
        )


def test_ini_keys_let_ci_run_plain_pytest(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)
    project.makeini("[pytest]\ntrainer_module = train.py\ntrainer_devices = cpu\ntrainer_stages = dataset,forward\n")
    result = project.runpytest()
    result.assert_outcomes(passed=3)  # load, dataset, forward


def test_unknown_stage_names_its_source(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)
    result = project.runpytest("--trainer-module=train.py", "--trainer-stages=forwrd")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--trainer-stages on the command line: unknown 'forwrd'; choose from load, dataset, *"]
    )


def test_script_beside_regular_tests_is_not_imported_as_tests(project: pytest.Pytester) -> None:
    write(project, "test_train.py", GOOD_SCRIPT)
    project.makepyfile(test_other="def test_ok():\n    assert True\n")
    result = project.runpytest(".", "--trainer-module=test_train.py", "--trainer-devices=cpu", "-v")
    assert failures(result, "test_train.py") == []
    assert outcomes(result, "test_other.py") == {"test_ok": "PASSED"}


def test_help_markers_and_fixtures_are_documented(pytester: pytest.Pytester) -> None:
    help_text = pytester.runpytest_subprocess("--help").stdout.str()
    for name in ("module", "command", "args", "factory", "stages", "devices"):
        assert f"--trainer-{name}" in help_text
        assert f"trainer_{name}" in help_text
    pytester.runpytest_subprocess("--markers").stdout.fnmatch_lines(
        [
            "@pytest.mark.trainer_pipeline(module=None, command=None, stages=None, devices=None, factory=None, model=None):*"
        ]
    )
    fixtures = pytester.runpytest_subprocess("--fixtures").stdout.str()
    for name in ("trainer ", "trainer_stage ", "pipeline_device ", "train_batch "):
        assert name in fixtures


def test_command_line_script_alone_skips_testpaths_but_paths_add_them(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)
    project.makepyfile(test_other="def test_ok():\n    assert True\n")
    project.makeini("[pytest]\ntestpaths = .\n")
    alone = project.runpytest("--trainer-module=train.py", "--trainer-devices=cpu", "--collect-only", "-q")
    assert {line.split("::")[0] for line in alone.outlines if "::" in line} == {"train.py"}
    both = project.runpytest("test_other.py", "--trainer-module=train.py", "--trainer-devices=cpu", "-v")
    assert failures(both) == []
    assert outcomes(both, "test_other.py") == {"test_ok": "PASSED"}


def test_loading_the_plugin_imports_no_heavy_library(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_imports="""
        import sys

        def test_light():
            heavy = {"torch", "transformers", "datasets", "pyarrow", "hypothesis.strategies"} & set(sys.modules)
            assert not heavy
    """
    )
    pytester.runpytest_subprocess("-p", "no:hypothesispytest").assert_outcomes(passed=1)


def test_last_failed_reruns_only_the_failed_items(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT.replace("tiny.classifier()", "tiny.classifier(num_labels=2)"))
    project.runpytest("--trainer-module=train.py", "--trainer-devices=cpu", "--trainer-stages=dataset,forward")
    again = project.runpytest(
        "--trainer-module=train.py", "--trainer-devices=cpu", "--trainer-stages=dataset,forward", "--lf", "-v"
    )
    assert outcomes(again) == {"dataset[cpu]": "FAILED"}
