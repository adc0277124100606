"""The README, CONTRIBUTING and docs/ as text: the README short, every link to a file that exists, a marker example
shown. That the generated pages match their registries and the examples run as written is in tests/e2e/test_docs.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_reads_in_two_minutes() -> None:
    assert len(README.splitlines()) <= 200


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_link_of_a_page_points_to_a_file_that_exists(page: Path) -> None:
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text())
    missing = [target for target in targets if not (page.parent / target).exists()]
    assert missing == []


def test_the_readme_shows_a_marker_example() -> None:
    python = re.findall(r"^```python\n(.*?)^```$", README, re.DOTALL | re.MULTILINE)
    assert any("@pytest.mark.trainer_pipeline" in block for block in python)
