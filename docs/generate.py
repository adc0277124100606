"""Write again the parts of the docs that mirror a registry of the code: `python docs/generate.py`.

A block between `<!-- generated: NAME -->` and `<!-- end generated -->` in a Markdown page of the repository holds the
table NAME makes from its registry: `options` from `pytest_trainer.options.OPTIONS`, `errors` from the explanation
table, `fallbacks` from the fixes said where no row explains an error, `layers` from `tests/unit/test_layers.py`,
`checks` from the checks declared in `pytest_trainer.catalogue`.
Only those blocks are written; `tests/e2e/test_docs.py` fails when one is stale, so a change to a registry comes with
its page.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The pages that hold generated blocks.
PAGES = ("docs/options.md", "docs/errors.md", "docs/checks.md", "CONTRIBUTING.md")
BLOCK = re.compile(r"(<!-- generated: (\w+) -->\n)(.*?)(<!-- end generated -->)", re.DOTALL)


def _code(text: str) -> str:
    """Text as inline code in a table cell: backticks inside are kept, pipes escaped."""
    fence = "``" if "`" in text else "`"
    padding = " " if "`" in text else ""
    return fence + padding + _cell(text) + padding + fence


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def options_table() -> str:
    from pytest_trainer.options import OPTIONS

    rows = ["| option | ini key | what it does |", "| --- | --- | --- |"]
    for option in OPTIONS:
        flag = option.flag if option.switch else f"{option.flag}={option.metavar}"
        repeated = " (repeatable)" if option.repeated else ""
        key = (
            f"`{option.key}`"
            + (" (one a line)" if option.ini == "paths" else " (true/false)" if option.ini == "bool" else "")
            if option.ini
            else ""
        )
        rows.append(f"| `{flag}`{repeated} | {key} | {_cell(option.help)} |")
    return "\n".join(rows) + "\n"


def errors_table() -> str:
    from pytest_trainer import explanations

    rows = ["| error you would see | cause named | stage |", "| --- | --- | --- |"]
    rows += [f"| {_code(row.seen)} | {_cell(row.name)} | {row.stage} |" for row in explanations.table_rows()]
    return "\n".join(rows) + "\n"


def fallbacks() -> str:
    from pytest_trainer import diagnosis, script_runner

    return (
        "- a stage's item: `fix: "
        + diagnosis.UNEXPLAINED_FIX.format(part="<the part>")
        + "`;\n- the `load` item, where a library raised: `fix: "
        + script_runner.LIBRARY_FIX.format(library="<the library>")
        + "`;\n- the `load` item, where the script's own code raised: ``fix: "
        + script_runner.SCRIPT_FIX.format(script="train.py")
        + "``.\n"
    )


def layers_table() -> str:
    spec = importlib.util.spec_from_file_location("layers_test", ROOT / "tests" / "unit" / "test_layers.py")
    assert spec is not None and spec.loader is not None
    layers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layers)
    rows = ["| layer | what it holds | modules |", "| --- | --- | --- |"]
    for number, (modules, role) in enumerate(zip(layers.LAYERS, layers.ROLES, strict=True), start=1):
        names = ", ".join(f"`{name.removeprefix('pytest_trainer.') or name}`" for name in modules)
        rows.append(f"| {number} | {role} | {names} |")
    return "\n".join(rows) + "\n"


def checks_table() -> str:
    import importlib
    import pkgutil

    import pytest_trainer
    from pytest_trainer import catalogue, plan

    for info in pkgutil.walk_packages(pytest_trainer.__path__, "pytest_trainer."):
        importlib.import_module(info.name)  # a module's checks are declared when it is imported
    order = {name: rank for rank, name in enumerate((plan.LOAD, *plan.STAGES, *plan.OPT_IN))}
    rows = ["| stage | check | reads | what it checks |", "| --- | --- | --- | --- |"]
    for check in sorted(catalogue.declared(), key=lambda check: (order.get(check.stages[0], 99), check.name)):
        others = f" (also {', '.join(check.stages[1:])})" if check.stages[1:] else ""
        rows.append(f"| {check.stages[0]}{others} | `{check.name}` | {check.reads} | {_cell(check.summary)} |")
    subjects = "\n".join(f"- **{name}**: {what}" for name, what in catalogue.SUBJECTS.items())
    return f"{subjects}\n\n" + "\n".join(rows) + "\n"


GENERATORS: dict[str, Callable[[], str]] = {
    "checks": checks_table,
    "options": options_table,
    "errors": errors_table,
    "fallbacks": fallbacks,
    "layers": layers_table,
}


def rendered(text: str) -> str:
    """The page with each generated block made anew."""
    return BLOCK.sub(lambda match: match[1] + GENERATORS[match[2]]() + match[4], text)


def stale() -> list[str]:
    """The pages whose generated blocks differ from what the registries make now."""
    found = []
    for page in PAGES:
        text = (ROOT / page).read_text()
        if not BLOCK.search(text) or rendered(text) != text:
            found.append(page)
    return found


def main() -> None:
    sys.path.insert(0, str(ROOT))
    for page in PAGES:
        path = ROOT / page
        text = path.read_text()
        new = rendered(text)
        if new != text:
            path.write_text(new)
            print(f"wrote {page}")


if __name__ == "__main__":
    main()
