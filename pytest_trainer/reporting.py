"""What the pipeline items found, shown three ways: a table per script in the terminal, a JSON file, Markdown.

Built only from test reports (each item's user_properties carry its stage, diagnosis and figures),
so a run under pytest-xdist, whose reports arrive from the workers, gives the same summary.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: Name under which an item's pipeline facts travel in `report.user_properties`.
PROPERTY = "pytest_trainer"


@dataclass
class ItemRecord:
    """One pipeline item's outcome, in the terms of the report."""

    script: str
    stage: str
    device: str
    outcome: str = "passed"
    duration: float = 0.0
    reason: str = ""
    diagnosis: str = ""
    fix: str = ""
    figures: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: A failure shown with the library's own error only: no explanation of pytest-trainer's fits it yet.
    unexplained: bool = False

    @property
    def name(self) -> str:
        return f"{self.stage}[{self.device}]"


class PipelineReport:
    """Gathers the records of every pipeline item from the reports of all phases."""

    def __init__(self) -> None:
        self._records: dict[str, ItemRecord] = {}

    def add(self, report: Any) -> None:
        facts = dict(report.user_properties).get(PROPERTY)
        if not facts:
            return
        record = self._records.setdefault(
            report.nodeid, ItemRecord(facts["script"], facts["stage"], facts["device"])
        )
        record.duration += report.duration
        record.figures.update(facts.get("figures", {}))
        record.notes.extend(note for note in facts.get("notes", []) if note not in record.notes)
        if facts.get("diagnosis"):
            record.diagnosis, record.fix = facts["diagnosis"], facts.get("fix", "")
            record.unexplained = bool(facts.get("unexplained", False))
        if report.failed:
            record.outcome = "failed" if report.when == "call" else "error"
            if not record.diagnosis:
                record.diagnosis = _first_line(report.longreprtext)
        elif report.skipped and record.outcome == "passed":
            record.outcome = "skipped"
            record.reason = _skip_reason(report.longrepr)

    def unexplained(self) -> list[ItemRecord]:
        """Failures shown with the library's own error only, which the table of explanations should learn."""
        return [record for record in self._records.values()
                if record.unexplained and record.outcome in ("failed", "error")]

    def by_script(self) -> dict[str, list[ItemRecord]]:
        scripts: dict[str, list[ItemRecord]] = {}
        for record in self._records.values():
            scripts.setdefault(record.script, []).append(record)
        return scripts

    # ---- terminal ------------------------------------------------------------------------------

    def terminal_sections(self) -> Iterable[tuple[str, list[str]]]:
        """(title, lines) per script: one line when nothing failed, else the stage-by-device table."""
        for script, records in self.by_script().items():
            failed = [record for record in records if record.outcome in ("failed", "error")]
            # How the pipeline was run differently from the script (its precision or vLLM on a machine without a GPU).
            changed = _ordered(note for record in records for note in record.notes
                               if note.startswith(("precision:", "not exercised:")))
            if not failed:
                yield f"pytest-trainer: {script}", [_all_passed_line(records), *changed]
                continue
            lines, reasons = _table(records)
            lines += [f"  [{number}] {reason}" for reason, number in reasons.items()]
            lines += changed
            for record in failed:
                lines.append(f"{record.outcome.upper()} {record.name}: {record.diagnosis}")
                if record.fix:
                    lines.append(f"  fix: {record.fix}")
            unexplained = [record.name for record in failed if record.unexplained]
            if unexplained:
                lines.append(_unexplained_line(unexplained))
            yield f"pytest-trainer: {script}", lines

    # ---- files ---------------------------------------------------------------------------------

    def write_json(self, path: Path) -> None:
        items = [asdict(record) for records in self.by_script().values() for record in records]
        unexplained = [f"{record.script}::{record.name}" for record in self.unexplained()]
        path.parent.mkdir(parents=True, exist_ok=True)
        report = {"items": items, "unexplained": {"count": len(unexplained), "items": unexplained}}
        path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")

    def markdown(self) -> str:
        parts = []
        for script, records in self.by_script().items():
            devices = _ordered(record.device for record in records)
            parts.append(f"### pytest-trainer: `{script}`\n")
            parts.append("| stage | " + " | ".join(devices) + " |")
            parts.append("|---|" + "---|" * len(devices))
            cells = {(record.stage, record.device): record for record in records}
            for stage in _ordered(record.stage for record in records):
                row = [_markdown_cell(cells.get((stage, device))) for device in devices]
                parts.append(f"| {stage} | " + " | ".join(row) + " |")
            for record in records:
                if record.outcome in ("failed", "error"):
                    fix = f"  \nfix: {record.fix}" if record.fix else ""
                    parts.append(f"\n**{record.name}**: {record.diagnosis}{fix}")
            parts.append("")
        return "\n".join(parts) + "\n"


def _table(records: list[ItemRecord]) -> tuple[list[str], dict[str, int]]:
    devices = _ordered(record.device for record in records)
    stages = _ordered(record.stage for record in records)
    cells = {(record.stage, record.device): record for record in records}
    reasons: dict[str, int] = {}
    rows = [["stage", *devices]]
    for stage in stages:
        row = [stage]
        for device in devices:
            record = cells.get((stage, device))
            if record is None:
                row.append("-")
            elif record.outcome == "skipped":
                row.append(f"skipped [{reasons.setdefault(record.reason, len(reasons) + 1)}]")
            else:
                row.append(record.outcome.upper() if record.outcome != "passed" else "passed")
        rows.append(row)
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    return lines, reasons


def _unexplained_line(names: list[str]) -> str:
    failures = "failure" if len(names) == 1 else "failures"
    return (f"{len(names)} {failures} shown with the library's own error only (not yet explained by pytest-trainer): "
            + " ".join(names))


def _all_passed_line(records: list[ItemRecord]) -> str:
    passed = sum(record.outcome == "passed" for record in records)
    skipped = [record for record in records if record.outcome == "skipped"]
    line = f"all {passed} items that ran passed"
    if skipped:
        reasons = "; ".join(_ordered(record.reason for record in skipped))
        line += f", {len(skipped)} skipped ({reasons})"
    return line


def _markdown_cell(record: ItemRecord | None) -> str:
    if record is None:
        return ""
    if record.outcome == "skipped":
        return f"skipped: {record.reason}"
    return {"passed": "passed", "failed": "**FAILED**", "error": "**ERROR**"}[record.outcome]


def _ordered(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _skip_reason(longrepr: Any) -> str:
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")
