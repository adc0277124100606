"""What the pipeline items found, shown three ways: a table per script in the terminal, a JSON file, Markdown.

Built only from test reports (each item's user_properties carry its stage, diagnosis and figures),
so a run under pytest-xdist, whose reports arrive from the workers, gives the same summary.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_trainer.schema import ItemFacts, Outcome, Pictures, to_json

#: Name under which an item's pipeline facts travel in `report.user_properties`.
PROPERTY = "pytest_trainer"


@dataclass
class ItemRecord:
    """One pipeline item's outcome, in the terms of the report."""

    script: str
    stage: str
    device: str
    outcome: Outcome = Outcome.PASSED
    duration: float = 0.0
    reason: str = ""
    diagnosis: str = ""
    fix: str = ""
    figures: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: A failure shown with the library's own error only: no explanation of pytest-trainer's fits it yet.
    unexplained: bool = False
    #: Skipped because a stage it needs failed (the reason names which).
    blocked: bool = False
    #: Skipped because its device is not on this machine.
    unavailable: bool = False
    #: The setting that turns the stage on, where it runs only when asked (`--trainer-processes`), else "".
    opt_in: str = ""
    #: What the stage drew (see `pytest_trainer.report.pictures`), for the HTML report.
    pictures: Pictures = field(default_factory=lambda: Pictures())
    #: The seconds sampling an online RL batch took in this item (`schema.Sampling`), else 0.
    sampling_seconds: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.stage}[{self.device}]"

    @property
    def ran(self) -> bool:
        """Run, whatever its outcome (a skip for its own reason included): not blocked, its device not missing."""
        return not (self.blocked or self.unavailable)


@dataclass(frozen=True)
class Cell:
    """One cell of the stage-by-device grid, as every rendering of it says it."""

    #: "passed", "FAILED", "ERROR", "skipped [1]" (the footnote of its reason), "not run", or "" (no such item).
    text: str
    #: The outcome ("passed", "failed", "error", "skipped"), "not run", or "": what colours it.
    kind: str
    record: ItemRecord | None = None

    @property
    def bad(self) -> bool:
        """A failure or an error, which renderings make stand out."""
        return self.record is not None and self.record.outcome.bad


@dataclass(frozen=True)
class Grid:
    """The items that ran, stage by device; the reasons of their skips, numbered as the cells cite them."""

    devices: list[str]
    rows: list[tuple[str, list[Cell]]]
    reasons: dict[str, int]

    @classmethod
    def of(cls, records: list[ItemRecord]) -> Grid:
        ran = [record for record in records if record.ran]
        devices = ordered(record.device for record in ran)
        cells = {(record.stage, record.device): record for record in records}
        reasons: dict[str, int] = {}
        rows = [
            (stage, [_cell(cells.get((stage, device)), reasons) for device in devices])
            for stage in ordered(record.stage for record in ran)
        ]
        return cls(devices, rows, reasons)


def facts_of(report: Any) -> ItemFacts | None:
    """The pipeline facts an item's report carries (JSON among its user_properties), or None."""
    value = dict(report.user_properties).get(PROPERTY)
    return ItemFacts.from_json(value) if isinstance(value, str) else None


class PipelineReport:
    """Gathers the records of every pipeline item from the reports of all phases."""

    def __init__(self) -> None:
        self._records: dict[str, ItemRecord] = {}

    def add(self, report: Any) -> None:
        facts = facts_of(report)
        if facts is None:
            return
        record = self._records.setdefault(report.nodeid, ItemRecord(facts.script, facts.stage, facts.device))
        record.duration += report.duration
        record.opt_in = facts.opt_in or record.opt_in
        record.blocked = record.blocked or facts.blocked
        record.unavailable = record.unavailable or facts.unavailable
        drawn: Pictures | None = getattr(report, "trainer_pictures", None)  # set by the plugin's report hook
        record.pictures.update(drawn or {})
        record.figures.update(facts.figures)
        record.sampling_seconds = max(record.sampling_seconds, facts.sampling_seconds)
        record.notes.extend(note for note in facts.notes if note not in record.notes)
        if facts.diagnosis:
            record.diagnosis, record.fix, record.unexplained = facts.diagnosis, facts.fix, facts.unexplained
        if report.failed:
            record.outcome = Outcome.FAILED if report.when == "call" else Outcome.ERROR
            if not record.diagnosis:
                record.diagnosis = _first_line(report.longreprtext)
        elif report.skipped and record.outcome == Outcome.PASSED:
            record.outcome = Outcome.SKIPPED
            record.reason = _skip_reason(report.longrepr)

    def records(self) -> list[ItemRecord]:
        return list(self._records.values())

    def unexplained(self) -> list[ItemRecord]:
        """Failures shown with the library's own error only, which the table of explanations should learn."""
        return [record for record in self._records.values() if record.unexplained and record.outcome.bad]

    def by_script(self) -> dict[str, list[ItemRecord]]:
        scripts: dict[str, list[ItemRecord]] = {}
        for record in self._records.values():
            scripts.setdefault(record.script, []).append(record)
        return scripts

    # ---- terminal ------------------------------------------------------------------------------

    def terminal_sections(self) -> Iterable[tuple[str, list[Line]]]:
        """(title, lines) per script: what ran as a stage-by-device table (one line when nothing failed), and what
        did not run folded into one line per device and cause. Each failure's cause and fix are in its own report,
        shown by pytest; they are not repeated here."""
        for script, records in self.by_script().items():
            failed = [record for record in records if record.outcome.bad]
            changed = changed_notes(records)
            if failed:
                grid = Grid.of(records)
                lines = _table(grid) + [[(f"  [{number}] {reason}", {})] for reason, number in grid.reasons.items()]
            else:
                ran = [record for record in records if record.ran]
                lines = [_all_passed_line(ran), *_skipped_lines(ran)]
            lines += _not_run_lines(records)
            lines += _cost_lines(records)
            lines += [[(note, {})] for note in changed]
            unexplained = [record.name for record in failed if record.unexplained]
            if unexplained:
                lines.append([(_unexplained_line(unexplained), {"yellow": True})])
            yield f"pytest-trainer: {script}", lines

    # ---- files ---------------------------------------------------------------------------------

    def write_json(self, path: Path) -> None:
        items = [_plain(record) for records in self.by_script().values() for record in records]
        unexplained = [f"{record.script}::{record.name}" for record in self.unexplained()]
        path.parent.mkdir(parents=True, exist_ok=True)
        report = {"items": items, "unexplained": {"count": len(unexplained), "items": unexplained}}
        path.write_text(to_json(report, indent=2) + "\n")

    def markdown(self) -> str:
        """The GitHub step summary: per script the table of what ran, what did not run folded, each failure's cause
        and fix, and the script's items as JSON (in a collapsed block) for a program to read."""
        parts = []
        for script, records in self.by_script().items():
            grid = Grid.of(records)
            parts.append(f"### pytest-trainer: `{script}`\n")
            if grid.rows:
                parts.append("| stage | " + " | ".join(grid.devices) + " |")
                parts.append("|---|" + "---|" * len(grid.devices))
                for stage, cells in grid.rows:
                    row = [
                        f"**{cell.text}**" if cell.record and cell.record.outcome.bad else cell.text for cell in cells
                    ]
                    parts.append(f"| {stage} | " + " | ".join(row) + " |")
                parts.append("")
            parts += [f"[{number}] {reason}  " for reason, number in grid.reasons.items()]
            parts += [f"{lead}{rest}  " for lead, rest in not_run(records)]
            for record in records:
                if record.outcome.bad:
                    fix = f"  \nfix: {record.fix}" if record.fix else ""
                    parts.append(f"\n**{record.name}**: {record.diagnosis}{fix}")
            data = to_json([_plain(record) for record in records], indent=1)
            parts.append(
                f"\n<details><summary>pytest-trainer data (JSON)</summary>\n\n```json\n{data}\n```\n\n</details>\n"
            )
        return "\n".join(parts) + "\n"


#: A line of the terminal section: pieces of text, each with its pytest markup ({"red": True}, ...).
Line = list[tuple[str, dict[str, bool]]]

_MARKUP = {
    Outcome.PASSED.value: {"green": True},
    Outcome.FAILED.value: {"red": True, "bold": True},
    Outcome.ERROR.value: {"red": True, "bold": True},
    Outcome.SKIPPED.value: {"yellow": True},
    "not run": {"yellow": True},
}


def _table(grid: Grid) -> list[Line]:
    """The grid as aligned, coloured lines ("-" where the plan has no such item)."""
    rows = [[("stage", ""), *((device, "") for device in grid.devices)]]
    rows += [[(stage, ""), *((cell.text or "-", cell.kind) for cell in cells)] for stage, cells in grid.rows]
    widths = [max(len(row[column][0]) for row in rows) for column in range(len(rows[0]))]
    lines = []
    for row in rows:
        line: Line = [("  ", {})]
        for index, ((text, kind), width) in enumerate(zip(row, widths, strict=True)):
            line.append((text, _MARKUP.get(kind, {})))
            if index < len(row) - 1:
                line.append((" " * (width - len(text) + 2), {}))
        lines.append(line)
    return lines


def _cell(record: ItemRecord | None, reasons: dict[str, int]) -> Cell:
    if record is None:
        return Cell("", "")
    if not record.ran:
        return Cell("not run", "not run", record)
    if record.outcome == Outcome.SKIPPED:
        return Cell(f"skipped [{reasons.setdefault(record.reason, len(reasons) + 1)}]", Outcome.SKIPPED.value, record)
    shown = record.outcome.value.upper() if record.outcome != Outcome.PASSED else record.outcome.value
    return Cell(shown, record.outcome.value, record)


def not_run(records: list[ItemRecord]) -> list[tuple[str, str]]:
    """One line per device for the items that did not run, as (lead, reasons): a device this machine lacks, or stages
    blocked by a failure (grouped by the failure)."""
    lines = []
    for device in ordered(record.device for record in records):
        on = [record for record in records if record.device == device]
        missing = [record for record in on if record.unavailable]
        if missing:
            lines.append((f"{device}: {count(len(missing), 'item')} not run: ", missing[0].reason))
        blocked = [record for record in on if record.blocked and not record.unavailable]  # missing devices said
        if blocked:
            by_reason: dict[str, list[str]] = {}
            for record in blocked:
                by_reason.setdefault(record.reason, []).append(record.stage)
            said = "; ".join(f"{reason}: {', '.join(stages)}" for reason, stages in by_reason.items())
            lines.append((f"{device}: {count(len(blocked), 'item')} not run, ", said))
    return lines


def _not_run_lines(records: list[ItemRecord]) -> list[Line]:
    return [[(f"  {lead}", {"yellow": True}), (rest, {})] for lead, rest in not_run(records)]


def _cost_lines(records: list[ItemRecord]) -> list[Line]:
    """What the work a run can leave out cost: each opt-in stage that ran, and sampling completions by generation (an
    online RL trainer's batches), so that turning them on is a known price."""
    lines: list[Line] = []
    for record in records:
        setting = record.opt_in
        if setting and record.ran and record.outcome != Outcome.SKIPPED:
            lines.append(
                [
                    (f"  {record.name} took {record.duration:.1f} s", {"bold": True}),
                    (f" (opt-in: --trainer-{setting.replace('_', '-')})", {}),
                ]
            )
        sampling = record.sampling_seconds
        if sampling:
            lines.append(
                [
                    (f"  sampling completions took {sampling:.1f} s", {"bold": True}),
                    (f" (generation and reward functions, once for every item; in {record.name})", {}),
                ]
            )
    return lines


def _skipped_lines(ran: list[ItemRecord]) -> list[Line]:
    """The items skipped for their own reason (the stage does not apply), one line per reason."""
    by_reason: dict[str, list[str]] = {}
    for record in ran:
        if record.outcome == Outcome.SKIPPED:
            by_reason.setdefault(record.reason, []).append(record.name)
    return [
        [("  skipped ", {"yellow": True}), (f"{', '.join(names)}: {reason}", {})] for reason, names in by_reason.items()
    ]


def count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _unexplained_line(names: list[str]) -> str:
    failures = "failure" if len(names) == 1 else "failures"
    return (
        f"{len(names)} {failures} shown with the library's own error only (not yet explained by pytest-trainer): "
        + " ".join(names)
    )


def _all_passed_line(ran: list[ItemRecord]) -> Line:
    passed = sum(record.outcome == Outcome.PASSED for record in ran)
    if not passed:
        return [("no item ran", {"yellow": True})]
    return [
        (
            f"all {count(passed, 'item')} that ran passed" if passed != 1 else "the 1 item that ran passed",
            {"green": True},
        )
    ]


def _plain(record: ItemRecord) -> dict[str, Any]:
    """A record as the JSON report and the step summary give it (its pictures only in the HTML report)."""
    return {key: value for key, value in asdict(record).items() if key != "pictures"}


def changed_notes(records: list[ItemRecord]) -> list[str]:
    """How the pipeline was run differently from the script (a twin of its model, its precision or vLLM on a machine
    without a GPU), what it put back in the user's tree, the baselines it recorded, what the libraries warned of while
    the script built its Trainer, evaluation rows that are training rows where no setting acts on their metrics, and
    the memory a training step is forecast to take: said once per script."""
    return ordered(
        note
        for record in records
        for note in record.notes
        if note.startswith(
            (
                "model:",
                "not checked:",
                "precision:",
                "not exercised:",
                "put back:",
                "baseline:",
                "the libraries said while the Trainer was built:",
                "evaluation:",
                "launcher:",
                "in this process:",
                "memory[",
            )
        )
    )


def ordered(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _skip_reason(longrepr: Any) -> str:
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")
