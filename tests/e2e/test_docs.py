"""The README and docs/: generated where they mirror a registry (the registries import the checks, torch among their
libraries), and their examples and commands run as written. That they are short and linked is in tests/unit/test_docs.py."""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
from pathlib import Path

import pytest
from pipeline_runs import failures

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(text: str, language: str = "") -> list[str]:
    """The fenced code blocks of a Markdown text in `language` ("" for blocks without one)."""
    return re.findall(rf"^```{language}\n(.*?)^```$", text, re.DOTALL | re.MULTILINE)


def section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def test_generated_pages_match_their_registries() -> None:
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    assert spec is not None and spec.loader is not None
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    assert generate.stale() == [], "run `python docs/generate.py` and commit the pages it writes"


#: Every marker example of the README and the docs, by page.
MARKER_EXAMPLES = [
    (page.name, block)
    for page in PAGES
    for block in blocks(page.read_text(), "python")
    if "@pytest.mark.trainer_pipeline" in block
]


@pytest.mark.parametrize(("page", "example"), MARKER_EXAMPLES, ids=[page for page, _ in MARKER_EXAMPLES])
def test_each_marker_example_runs_as_written_on_a_bundled_example(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, page: str, example: str
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    for entry in (ROOT / "conftest_examples" / "regression").iterdir():
        (shutil.copytree if entry.is_dir() else shutil.copy)(entry, pytester.path / entry.name)
    (pytester.path / "test_example.py").write_text(example)
    stages = re.search(r"stages=\[([^]]*)\]", example)
    expected = len(re.findall(r"\"(\w+)\"", stages[1])) if stages else None
    result = pytester.runpytest("test_example.py", "-v")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == outcomes.get("errors", 0) == 0, result.stdout.str()[-3000:]
    assert outcomes["passed"] == expected


@pytest.mark.slow  # the pretrained MiniLM
def test_the_readme_try_it_command_runs_as_written(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    (commands,) = blocks(section(README, "Try it"))
    (command,) = [line for line in commands.splitlines() if line.startswith("pytest ")]
    arguments = shlex.split(command)[1:]
    script = Path(next(argument for argument in arguments if argument.startswith("--trainer-module=")).split("=")[1])
    shutil.copytree(ROOT / script.parent, pytester.path / script.parent)
    result = pytester.runpytest(*arguments)
    assert failures(result, script.as_posix()) == [], result.stdout.str()[-3000:]
    assert result.ret == 0
