"""The HTML report (--trainer-html) and the pictures pytest-html's report carries: what each shows, and that it
renders in a browser. The pipelines are the bundled examples, run for real on the CPU."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest

from pytest_trainer.report import html
from pytest_trainer.report.summary import ItemRecord, PipelineReport
from pytest_trainer.schema import Outcome

EXAMPLES = Path(__file__).resolve().parents[2] / "conftest_examples"
CPU = ("--trainer-devices=cpu", "-p", "no:cacheprovider")


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


class Page(HTMLParser):
    """What the report shows, read back from its HTML: the token rows, the curves' points, the memory bars, the
    failures, and the text of every element (unescaped, as a reader sees it)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.rows: list[dict[str, list]] = []
        self.curves: list[list[str]] = []
        self.bars: list[str] = []
        self.failures: list[dict[str, str]] = []
        self.text: list[str] = []
        self._open: list[tuple[str, str]] = []  # (tag, what it collects)
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        classes = (found.get("class") or "").split()
        collects = ""
        if "row" in classes:
            self.rows.append({"tokens": [], "trained": [], "target": []})
        elif "token" in classes:
            self.rows[-1]["trained"].append("trained" in classes)
            collects = "token"
        elif "target" in classes:
            collects = "target"
        elif "failure" in classes:
            self.failures.append({"cause": "", "fix": ""})
        elif classes and classes[0] in ("cause", "fix"):
            collects = classes[0]
        elif tag == "polyline" and "try" in classes:
            self.curves.append((found.get("points") or "").split())
        elif "bar" in classes:
            self.bars.append(found.get("data-part") or "")
        if tag not in ("br", "wbr", "meta", "line", "circle", "rect", "polyline"):
            self._open.append((tag, collects))

    def handle_endtag(self, tag: str) -> None:
        if tag not in ("br", "wbr", "line", "circle", "rect", "polyline") and self._open:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        collects = next((what for _, what in reversed(self._open) if what), "")
        if collects == "token":
            self.rows[-1]["tokens"].append(data)
        elif collects == "target":
            self.rows[-1]["target"].append(data)
        elif collects in ("cause", "fix"):
            self.failures[-1][collects] += data


def _normal(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _report(path: Path) -> dict[tuple[str, str], dict]:
    return {(item["script"], item["stage"]): item for item in json.loads(path.read_text())["items"]}


@pytest.mark.slow  # the pretrained MiniLM
@pytest.mark.usefixtures("offline")
def test_classification_rows_show_their_class_and_a_failure_its_cause_and_fix(pytester: pytest.Pytester) -> None:
    shutil.copytree(EXAMPLES / "mnli", pytester.path / "mnli")
    pytester.runpytest(
        "--trainer-module=mnli/train.py",
        "--trainer-module=mnli/train_two_labels.py",
        *CPU,
        "--trainer-stages=dataset,collate,memory",
        "--trainer-html=out/report.html",
        "--trainer-report=out/report.json",
    )
    text = (pytester.path / "out/report.html").read_text()
    page = Page(text)
    items = _report(pytester.path / "out/report.json")

    data = [json.loads(line) for line in (pytester.path / "mnli/data/train.jsonl").read_text().splitlines()]
    labels = {_normal(row["premise"] + row["hypothesis"]): row["label"] for row in data}
    assert len(page.rows) == 4  # only the fixed script's collate ran: the other's was blocked by its dataset item
    for row in page.rows:
        words = " ".join(row["tokens"]).replace(" ##", "").replace("[CLS]", "").replace("[SEP]", "")
        assert "".join(row["target"]) == str(labels[_normal(words)])  # each row's own class from the data
        assert not any(row["trained"])  # a class is the target, no token is

    failed = items[("mnli/train_two_labels.py", "dataset")]
    assert failed["outcome"] == "failed" and failed["fix"].startswith("pass num_labels=3")
    assert page.failures == [{"cause": failed["diagnosis"], "fix": failed["fix"]}]
    assert "cpu: 2 items not run, blocked by dataset[cpu]: collate, memory" in "".join(page.text)

    parts = {
        name.removesuffix("_gib").replace("_", " ")
        for name in items[("mnli/train.py", "memory")]["figures"]
        if name.endswith("_gib") and name not in ("train_step_gib", "eval_gathered_gib", "eval_peak_gib")
    }
    assert parts == {"weights", "buffers", "optimizer state", "activations and gradients"}
    assert set(page.bars[:4]) == parts
    assert page.bars[4:] == ["training step peak", "evaluation peak (48 rows)"]  # compute_metrics gathers predictions


@pytest.mark.usefixtures("offline")
def test_chat_rows_train_the_assistant_answer_and_the_curve_has_every_step(pytester: pytest.Pytester) -> None:
    shutil.copytree(EXAMPLES / "sft_lora", pytester.path / "sft_lora")
    result = pytester.runpytest(
        "--trainer-module=sft_lora/train.py",
        *CPU,
        "--trainer-stages=collate,overfit,memory",
        "--trainer-html=report.html",
        "--trainer-report=report.json",
    )
    # The files written are named at the end of the run, as pytest-html names its own.
    result.stdout.fnmatch_lines(
        [
            f"*- pytest-trainer JSON report: {(pytester.path / 'report.json').as_uri()} -*",
            f"*- pytest-trainer HTML report: {(pytester.path / 'report.html').as_uri()} -*",
        ]
    )
    text = (pytester.path / "report.html").read_text()
    page = Page(text)
    items = _report(pytester.path / "report.json")

    answers = {}
    for line in (pytester.path / "sft_lora/data/train.jsonl").read_text().splitlines():
        user, assistant = json.loads(line)["messages"]
        answers[user["content"]] = assistant["content"]
    assert len(page.rows) == 4
    for row in page.rows:
        shown = "".join(row["tokens"]).replace("\u00b7", " ").replace("\u21b5", "\n")
        question = next(question for question in answers if f"user\n{question}<|im_end|>" in shown)
        trained = "".join(token for token, on in zip(row["tokens"], row["trained"], strict=True) if on)
        assert trained.replace("\u00b7", " ") == answers[question] + "<|im_end|>"  # the answer and its end, only
    assert "&lt;|im_end|&gt;" in text and "<|im_end|>" not in text  # token text is escaped

    steps = int(items[("sft_lora/train.py", "overfit")]["figures"]["overfit_steps"])
    assert [len(points) for points in page.curves] == [steps]
    assert "learning rate <b>0.002</b>" in text
    assert sorted(page.bars[:4]) == ["activations and gradients", "buffers", "optimizer state", "weights"]
    assert page.bars[4:] == ["training step peak"]


@pytest.mark.usefixtures("offline")
def test_pictures_are_extras_of_their_item_in_pytest_html_under_xdist(pytester: pytest.Pytester) -> None:
    if importlib.util.find_spec("pytest_html") is None:
        pytest.skip("pytest-html is not installed: pip install 'pytest-html>=4.1'")
    if importlib.util.find_spec("xdist") is None:
        pytest.skip("pytest-xdist is not installed")
    shutil.copytree(EXAMPLES / "sft_lora", pytester.path / "sft_lora")
    result = pytester.runpytest(
        "--trainer-module=sft_lora/train.py",
        *CPU,
        "--trainer-stages=collate,overfit",
        "--html=report.html",
        "--self-contained-html",
        "--trainer-html=trainer.html",
        "-n",
        "1",
    )
    result.assert_outcomes(passed=3)
    blob = re.search(r'id="data-container" data-jsonblob="([^"]*)"', (pytester.path / "report.html").read_text())
    assert blob is not None
    tests = json.loads(unescape(blob[1]))["tests"]
    extras = {nodeid: [extra["content"] for run in runs for extra in run["extras"]] for nodeid, runs in tests.items()}
    assert [Page(fragment).rows != [] for fragment in extras["sft_lora/train.py::collate[cpu]"]] == [True]
    assert [len(Page(fragment).curves) for fragment in extras["sft_lora/train.py::overfit[cpu]"]] == [1]
    assert extras["sft_lora/train.py::load[cpu]"] == []
    assert all(
        "style=" in fragment and "class='picture" in fragment for fragment in extras["sft_lora/train.py::collate[cpu]"]
    )
    trainer = Page((pytester.path / "trainer.html").read_text())  # from the worker's reports too
    assert len(trainer.rows) == 4 and len(trainer.curves) == 1


def test_user_text_is_escaped_everywhere(tmp_path: Path) -> None:
    """Script names, tokens, targets, causes and fixes come from users and their data: none becomes markup."""
    report = PipelineReport()
    evil = "<img src=x onerror=alert(1)>"
    report._records["a"] = ItemRecord(
        f"{evil}.py",
        "collate",
        "cpu",
        outcome=Outcome.FAILED,
        diagnosis=f"cause {evil} & more",
        fix=f"fix {evil}",
        notes=[f"precision: {evil}"],
        figures={evil: 1.0},
        pictures={
            "rows": [{"tokens": ["<b>&amp;", " x", "\n"], "trained": [True, False, False], "target": evil, "cut": 3}],
            "memory": {"parts": {evil: 10}, "peak": 10, "budget": 5},
            "rewards": {"total": [[1.0, 1.0]], "functions": {evil: [[1.0, 1.0]]}, "ended": [True, False]},
            "loss_curve": {"what": evil, "tries": [{"rate": 1e-3, "before": 2.0, "after": 1.0, "curve": [2.0, 1.5]}]},
        },
    )
    path = tmp_path / "report.html"
    html.write(path, report)
    text = path.read_text()
    assert "<img" not in text and "<b>&amp;" not in text and "&lt;img src=x onerror=alert(1)&gt;" in text
    page = Page(text)
    assert page.rows[0]["tokens"] == ["<b>&amp;", "\u00b7x", "\u21b5"]  # whitespace shown
    assert page.failures == [{"cause": f"cause {evil} & more", "fix": f"fix {evil}"}]
    assert "no spread: teaches nothing" in text and "3 more tokens not shown" in text
    assert "<script" not in text and "http" not in text.replace("http://www.w3.org/2000/svg", "")


@pytest.mark.usefixtures("offline")
def test_the_report_renders_in_headless_chromium(pytester: pytest.Pytester, tmp_path: Path) -> None:
    browser = shutil.which("chromium")
    if browser is None:
        pytest.skip("no chromium on PATH to render the report (Debian: apt-get install chromium)")
    from PIL import Image

    shutil.copytree(EXAMPLES / "sft_lora", pytester.path / "sft_lora")
    pytester.runpytest(
        "--trainer-module=sft_lora/train.py",
        *CPU,
        "--trainer-stages=collate,overfit,memory",
        "--trainer-html=report.html",
    )
    png = tmp_path / "report.png"
    screenshot(browser, pytester.path / "report.html", png, tmp_path / "profile")
    image = Image.open(png).convert("RGB")
    assert image.size == (1200, 2400)
    colours = {colour for _, colour in image.getcolors(maxcolors=1 << 22) or []}
    assert len(colours) > 50
    assert (0xA6, 0xE3, 0xB4) in colours  # the trained tokens' green
    assert (0xEF, 0xEF, 0xEF) in colours  # the prompt tokens' grey
    assert (0x2F, 0x6F, 0xDB) in colours  # the loss curve and the first memory bar


def screenshot(browser: str, page: Path, png: Path, profile: Path) -> None:
    """A 1200x2400 screenshot of `page` by headless Chromium, with a profile of its own (no first-run state)."""
    subprocess.run(
        [
            browser,
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--hide-scrollbars",
            "--no-first-run",
            f"--user-data-dir={profile}",
            f"--screenshot={png}",
            "--window-size=1200,2400",
            page.resolve().as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert png.exists(), f"chromium wrote no screenshot of {page}"


@pytest.mark.usefixtures("offline")
def test_figures_and_notes_are_said_in_words_and_once(pytester: pytest.Pytester) -> None:
    """A rotary model has no position limit (said, not a 0); the sampling note every item carries is shown once; an
    overfit that stops after a step says why its curve is short."""
    shutil.copytree(EXAMPLES / "sft_lora", pytester.path / "sft_lora")
    pytester.runpytest(
        "--trainer-module=sft_lora/train.py",
        *CPU,
        "--trainer-stages=overfit,lengths",
        "--trainer-sample=100",
        "--trainer-html=report.html",
        "--trainer-report=report.json",
    )
    text = (pytester.path / "report.html").read_text()
    assert text.count("sampled by --trainer-sample") == 1
    assert "no position limit: the model learns no table of absolute positions" in text
    assert "position_limit" not in text
    items = _report(pytester.path / "report.json")
    assert "position_limit" not in items[("sft_lora/train.py", "lengths")]["figures"]
    assert ("It stopped after 1 step" in text) == (text.count("class='try'") == 1 and "1 step;" in text)
    assert "squares: the loss judged in eval mode" in text


def test_a_model_with_learned_positions_has_its_limit_as_a_figure(project: pytest.Pytester) -> None:
    from pipeline_runs import GOOD_SCRIPT, write

    write(project, "train.py", GOOD_SCRIPT)
    project.runpytest("--trainer-module=train.py", *CPU, "--trainer-stages=lengths", "--trainer-report=report.json")
    assert _report(project.path / "report.json")[("train.py", "lengths")]["figures"]["position_limit"] == 64
