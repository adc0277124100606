"""The package's layers run one way: no module imports one of a higher layer, and no import circle.

Every import between the package's modules counts, at the top of a module or inside a function, typing-only ones
too. A new module must be given its layer here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_trainer"

#: Top to bottom. A module may import its own layer and the layers below it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("pytest_trainer", "pytest_trainer.plugin"),  # the public API and the hooks
    (
        "pytest_trainer.items",
        "pytest_trainer.session",
        "pytest_trainer.options",
        "pytest_trainer.usage",
        "pytest_trainer.report",
        "pytest_trainer.report.summary",
        "pytest_trainer.report.html",
    ),
    ("pytest_trainer.plan",),  # the items, ordered from the stages' declarations
    ("pytest_trainer.stages",),  # the registry of stages and the runner of one
    ("pytest_trainer.stages.*",),  # one module per stage, and what a stage is
    (
        "pytest_trainer.fed_checks",
        "pytest_trainer.task_checks",
        "pytest_trainer.explanations",
        "pytest_trainer.explanations.pipeline_rows",
        "pytest_trainer.strategies",
        "pytest_trainer.property_runs",
        "pytest_trainer.memory_forecast",
        "pytest_trainer.accumulation",
        "pytest_trainer.reward_checks",
        "pytest_trainer.vision_text",
        "pytest_trainer.distributed",
        "pytest_trainer.distributed.judges",
        "pytest_trainer.report.pictures",
        "pytest_trainer.asked",
        "pytest_trainer.asked.checks",
        "pytest_trainer.asked.packing",
        "pytest_trainer.asked.pairs",
        "pytest_trainer.overlap",
        "pytest_trainer.schedules",
        "pytest_trainer.pixels",
        "pytest_trainer.audio",
    ),
    ("pytest_trainer.pipeline",),  # one Trainer as the stages see it
    (
        "pytest_trainer.families",
        "pytest_trainer.fed_data",
        "pytest_trainer.training",
        "pytest_trainer.losses",
        "pytest_trainer.adapters",
        "pytest_trainer.sampling",
        "pytest_trainer.embeddings",
        "pytest_trainer.asked.view",
        "pytest_trainer.distributed.rank",
        "pytest_trainer.distributed.processes",
        "pytest_trainer.distributed.sharding",
    ),  # trainer families, fed data, training runs, one rank of several
    (
        "pytest_trainer.script_runner",
        "pytest_trainer.engines",
        "pytest_trainer.explanations.script_rows",
    ),  # a script up to trainer.train()
    (
        "pytest_trainer.twin",
        "pytest_trainer.twin.loading",
        "pytest_trainer.twin.checkpoint",
        "pytest_trainer.twin.shrink",
    ),  # twins of real checkpoints
    ("pytest_trainer.tasks",),  # what a task's labels and inputs are
    (
        "pytest_trainer.model_facts",
        "pytest_trainer.tables",
        "pytest_trainer.devices",
        "pytest_trainer.settings",
        "pytest_trainer.commands",
        "pytest_trainer.diagnosis",
        "pytest_trainer.timeouts",
        "pytest_trainer.base_frame",
        "pytest_trainer.frames",
        "pytest_trainer.user_files",
        "pytest_trainer.metric_settings",
        "pytest_trainer.renames",
        "pytest_trainer.explanations.registry",
        "pytest_trainer.gc_freezer",
        "pytest_trainer.huge_pages",
        "pytest_trainer.extensions",
        "pytest_trainer.catalogue",
        "pytest_trainer.schema",
    ),  # facts
)
#: What each layer holds, for the layer table of CONTRIBUTING.md (docs/generate.py).
ROLES: tuple[str, ...] = (
    "the public API and the hooks",
    "the items, the session, the options, the usage slips, the terminal, JSON and HTML reports",
    "the plan: the items, ordered from the stages' declarations",
    "the registry of stages and the runner of one",
    "one module per stage, and what a stage is",
    "what the stages share: checks of the fed data and the task, the pipeline's explanation rows, strategies, "
    "forecasts, the learning rate over the run, the images against their processor, the audio against its feature "
    "extractor, the judges of several processes, the pictures",
    "one Trainer as the stages see it",
    "trainer families, the fed data, training runs, losses, adapters, one rank of several processes",
    "running a script up to trainer.train(), the engines it asks for that this machine cannot run, and the "
    "explanation rows of the errors it raises",
    "twins of real checkpoints: where their files are, their configs narrowed, the models built in their place",
    "what a task's labels and inputs are",
    "facts: the model, tables, devices, settings, commands as the user runs them, the error base, whose code a frame runs, the user's files, "
    "metric settings, renames, what an explanation row is, the objects kept out of the garbage collector's way, huge pages for torch's large tensors, what "
    "installed packages add, the declared checks, what stages hand later stages",
)


def test_every_layer_says_what_it_holds() -> None:
    assert len(ROLES) == len(LAYERS)


def modules(package: Path) -> dict[str, Path]:
    """Every module of the package by its dotted name."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` imports, wherever in the module the import is."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            targets = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known] or [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def layer_of(name: str, layers: tuple[tuple[str, ...], ...]) -> int | None:
    for index, names in enumerate(layers):
        if name in names or any(pattern.endswith(".*") and name.startswith(pattern[:-1]) for pattern in names):
            return index
    return None


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def problems(package: Path, layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """Every module without a layer, every import of a higher layer, and every import circle."""
    found_modules = modules(package)
    known = set(found_modules)
    graph = {name: imports(name, path, known) for name, path in found_modules.items()}
    found = [f"{name} has no layer in tests/unit/test_layers.py" for name in graph if layer_of(name, layers) is None]
    for name, targets in sorted(graph.items()):
        own = layer_of(name, layers)
        for target in sorted(targets):
            theirs = layer_of(target, layers)
            if own is not None and theirs is not None and theirs < own:
                found.append(f"{name} imports {target}, of a higher layer")
    found += [f"import circle: {' -> '.join(circle)}" for circle in circles(graph)]
    return found


def test_the_package_layers_run_one_way() -> None:
    assert problems(PACKAGE, LAYERS) == []


def test_every_layer_names_modules_that_exist() -> None:
    names = set(modules(PACKAGE))
    missing = [name for layer in LAYERS for name in layer if not name.endswith(".*") and name not in names]
    assert missing == []


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (
            {"low.py": "from pkg import high\n", "high.py": "from pkg import low\n"},
            ["pkg.low imports pkg.high, of a higher layer", "import circle: pkg.high -> pkg.low"],
        ),
        (
            {"low.py": "def f():\n    from pkg.high import thing\n", "high.py": ""},
            ["pkg.low imports pkg.high, of a higher layer"],
        ),
        (
            {"low.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import high\n", "high.py": ""},
            ["pkg.low imports pkg.high, of a higher layer"],
        ),
        (
            {"low.py": "", "high.py": "from pkg.low import x\n", "stray.py": ""},
            ["pkg.stray has no layer in tests/unit/test_layers.py"],
        ),
        ({"low.py": "", "high.py": "from pkg import low\n"}, []),
    ],
)
def test_the_check_finds_upward_imports_circles_and_unplaced_modules(
    tmp_path: Path, files: dict[str, str], expected: list[str]
) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, text in files.items():
        (package / name).write_text(text)
    assert problems(package, (("pkg", "pkg.high"), ("pkg.low",))) == expected


def test_loading_the_plugin_and_its_plan_imports_nothing_heavy() -> None:
    """`pytest --help` in a repository that does not use the plugin stays fast: the stages' declarations are read,
    their checks' libraries are not imported."""
    import subprocess
    import sys

    heavy = ("torch", "numpy", "pyarrow", "hypothesis", "transformers", "datasets")
    code = f"import sys, pytest_trainer.plugin, pytest_trainer.plan\nprint([m for m in {heavy!r} if m in sys.modules])"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE.parent)
    assert found.stdout.strip() == "[]", found.stdout + found.stderr


HEAVY = ("torch", "transformers", "datasets", "accelerate", "trl", "peft")


def test_the_unit_tests_import_no_heavy_library() -> None:
    """Every module of tests/unit, imported in a fresh interpreter, leaves torch and the libraries built on it out:
    the unit tests run in seconds because nothing they reach imports them."""
    import subprocess
    import sys

    unit = Path(__file__).resolve().parent
    names = sorted(path.stem for path in unit.glob("test_*.py"))
    script = (
        f"import sys; sys.path.insert(0, {str(unit)!r}); import {', '.join(names)}; "
        f"print(' '.join(name for name in {HEAVY!r} if name in sys.modules))"
    )
    imported = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert imported.strip() == "", f"tests/unit imports {imported.strip()}"


def test_running_a_script_imports_no_pipeline_check() -> None:
    """The script runner needs only the script half of the explanations: in a fresh interpreter (where a package's
    `__init__` runs too, which the layer walk above does not see), importing it loads no pipeline row, no check of
    the fed data and no pipeline. Every torchrun rank starts this way."""
    import subprocess
    import sys

    pipeline_side = ("pipeline", "fed_checks", "fed_data", "explanations.pipeline_rows", "vision_text", "task_checks")
    names = [f"pytest_trainer.{name}" for name in pipeline_side]
    code = f"import sys, pytest_trainer.script_runner\nprint([m for m in {names!r} if m in sys.modules])"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE.parent)
    assert found.stdout.strip() == "[]", found.stdout + found.stderr


def imports_inside_functions(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import inside a function of a module."""
    found = []
    for function in ast.walk(ast.parse(path.read_text())):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                if isinstance(node, ast.Import):
                    found += [(node.lineno, alias.name) for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    found.append((node.lineno, node.module))
    return found


def test_an_import_inside_a_function_is_never_of_the_standard_library_or_pytest() -> None:
    """An import is put off to the call only for what would slow or break start-up (a heavy library, a module that
    imports one, an optional dependency, a stage's checks); the standard library and pytest are imported at the top."""
    import sys

    light = set(sys.stdlib_module_names) | {"pytest"}
    found = [
        f"{path.relative_to(PACKAGE)}:{line} imports {module}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, module in imports_inside_functions(path)
        if module.split(".")[0] in light
    ]
    assert found == []
