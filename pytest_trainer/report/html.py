"""The HTML report (--trainer-html): every pipeline item with its cause and fix, and what the stages drew.

One self-contained file, readable offline and in a CI artifact viewer: CSS inline, pictures as HTML and SVG, no
script (collapsing is `<details>`). The pictures are fragments styled inline, so the same ones go into pytest-html's
report as extras of their item, where this file's stylesheet does not reach. Every text a user wrote (script names,
tokens, causes) is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any, TypeGuard

from pytest_trainer.report.summary import Grid, ItemRecord, PipelineReport, changed_notes, count, not_run
from pytest_trainer.schema import LossCurve, MemoryPicture, Outcome, Pictures, RewardsPicture, RowPicture

#: Outcome -> (background, text colour) of its cell in the grid.
_OUTCOME_COLOURS = {
    Outcome.PASSED.value: ("#dcf2e1", "#166b2f"),
    Outcome.FAILED.value: ("#fddcdc", "#a4161a"),
    Outcome.ERROR.value: ("#fddcdc", "#a4161a"),
    Outcome.SKIPPED.value: ("#fff1cc", "#7a5600"),
    "not run": ("#ececec", "#666"),
}
#: Colours told apart at a glance: tries of the loss curve, parts of the memory forecast.
_PALETTE = ("#2f6fdb", "#e8702a", "#2e9e5b", "#a23fbf", "#c9342f", "#6b7a8f")
_TOKEN = "padding:1px 3px;margin:0 1px;border-radius:3px;white-space:pre;"
_TRAINED = _TOKEN + "background:#a6e3b4;color:#0b3d17;box-shadow:inset 0 -2px #3c9a55"
_UNTRAINED = _TOKEN + "background:#efefef;color:#8c8c8c"
_INPUT = _TOKEN + "background:#e7eefa;color:#1f3b63"
_BOX = "font:13px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;color:#222;margin:6px 0 12px"
_MONO = "font-family:ui-monospace,'SFMono-Regular',Menlo,Consolas,monospace;font-size:12px"


def write(path: Path, report: PipelineReport) -> None:
    """Write the report of every script to `path`, one section each."""
    records = report.records()
    counts = {outcome.value: sum(record.outcome == outcome and record.ran for record in records) for outcome in Outcome}
    counts["not run"] = sum(not record.ran for record in records)
    said = ", ".join(f"{count} {outcome}" for outcome, count in counts.items() if count)
    sections = "\n".join(_script_section(script, items) for script, items in report.by_script().items())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>pytest-trainer report</title><style>{_PAGE_CSS}</style></head>\n<body>\n"
        f"<header><h1>pytest-trainer</h1><p>{count(len(report.by_script()), 'pipeline')}, "
        f"{count(len(records), 'item')}: "
        f"{escape(said)}</p></header>\n{sections}\n</body></html>\n",
        encoding="utf-8",
    )


def pytest_html_extras(pictures: Pictures) -> list[dict[str, Any]]:
    """The item's pictures as pytest-html 4 extras, one each, so one `--html` report carries them."""
    from pytest_html import extras

    return [extras.html(f"<div style='{_BOX}'>{fragment}</div>") for _, fragment in picture_fragments(pictures)]


def picture_fragments(pictures: Pictures) -> list[tuple[str, str]]:
    """(title, HTML fragment styled inline) of each picture a stage drew that this module can draw."""
    shown = []
    for name, (title, draw) in _DRAWINGS.items():
        value = pictures.get(name)
        if value:
            shown.append(
                (
                    title,
                    f"<div class='picture picture-{name}'><div style='font-weight:600;margin:4px 0'>"
                    f"{escape(title)}</div>{draw(value)}</div>",
                )
            )
    return shown


# ---- the page -------------------------------------------------------------------------------------------------


def _script_section(script: str, records: list[ItemRecord]) -> str:
    failed = [record for record in records if record.outcome.bad]
    verdict = (
        f"<span class='verdict bad'>{len(failed)} failed</span>"
        if failed
        else "<span class='verdict good'>no failure</span>"
    )
    parts = [f"<section class='script'><h2>{escape(script)} {verdict}</h2>", _grid(records)]
    parts += [_failure(record) for record in failed]
    changed = changed_notes(records)
    if changed:
        parts.append("<ul class='changed'>" + "".join(f"<li>{escape(note)}</li>" for note in changed) + "</ul>")
    for record in records:
        for title, fragment in picture_fragments(record.pictures):
            parts.append(
                f"<details class='item-picture' open><summary><b>{escape(record.name)}</b> "
                f"{escape(title)}</summary>{fragment}</details>"
            )
    parts.append(_facts_table(records))
    return "\n".join(parts) + "</section>"


def _grid(records: list[ItemRecord]) -> str:
    """Stage by device, as the terminal shows it: the devices where something ran are columns; a device this
    machine lacks is one line with the reason, and the items a failure blocked one line per device naming it."""
    grid = Grid.of(records)
    rows = ["<tr><th>stage</th>" + "".join(f"<th>{escape(device)}</th>" for device in grid.devices) + "</tr>"]
    for stage, cells in grid.rows:
        row = [f"<th>{escape(stage)}</th>"]
        for cell in cells:
            if cell.record is None:
                row.append("<td></td>")
                continue
            title = cell.record.reason or cell.record.diagnosis
            row.append(
                f"<td class='{cell.kind.replace(' ', '-')}' title='{escape(title)}'>{escape(cell.text)}"
                f" <small>{cell.record.duration:.1f} s</small></td>"
            )
        rows.append("<tr>" + "".join(row) + "</tr>")
    lines = [f"[{number}] {escape(reason)}" for reason, number in grid.reasons.items()]
    lines += _not_run_lines(records)
    table = f"<table class='grid'>{''.join(rows)}</table>" if grid.devices else "<p>no item ran</p>"
    return table + "".join(f"<p class='aside'>{line}</p>" for line in lines)


def _not_run_lines(records: list[ItemRecord]) -> list[str]:
    """The terminal's lines of what did not run, the device in bold."""
    lines = []
    for lead, rest in not_run(records):
        device, said = lead.split(":", 1)
        lines.append(f"<b>{escape(device)}</b>:{escape(said + rest)}")
    return lines


def _failure(record: ItemRecord) -> str:
    fix = f"<div class='fix-line'><b>fix</b><span class='fix'>{escape(record.fix)}</span></div>" if record.fix else ""
    unexplained = (
        "<p class='aside'>shown with the library's own error only: pytest-trainer does not explain this failure yet</p>"
        if record.unexplained
        else ""
    )
    return (
        f"<div class='failure'><h3>{escape(record.name)} <span>{record.outcome.value.upper()}</span></h3>"
        f"<div class='cause'>{escape(record.diagnosis)}</div>{fix}{unexplained}</div>"
    )


def _facts_table(records: list[ItemRecord]) -> str:
    """Each item's figures and notes; a note every item of the script carries (how its data was sampled) is shown
    once, on the first item that has it."""
    rows, shown = [], set()
    for record in records:
        fresh = [note for note in record.notes if note not in shown]
        shown.update(fresh)
        if not (record.figures or fresh):
            continue
        figures = "<br>".join(f"{escape(name)}: {value:.4g}" for name, value in record.figures.items())
        notes = "".join(f"<li>{escape(note)}</li>" for note in fresh)
        rows.append(
            f"<tr><th>{escape(record.name)}</th><td class='figures'>{figures}</td><td><ul>{notes}</ul></td></tr>"
        )
    if not rows:
        return ""
    return (
        "<details class='facts'><summary>figures and notes of each item</summary><table>"
        "<tr><th>item</th><th>figures</th><th>notes</th></tr>" + "".join(rows) + "</table></details>"
    )


_PAGE_CSS = (
    """
body{font:14px/1.5 system-ui,-apple-system,'Segoe UI',sans-serif;color:#222;margin:0 auto;max-width:1100px;
  padding:16px 24px;background:#fff}
header h1{margin:0;font-size:22px}header p{margin:2px 0 8px;color:#555}
section.script{border-top:3px solid #ddd;margin-top:18px;padding-top:6px}
h2{font-size:18px;margin:6px 0 10px;font-family:ui-monospace,Menlo,Consolas,monospace}
.verdict{font:600 12px system-ui,sans-serif;padding:2px 8px;border-radius:10px;vertical-align:middle}
.verdict.good{background:#dcf2e1;color:#166b2f}.verdict.bad{background:#fddcdc;color:#a4161a}
table.grid{border-collapse:collapse;margin:4px 0 6px}
table.grid th,table.grid td{border:1px solid #fff;padding:3px 12px;text-align:left;font-size:13px}
table.grid th{background:#f5f5f5;font-weight:600}
table.grid td small{color:inherit;opacity:.6;font-size:11px}
"""
    + "".join(
        f"table.grid td.{kind.replace(' ', '-')}{{background:{back};color:{fore}}}"
        for kind, (back, fore) in _OUTCOME_COLOURS.items()
    )
    + """
table.grid td.failed,table.grid td.error{font-weight:700}
.aside{margin:2px 0;color:#555;font-size:13px}
.failure{border-left:4px solid #c9342f;background:#fff6f6;padding:6px 12px;margin:10px 0;border-radius:0 4px 4px 0}
.failure h3{margin:0 0 4px;font-size:14px;font-family:ui-monospace,Menlo,Consolas,monospace}
.failure h3 span{color:#a4161a}
.cause,.fix{white-space:pre-wrap;overflow-wrap:anywhere}
.fix-line{margin-top:4px;color:#114a1f}
.fix-line b{background:#dcf2e1;padding:0 6px;border-radius:3px;margin-right:6px}
ul.changed{color:#555;font-size:13px;margin:6px 0;padding-left:20px}
details{margin:8px 0}summary{cursor:pointer;color:#333}
details.item-picture{border:1px solid #e6e6e6;border-radius:6px;padding:4px 12px}
details.item-picture>summary{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px}
.picture>div:first-child{display:none}
details.facts table{border-collapse:collapse;font-size:12px;margin-top:4px}
details.facts th,details.facts td{border-top:1px solid #eee;padding:4px 8px;text-align:left;vertical-align:top}
details.facts td.figures{font-family:ui-monospace,Menlo,Consolas,monospace;white-space:nowrap}
details.facts ul{margin:0;padding-left:16px}
"""
)


# ---- the pictures ---------------------------------------------------------------------------------------------


def _rows(rows: list[RowPicture]) -> str:
    """Each row's tokens as the model is fed them, the trained ones highlighted, as Axolotl's preprocess debug
    colours them: what a completion-only loss or a chat template's generation markers really train."""
    per_token = any("trained" in row for row in rows)
    legend = (
        f"<span style='{_TRAINED}'>trained</span> <span style='{_UNTRAINED}'>not trained (label -100)</span>"
        if per_token
        else f"<span style='{_INPUT}'>input token</span>"
    )
    shown = []
    for number, row in enumerate(rows):
        trained = row.get("trained")
        tokens = []
        for index, token in enumerate(row.get("tokens", [])):
            if trained is None:
                style, kind = _INPUT, "token"
            else:
                style, kind = (_TRAINED, "token trained") if trained[index] else (_UNTRAINED, "token untrained")
            tokens.append(
                f"<span class='{kind}' style='{style}'>{escape(_visible(str(token)))}</span>"
                + ("<br>" if "\n" in str(token) else "<wbr>")
            )
        after = []
        if trained is not None:
            after.append(f"{sum(map(bool, trained))} of {len(trained)} tokens trained")
        if row.get("cut"):
            after.append(f"{int(row['cut'])} more tokens not shown")
        target = (
            f"<div style='margin-top:3px'>target: <b class='target' style='{_MONO}'>"
            f"{escape(str(row['target']))}</b></div>"
            if "target" in row
            else ""
        )
        if "asked" in row:
            asked = "".join(
                f"<span class='asked-token' style='{_INPUT}'>{escape(_visible(str(token)))}</span>"
                + ("<br>" if "\n" in str(token) else "<wbr>")
                for token in row["asked"]
            )
            target += (
                "<div style='margin-top:3px;color:#777;font-size:12px'>the same conversation as inference "
                "prompts it (apply_chat_template(messages[:-1], add_generation_prompt=True)):</div>"
                f"<div class='asked' style='{_MONO};line-height:22px'>{asked}</div>"
            )
        shown.append(
            f"<div class='row' style='border:1px solid #e3e3e3;border-radius:5px;padding:5px 8px;margin:6px 0'>"
            f"<div style='color:#777;font-size:12px'>row {number}"
            + (f" &middot; {escape('; '.join(after))}" if after else "")
            + "</div>"
            f"<div style='{_MONO};line-height:22px'>{''.join(tokens)}</div>{target}</div>"
        )
    return (
        f"<div style='font-size:12px;color:#555'>{legend}&emsp;<b style='{_MONO}'>&middot;</b> a space&emsp;"
        f"<b style='{_MONO}'>&crarr;</b> a line break&emsp;padding left out</div>" + "".join(shown)
    )


def _visible(token: str) -> str:
    """A token with its whitespace made visible: a leading space as a middle dot, line breaks and tabs as arrows."""
    return token.replace(" ", "\u00b7").replace("\n", "\u21b5").replace("\t", "\u2192") or "\u2205"


def _loss_curve(picture: LossCurve) -> str:
    """Each try's loss per step on the one batch, with its learning rate and the judged value before and after."""
    tries = [attempt for attempt in picture.get("tries", []) if attempt.get("curve")]
    if not tries:
        return ""
    what = str(picture.get("what", "loss"))
    values = [value for attempt in tries for value in attempt["curve"] if _finite(value)]
    if what == "loss":  # judged in eval mode on the same scale as the curve: drawn as its ends
        values += [attempt[end] for attempt in tries for end in ("before", "after") if _finite(attempt.get(end))]
    if not values:
        return "<p>no finite value to draw</p>"
    steps = max(len(attempt["curve"]) for attempt in tries)
    low, high = min(values), max(values)
    pad = (high - low) * 0.08 or abs(high) * 0.01 or 1.0
    low, high = low - pad, high + pad
    width, height, left, right, top, bottom = 620, 240, 64, 16, 12, 40

    def x(step: float) -> float:
        return left + (width - left - right) * step / max(steps, 1)

    def y(value: float) -> float:
        return top + (height - top - bottom) * (high - value) / (high - low)

    svg = [
        f"<svg class='loss-curve' xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' style='font:11px sans-serif;background:#fcfcfc;"
        "border:1px solid #eee;border-radius:4px'>"
    ]
    for tick in {f"{tick:.4g}": tick for tick in (low + pad, (low + high) / 2, high - pad)}.values():
        svg.append(
            f"<line x1='{left}' x2='{width - right}' y1='{y(tick):.1f}' y2='{y(tick):.1f}' "
            f"stroke='#e5e5e5'/><text x='{left - 10}' y='{y(tick) + 4:.1f}' text-anchor='end' "
            f"fill='#555'>{tick:.4g}</text>"
        )
    for step in sorted({0, *range(1, steps + 1, max(1, steps // 8)), steps}):
        svg.append(f"<text x='{x(step):.1f}' y='{height - bottom + 15}' text-anchor='middle' fill='#555'>{step}</text>")
    svg.append(
        f"<line x1='{left}' x2='{width - right}' y1='{height - bottom}' y2='{height - bottom}' "
        f"stroke='#999'/><line x1='{left}' x2='{left}' y1='{top}' y2='{height - bottom}' stroke='#999'/>"
        f"<text x='{(left + width - right) / 2}' y='{height - 6}' text-anchor='middle' fill='#333'>"
        f"optimizer step on the batch</text><text transform='translate(14 {(top + height - bottom) / 2}) "
        f"rotate(-90)' text-anchor='middle' fill='#333'>{escape(what)}</text>"
    )
    legend = []
    for number, attempt in enumerate(tries):
        colour = _PALETTE[number % len(_PALETTE)]
        points = [(x(step), y(value)) for step, value in enumerate(attempt["curve"], 1) if _finite(value)]
        svg.append(
            f"<polyline class='try' data-rate='{attempt.get('rate', 0):g}' fill='none' "
            f"stroke='{colour}' stroke-width='2' points='" + " ".join(f"{px:.1f},{py:.1f}" for px, py in points) + "'/>"
        )
        if len(points) <= 60:
            svg += [f"<circle cx='{px:.1f}' cy='{py:.1f}' r='3' fill='{colour}'/>" for px, py in points]
        if what == "loss":
            for value, step, shape in (
                (attempt["before"], 0, "before"),
                (attempt["after"], len(attempt["curve"]), "after"),
            ):
                if _finite(value):
                    svg.append(
                        f"<rect class='{shape}' x='{x(step) - 4:.1f}' y='{y(value) - 4:.1f}' "
                        f"width='8' height='8' fill='#fff' stroke='{colour}' stroke-width='2'/>"
                    )
        legend.append(
            f"<div><span style='display:inline-block;width:14px;height:3px;background:{colour};"
            f"vertical-align:middle;margin-right:6px'></span>try {number + 1}: learning rate "
            f"<b>{attempt.get('rate', 0):g}</b>, {count(len(attempt['curve']), 'step')}; {escape(what)} (eval mode) "
            f"<b>{_number(attempt.get('before'))}</b> &rarr; <b>{_number(attempt.get('after'))}</b></div>"
        )
    svg.append("</svg>")
    shortest = min(len(attempt["curve"]) for attempt in tries)
    stopped = (
        f" It stopped after {count(shortest, 'step')}: the loss had already fallen by the thousandth it asks "
        "for, so there is little curve to draw."
        if shortest <= 2
        else ""
    )
    hint = (
        "<div style='color:#777;font-size:12px'>dots and lines: the loss of each step, in train mode (dropout on), "
        f"as training computes it; squares: the loss judged in eval mode before the first step and after the last."
        f"{stopped}</div>"
        if what == "loss"
        else ""
    )
    return "".join(svg) + "".join(legend) + hint


def _memory(picture: MemoryPicture) -> str:
    """The forecast peak of one training step by part, against the GPU's memory when one is known."""
    parts = {str(name): int(value) for name, value in picture.get("parts", {}).items()}
    bars = [(name, value, _PALETTE[index % len(_PALETTE)], "part") for index, (name, value) in enumerate(parts.items())]
    bars.append(("training step peak", int(picture.get("peak", 0)), "#333", "peak"))
    if picture.get("measured"):
        bars.append(("measured on this GPU", int(picture["measured"]), "#777", "measured"))
    evaluation = picture.get("evaluation")
    if evaluation:
        bars.append(
            (
                f"evaluation peak ({int(evaluation.get('rows', 0))} rows)",
                int(evaluation["peak"]),
                "#8a5a00",
                "evaluation",
            )
        )
    budget = int(picture.get("budget") or 0)
    scale = max([value for _, value, _, _ in bars] + [budget, 1])
    line = (
        f"<div style='position:absolute;top:-4px;bottom:-4px;left:{100 * budget / scale:.2f}%;"
        "border-left:2px dashed #c9342f'></div>"
        if budget
        else ""
    )
    rows = []
    for name, value, colour, kind in bars:
        rows.append(
            f"<div class='bar bar-{kind}' data-part='{escape(name)}' style='display:flex;align-items:center;"
            f"gap:10px;margin:3px 0'><div style='width:230px;text-align:right;"
            f"{'font-weight:600;' if kind != 'part' else ''}'>{escape(name)}</div>"
            "<div style='position:relative;flex:1;height:16px;background:#f1f1f1;border-radius:3px'>"
            f"<div style='width:{100 * value / scale:.2f}%;min-width:1px;height:100%;background:{colour};"
            f"border-radius:3px'></div>{line}</div><div style='width:90px;{_MONO}'>{_size(value)}</div></div>"
        )
    said = (
        f"budget <span style='color:#c9342f'>- - -</span> {_size(budget)} of GPU memory"
        if budget
        else "no GPU memory budget (no GPU here, no --trainer-gpu-memory): the forecast is reported only"
    )
    return "".join(rows) + f"<div style='color:#666;font-size:12px;margin-top:4px'>{said}</div>"


def _rewards(picture: RewardsPicture) -> str:
    """Each group's total rewards (one group per prompt): GRPO trains on their differences within a group, so a
    group whose completions all score the same teaches nothing."""
    groups = [list(group) for group in picture.get("total", [])]
    values: list[float] = [value for group in groups for value in group if _finite(value)]
    if not values:
        return "<p>no finite reward to draw</p>"
    functions = picture.get("functions", {})
    ended = list(picture.get("ended", []))
    low, high = min(values), max(values)
    if high == low:
        low, high = low - 1, high + 1
    width, left, right, row_height = 620, 70, 170, 22
    height = row_height * len(groups) + 40

    def x(value: float) -> float:
        return left + (width - left - right) * (value - low) / (high - low)

    svg = [
        f"<svg class='rewards' xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' style='font:11px sans-serif;background:#fcfcfc;border:1px solid #eee;"
        "border-radius:4px'>"
    ]
    for tick in (low, (low + high) / 2, high):
        svg.append(
            f"<line x1='{x(tick):.1f}' x2='{x(tick):.1f}' y1='4' y2='{height - 34}' stroke='#e5e5e5'/>"
            f"<text x='{x(tick):.1f}' y='{height - 22}' text-anchor='middle' fill='#555'>{tick:.3g}</text>"
        )
    svg.append(
        f"<text x='{(left + width - right) / 2}' y='{height - 6}' text-anchor='middle' fill='#333'>"
        "total reward of each completion</text>"
    )
    completion = 0
    for number, group in enumerate(groups):
        middle = 4 + row_height * number + row_height / 2
        finite: list[float] = [value for value in group if _finite(value)]
        spread = max(finite) - min(finite) if finite else 0.0
        flat = spread == 0
        colour = "#c9342f" if flat else "#2f6fdb"
        svg.append(f"<text x='{left - 8}' y='{middle + 4:.1f}' text-anchor='end' fill='#333'>group {number + 1}</text>")
        if finite:
            svg.append(
                f"<line x1='{x(min(finite)):.1f}' x2='{x(max(finite)):.1f}' y1='{middle:.1f}' "
                f"y2='{middle:.1f}' stroke='{colour}' stroke-opacity='.35' stroke-width='6' "
                "stroke-linecap='round'/>"
            )
        for index, value in enumerate(group):
            done = ended[completion] if completion < len(ended) else True
            scores = ", ".join(f"{name} {_number(_at(scored, number, index))}" for name, scored in functions.items())
            completion += 1
            if not _finite(value):
                continue
            svg.append(
                f"<circle class='reward' cx='{x(value):.1f}' cy='{middle:.1f}' r='4.5' "
                f"fill='{colour if done else '#fff'}' stroke='{colour}' stroke-width='1.5'>"
                f"<title>completion {index + 1}: total {value:g} ({escape(scores)})"
                f"{'' if done else '; cut at max_completion_length'}</title></circle>"
            )
        label = "no spread: teaches nothing" if flat else f"spread {spread:.3g}"
        weight = " font-weight='bold'" if flat else ""
        svg.append(
            f"<text class='{'flat' if flat else 'spread'}' x='{width - right + 10}' y='{middle + 4:.1f}' "
            f"fill='{colour}'{weight}>{label}</text>"
        )
    svg.append("</svg>")
    flat_groups = sum(1 for group in groups if len({value for value in group if _finite(value)}) <= 1)
    missing = sum(1 for group in groups for value in group if not _finite(value))
    said = [
        f"{len(groups)} groups, {flat_groups} without spread",
        "filled: the completion ended, hollow: cut at max_completion_length",
        f"reward functions: {', '.join(map(str, functions)) or 'none named'}",
    ]
    if missing:
        said.append(f"{count(missing, 'reward')} missing")
    return "".join(svg) + f"<div style='color:#666;font-size:12px'>{escape('; '.join(said))}</div>"


#: Picture name -> (title, drawing), in the order the pipeline's stages run.
_DRAWINGS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "rows": ("rows of the first batch, as the model is fed them", _rows),
    "asked": ("rows as trained, each beside the prompt inference gives the model", _rows),
    "rewards": ("total reward of each completion, group by group", _rewards),
    "loss_curve": ("overfitting one batch: the loss per step", _loss_curve),
    "memory": ("memory of one training step, forecast by part", _memory),
}


# ---- small helpers --------------------------------------------------------------------------------------------


def _finite(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(value: Any) -> str:
    return f"{value:.4g}" if _finite(value) else "n/a"


def _at(groups: Any, group: int, index: int) -> Any:
    try:
        return groups[group][index]
    except (IndexError, TypeError):
        return None


def _size(count: int) -> str:
    """Bytes in the unit a person reads: `812 KiB`, `43.1 MiB`, `1.27 GiB`."""
    for unit, power in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 2**power:
            return f"{count / 2**power:.3g} {unit}"
    return f"{count} B"
