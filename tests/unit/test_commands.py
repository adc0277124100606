"""Reading a command as the user runs it (`commands`) down to the file Python runs and its argv, without running it.

The launchers read with their own parsers (torchrun, accelerate launch) import torch: they are tested end to end
(tests/e2e/test_trainer_command.py). deepspeed is read without deepspeed, so here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_trainer.commands import Command, CommandError, parse, script_command


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository: a script, a package with a training module and a __main__, and an installed console script."""
    (tmp_path / "train.py").write_text("print('training')\n")
    package = tmp_path / "trainpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text("def main():\n    return 0\n")
    (package / "__main__.py").write_text("")
    # What pip writes for a console script: a dist-info folder with the entry point, beside the package on the path.
    info = tmp_path / "trainpkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: trainpkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[console_scripts]\ntrainpkg-cli = trainpkg.train:main\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_python_and_a_script_runs_the_script_with_its_arguments(repo: Path) -> None:
    command = parse("python -u -W ignore train.py --lr 1e-4 --name 'two words'", repo)
    assert (command.kind, command.file) == ("script", repo / "train.py")
    assert command.argv == ("train.py", "--lr", "1e-4", "--name", "two words")
    assert command.text == "python -u -W ignore train.py --lr 1e-4 --name 'two words'"
    assert command.cwd == repo and command.launch is None


def test_a_script_alone_and_the_interpreter_by_its_path_are_python_too(repo: Path) -> None:
    assert parse("./train.py --x", repo).argv == ("./train.py", "--x")
    assert parse(f"{sys.executable} train.py", repo).file == repo / "train.py"
    assert parse("python3.12 train.py", repo).file == repo / "train.py"


def test_python_m_runs_the_module_found_from_the_working_folder(repo: Path) -> None:
    command = parse("python -m trainpkg.train --config cfg.yaml", repo)
    assert (command.kind, command.target, command.file) == ("module", "trainpkg.train", repo / "trainpkg" / "train.py")
    assert command.argv == (str(repo / "trainpkg" / "train.py"), "--config", "cfg.yaml")


def test_python_m_of_a_package_runs_its_main_module(repo: Path) -> None:
    command = parse("python -m trainpkg", repo)
    assert (command.target, command.file) == ("trainpkg.__main__", repo / "trainpkg" / "__main__.py")


def test_a_console_script_is_read_through_its_installed_entry_point(repo: Path) -> None:
    command = parse("trainpkg-cli train config.yml", repo)
    assert (command.kind, command.target) == ("entry point", "trainpkg.train:main")
    assert command.file == repo / "trainpkg" / "train.py"
    assert command.args == ("train", "config.yml")


def test_variables_before_the_command_are_its_environment(repo: Path) -> None:
    command = parse("NPROC_PER_NODE=2 CUDA_VISIBLE_DEVICES=0,1 trainpkg-cli sft", repo)
    assert command.environment == (("NPROC_PER_NODE", "2"), ("CUDA_VISIBLE_DEVICES", "0,1"))
    assert command.args == ("sft",)


def test_deepspeed_is_read_without_deepspeed(repo: Path) -> None:
    command = parse("deepspeed --num_gpus 8 --num_nodes=2 --master_port 29501 train.py --deepspeed ds.json", repo)
    assert command.file == repo / "train.py"
    assert command.args == ("--deepspeed", "ds.json")
    assert command.launch is not None
    assert (command.launch.launcher, command.launch.processes, command.launch.engine) == ("deepspeed", 16, "DeepSpeed")
    module = parse("deepspeed --module trainpkg.train", repo)
    assert (module.kind, module.target) == ("module", "trainpkg.train")
    # The nodes a hostfile names are not known here; given, they count.
    hosts = parse("deepspeed --hostfile hosts.txt --num_gpus 8 train.py", repo)
    assert hosts.launch is not None and hosts.launch.processes is None
    counted = parse("deepspeed -H hosts.txt --num_nodes 2 --num_gpus 8 train.py", repo)
    assert counted.launch is not None and counted.launch.processes == 16


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "the command is empty"),
        ("python -c 'import train'", "runs code given on the command line"),
        ("python", "names no script"),
        ("python missing.py", "missing.py, which is not a file under"),
        ("python -m nowhere.train", "the module nowhere.train, which is not found"),
        ("not-installed-cli train", "not-installed-cli is not a console script installed in this Python environment"),
        ("accelerate config", "`accelerate config` starts no training script"),
        ("LR=1", "only environment variables were given"),
        ("python 'train.py", "cannot split"),
        ("deepspeed --num_gpus 2", "names no script for deepspeed to start"),
    ],
)
def test_a_command_that_cannot_be_read_says_what_was_tried(repo: Path, text: str, said: str) -> None:
    with pytest.raises(CommandError, match=said.replace("(", r"\(")):
        parse(text, repo)


def test_a_command_travels_to_another_process_and_back(repo: Path) -> None:
    command = parse("A=1 python -m trainpkg.train --x", repo)
    assert Command.from_json(command.to_json()) == command
    script = script_command(repo / "train.py", ("--lr", "1"))
    assert Command.from_json(script.to_json()) == script
    assert not script.read_launches and command.read_launches


def test_a_module_script_is_python_running_it() -> None:
    script = script_command(Path("/repo/train.py"), ("--lr", "1"))
    assert (script.kind, script.argv, script.cwd) == ("script", ("/repo/train.py", "--lr", "1"), None)


def test_reading_a_command_runs_and_imports_nothing(repo: Path) -> None:
    (repo / "trainpkg" / "__init__.py").write_text("raise SystemExit('imported')\n")
    parse("python -m trainpkg.train", repo)
    parse("trainpkg-cli train", repo)
    assert "trainpkg" not in sys.modules
