"""The plugin's options and ini keys, read through pytest's own configuration (`pytester.parseconfig`).

Pinned: nothing given gives the documented defaults; the command line wins over the ini file; stage and device lists
keep the canonical order; a bad value is a usage error that names where it came from (the option on the command
line, or the key in the ini file) and what is allowed; an opt-in stage needs its setting; relative paths are taken
from where pytest was started (command line) or from the ini file's folder; every option of `OPTIONS` is registered
under its flag and, unless command-line only, its ini key.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from pytest_trainer import options
from pytest_trainer.plan import DEVICES, LOAD, OPT_IN, STAGES
from pytest_trainer.settings import Settings


def resolved(pytester: pytest.Pytester, *args: str) -> Settings:
    return options.resolve(pytester.parseconfig(*args))


def usage_error(pytester: pytest.Pytester, *args: str) -> str:
    with pytest.raises(pytest.UsageError) as raised:
        resolved(pytester, *args)
    return str(raised.value)


def ini(pytester: pytest.Pytester, **keys: str) -> Path:
    """A pytest.ini in the pytester folder with `keys`; its path."""
    lines = "".join(f"{key} = {value}\n" for key, value in keys.items())
    return pytester.makefile(".ini", pytest=f"[pytest]\n{lines}")


# ---- defaults and precedence ----------------------------------------------------------------------------------


def test_nothing_given_gives_the_default_settings_and_every_default_stage(pytester: pytest.Pytester) -> None:
    settings = resolved(pytester)
    assert settings == dataclasses.replace(Settings(), stages=(LOAD, *STAGES))
    assert not set(OPT_IN) & set(settings.stages)
    assert settings.devices == DEVICES


def test_command_line_wins_over_the_ini_file(pytester: pytest.Pytester) -> None:
    ini(pytester, trainer_stages="dataset", trainer_devices="cpu", trainer_examples="3")
    settings = resolved(pytester, "--trainer-stages=forward", "--trainer-examples=5")
    assert settings.stages == ("forward",)
    assert settings.examples == 5
    assert settings.devices == ("cpu",)  # not given on the command line: the ini file's
    assert settings.devices_named


def test_ini_file_gives_what_the_command_line_does_not(pytester: pytest.Pytester) -> None:
    ini(pytester, trainer_stages="collate,dataset", trainer_timeout="12.5", trainer_sample="0")
    settings = resolved(pytester)
    assert settings.stages == ("dataset", "collate")
    assert settings.timeout == 12.5
    assert settings.sample == 0


# ---- stage and device lists -----------------------------------------------------------------------------------


def test_stages_keep_the_canonical_order_whatever_order_they_are_given(pytester: pytest.Pytester) -> None:
    assert resolved(pytester, "--trainer-stages=forward,dataset").stages == ("dataset", "forward")


def test_stages_ignore_blanks_and_repeats(pytester: pytest.Pytester) -> None:
    assert resolved(pytester, "--trainer-stages= step, forward,,step ").stages == ("forward", "step")


def test_devices_keep_the_canonical_order() -> None:
    assert options.parse_choices("cuda,cpu", DEVICES, "--trainer-devices") == ("cpu", "cuda")


def test_unknown_stage_on_the_command_line_names_the_option_and_the_allowed_stages(pytester: pytest.Pytester) -> None:
    message = usage_error(pytester, "--trainer-stages=forwrd,dataset")
    assert message.startswith("--trainer-stages on the command line: ")
    assert "'forwrd'" in message
    assert "'dataset'" not in message
    allowed = message.split("choose from ", 1)[1]
    assert all(re.search(rf"\b{stage}\b", allowed) for stage in (LOAD, *STAGES))


def test_unknown_stage_in_the_ini_file_names_the_key_and_the_file(pytester: pytest.Pytester) -> None:
    path = ini(pytester, trainer_stages="forward,bakcward")
    message = usage_error(pytester)
    assert message.startswith(f"trainer_stages in {path}: ")
    assert "'bakcward'" in message


def test_unknown_device_names_the_option_and_the_devices(pytester: pytest.Pytester) -> None:
    message = usage_error(pytester, "--trainer-devices=tpu")
    assert message.startswith("--trainer-devices on the command line: ")
    assert all(device in message for device in DEVICES)


def test_baseline_stage_without_its_setting_is_refused(pytester: pytest.Pytester) -> None:
    message = usage_error(pytester, "--trainer-stages=forward,baseline")
    assert message.startswith("--trainer-stages on the command line: ")
    assert "'baseline'" in message
    assert "baseline" not in message.split("choose from ", 1)[1]


def test_baseline_stage_with_its_setting_is_kept(pytester: pytest.Pytester) -> None:
    settings = resolved(pytester, "--trainer-stages=baseline,forward", "--trainer-baseline=baselines")
    assert settings.stages == ("forward", "baseline")


def test_baseline_setting_alone_adds_the_baseline_stage_to_every_default_stage(pytester: pytest.Pytester) -> None:
    settings = resolved(pytester, "--trainer-baseline=baselines")
    assert settings.stages == (LOAD, *STAGES, "baseline")
    assert settings.baseline == (pytester.path / "baselines").resolve()


# ---- numbers --------------------------------------------------------------------------------------------------


def test_sample_of_zero_keeps_every_row(pytester: pytest.Pytester) -> None:
    assert resolved(pytester, "--trainer-sample=0").sample == 0


@pytest.mark.parametrize("flag", ["--trainer-overfit-steps", "--trainer-examples", "--trainer-batch-size"])
@pytest.mark.parametrize("value", ["0", "-3", "2.5", "many"])
def test_counts_must_be_positive_whole_numbers(pytester: pytest.Pytester, flag: str, value: str) -> None:
    message = usage_error(pytester, f"{flag}={value}")
    assert message.startswith(f"{flag} on the command line: {value!r} ")


def test_counts_are_read_as_numbers(pytester: pytest.Pytester) -> None:
    settings = resolved(pytester, "--trainer-overfit-steps=7", "--trainer-examples=3", "--trainer-batch-size=2")
    assert (settings.overfit_steps, settings.examples, settings.batch_size) == (7, 3, 2)


@pytest.mark.parametrize("value", ["abc", "-1", "inf", "nan"])
def test_timeout_that_is_no_number_of_seconds_names_its_source(pytester: pytest.Pytester, value: str) -> None:
    message = usage_error(pytester, f"--trainer-timeout={value}")
    assert message.startswith(f"--trainer-timeout on the command line: {value!r} ")


def test_timeout_in_the_ini_file_that_is_no_number_names_the_key(pytester: pytest.Pytester) -> None:
    path = ini(pytester, trainer_timeout="soon")
    assert usage_error(pytester).startswith(f"trainer_timeout in {path}: 'soon' ")


@pytest.mark.parametrize(("value", "seconds"), [("0", 0.0), ("2.5", 2.5)])
def test_timeout_takes_zero_for_no_limit_and_fractions(pytester: pytest.Pytester, value: str, seconds: float) -> None:
    assert resolved(pytester, f"--trainer-timeout={value}").timeout == seconds


def test_gpu_memory_is_read_in_gib(pytester: pytest.Pytester) -> None:
    assert resolved(pytester, "--trainer-gpu-memory=7.5").gpu_memory == 7.5
    assert usage_error(pytester, "--trainer-gpu-memory=lots").startswith("--trainer-gpu-memory on the command line")


# ---- paths ----------------------------------------------------------------------------------------------------


def test_relative_report_on_the_command_line_is_taken_from_the_invocation_folder(pytester: pytest.Pytester) -> None:
    (pytester.path / "conf").mkdir()
    config_file = pytester.path / "conf" / "pytest.ini"
    config_file.write_text("[pytest]\n")
    settings = resolved(pytester, "-c", str(config_file), "--trainer-report=out/report.json")
    assert settings.report == (pytester.path / "out" / "report.json").resolve()


def test_relative_report_in_the_ini_file_is_taken_from_its_folder(pytester: pytest.Pytester) -> None:
    (pytester.path / "conf").mkdir()
    config_file = pytester.path / "conf" / "pytest.ini"
    config_file.write_text("[pytest]\ntrainer_report = out/report.json\n")
    settings = resolved(pytester, "-c", str(config_file))
    assert settings.report == (pytester.path / "conf" / "out" / "report.json").resolve()


def test_module_that_does_not_exist_is_a_usage_error(pytester: pytest.Pytester) -> None:
    message = usage_error(pytester, "--trainer-module=missing.py")
    assert message.startswith("--trainer-module on the command line: ")
    assert "missing.py" in message
    assert "does not exist" in message


def test_a_module_name_near_a_script_s_is_suggested_and_the_path_normalised(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(train="", evaluate="")
    (pytester.path / "data").mkdir()
    message = usage_error(pytester, "--trainer-module=data/../trian.py")
    assert message == (
        f"--trainer-module on the command line: {pytester.path / 'trian.py'} does not exist (did you "
        f"mean {pytester.path / 'train.py'}?); give the path of the training script (a .py file)"
    )


def test_a_module_far_from_every_script_suggests_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(train="")
    assert "did you mean" not in usage_error(pytester, "--trainer-module=finetune_llama.py")


def test_a_module_that_is_no_python_file_is_refused(pytester: pytest.Pytester) -> None:
    (pytester.path / "config.yaml").write_text("model: tiny\n")
    message = usage_error(pytester, "--trainer-module=config.yaml")
    assert message == (
        f"--trainer-module on the command line: {pytester.path / 'config.yaml'} is not a Python file; "
        "give the path of the training script (a .py file), which the plugin runs up to "
        "trainer.train()"
    )


def test_module_that_is_a_folder_is_a_usage_error(pytester: pytest.Pytester) -> None:
    (pytester.path / "scripts").mkdir()
    message = usage_error(pytester, "--trainer-module=scripts")
    assert "is a folder" in message


def test_modules_are_resolved_and_given_once_each(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(train="", other="")
    settings = resolved(
        pytester, "--trainer-module=train.py", "--trainer-module=other.py", "--trainer-module=./train.py"
    )
    assert settings.modules == ((pytester.path / "train.py").resolve(), (pytester.path / "other.py").resolve())


def test_modules_in_the_ini_file_are_taken_from_its_folder(pytester: pytest.Pytester) -> None:
    (pytester.path / "conf").mkdir()
    (pytester.path / "conf" / "train.py").write_text("")
    config_file = pytester.path / "conf" / "pytest.ini"
    config_file.write_text("[pytest]\ntrainer_module = train.py\n")
    assert resolved(pytester, "-c", str(config_file)).modules == ((pytester.path / "conf" / "train.py").resolve(),)


# ---- script arguments -----------------------------------------------------------------------------------------


def test_script_arguments_are_shell_split(pytester: pytest.Pytester) -> None:
    settings = resolved(pytester, "--trainer-args=--lr 0.1 --name 'two words' --flag")
    assert settings.script_args == ("--lr", "0.1", "--name", "two words", "--flag")


def test_script_arguments_that_cannot_be_split_name_their_source(pytester: pytest.Pytester) -> None:
    message = usage_error(pytester, "--trainer-args=--name 'unclosed")
    assert message.startswith("--trainer-args on the command line: ")


# ---- registration ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("option", options.OPTIONS, ids=lambda option: option.name)
def test_every_option_is_registered_under_its_flag(pytester: pytest.Pytester, option: options.Option) -> None:
    config = pytester.parseconfig(option.flag if option.switch else f"{option.flag}=given")
    expected = True if option.switch else (["given"] if option.repeated else "given")
    assert option.flag.startswith("--trainer-")
    assert config.getoption(option.key) == expected


@pytest.mark.parametrize("option", options.OPTIONS, ids=lambda option: option.name)
def test_every_option_has_its_ini_key_unless_command_line_only(
    pytester: pytest.Pytester, option: options.Option
) -> None:
    config = pytester.parseconfig()
    assert option.key.startswith("trainer_")
    if option.ini is None:
        with pytest.raises(ValueError, match=option.key):
            config.getini(option.key)
    else:
        assert config.getini(option.key) in ("", [], False)


@pytest.mark.parametrize(
    "option", [option for option in options.OPTIONS if option.ini is not None], ids=lambda option: option.name
)
def test_every_ini_key_is_read_into_its_setting(pytester: pytest.Pytester, option: options.Option) -> None:
    path = ini(pytester, **{option.key: "[not valid]"})
    try:
        settings = options.resolve(pytester.parseconfig())
    except pytest.UsageError as error:
        assert str(error).startswith(f"{option.key} in {path}: ")
    else:  # taken as text or a path: the setting moved from its default
        assert settings != dataclasses.replace(Settings(), stages=(LOAD, *STAGES))


def test_baseline_update_is_a_switch(pytester: pytest.Pytester) -> None:
    assert resolved(pytester, "--trainer-baseline-update").baseline_update
    assert not resolved(pytester).baseline_update
