"""Every check is declared with the stages that run it and the subject it reads (`catalogue`), read from the package's
source: a function that finds a defect and is not declared fails here, as does a declaration of an unknown stage."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from pytest_trainer.catalogue import SUBJECTS

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_trainer"
#: Modules that say what went wrong without looking for it: the error types and their shared messages, the
#: explanations of an error already raised, the usage slips, the command and option readers, the reports.
NOT_CHECKS = (
    "diagnosis.py",
    "explanations/",
    "usage.py",
    "commands.py",
    "options.py",
    "report/",
    "catalogue.py",
    "items.py",
)
#: What a check raises or returns.
ERRORS = {"Finding", "PipelineFailure"}


def _called(node: ast.AST) -> str | None:
    function = node.func if isinstance(node, ast.Call) else None
    if isinstance(function, ast.Attribute):
        return function.attr
    return function.id if isinstance(function, ast.Name) else None


def _own_nodes(function: ast.FunctionDef) -> list[ast.AST]:
    """The nodes of a function's body, without those of the functions and classes defined inside it."""
    found: list[ast.AST] = []
    todo: list[ast.AST] = list(function.body)
    while todo:
        node = todo.pop()
        found.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))
    return found


def finds_defects(function: ast.FunctionDef) -> bool:
    """Whether a function raises or returns a Finding or a PipelineFailure it builds itself, or is named as a check.

    One that takes the error raised (`error`) explains it; one that takes nothing only words a message."""
    parameters = [argument.arg for argument in function.args.args + function.args.kwonlyargs]
    if "error" in parameters or not parameters:
        return False
    if function.name.startswith("check_"):
        return True
    for node in _own_nodes(function):
        if isinstance(node, (ast.Raise, ast.Return)):
            value = node.exc if isinstance(node, ast.Raise) else node.value
            if value is not None and _called(value) in ERRORS:
                return True
    return False


def words_a_message(function: ast.FunctionDef) -> bool:
    """Whether a function is declared a message builder (`@message`): it words a failure from facts a check found."""
    return any(isinstance(node, ast.Name) and node.id == "message" for node in function.decorator_list)


def declaration(function: ast.FunctionDef) -> ast.Call | None:
    return next(
        (node for node in function.decorator_list if isinstance(node, ast.Call) and _called(node) == "checks"), None
    )


@functools.cache
def functions(skipped: tuple[str, ...] = ()) -> list[tuple[str, ast.FunctionDef]]:
    """(`module.qualname`, definition) of every module-level function and method of the package, outside the files
    and folders `skipped`."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(skipped):
            continue
        module = relative.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef):
                found.append((f"{module}.{node.name}", node))
            elif isinstance(node, ast.ClassDef):
                found += [
                    (f"{module}.{node.name}.{item.name}", item)
                    for item in node.body
                    if isinstance(item, ast.FunctionDef)
                ]
    return found


def stage_names() -> set[str]:
    names = set()
    for path in (PACKAGE / "stages").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and _called(node) == "Stage" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant):
                    names.add(first.value)
    return names


def candidates() -> list[str]:
    """The checks that must be declared: public functions that find defects, outside the modules that do not look."""
    found = []
    for name, function in functions(NOT_CHECKS):
        if function.name.startswith("_") or (name.startswith("stages.") and function.name == "run"):
            continue
        if words_a_message(function):
            continue
        if finds_defects(function):
            found.append(name)
    return found


def test_every_check_is_declared() -> None:
    wanted = set(candidates())
    undeclared = [name for name, function in functions() if name in wanted and declaration(function) is None]
    assert undeclared == [], "declare these checks with @catalogue.checks(stage, ..., reads=SUBJECT)"


def test_every_declaration_names_stages_and_a_subject_that_exist_and_says_what_it_checks() -> None:
    stages = stage_names()
    wrong = []
    for name, function in functions():
        declared = declaration(function)
        if declared is None:
            continue
        named = [arg.value for arg in declared.args if isinstance(arg, ast.Constant)]
        reads = next((keyword.value for keyword in declared.keywords if keyword.arg == "reads"), None)
        subject = reads.id.lower() if isinstance(reads, (ast.Name,)) else getattr(reads, "attr", "").lower()
        if not named or set(named) - stages or subject not in SUBJECTS or not ast.get_docstring(function):
            wrong.append(f"{name}: stages {named}, reads {subject!r}, docstring {bool(ast.get_docstring(function))}")
    assert wrong == []


def test_the_rule_tells_a_check_from_a_helper() -> None:
    source = """
def check_rows(batch):
    pass

def judge(batch):
    if batch:
        raise diagnosis.Finding("cause", "fix")

def builds(batch):
    def inner():
        raise Finding("cause", "fix")
    return inner

def explains(error, pipeline):
    return diagnosis.PipelineFailure("cause", "fix")

def words():
    return diagnosis.PipelineFailure("cause", "fix")
"""
    found = {node.name: finds_defects(node) for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}
    assert found == {"check_rows": True, "judge": True, "builds": False, "explains": False, "words": False}


def test_a_message_builder_beside_its_checks_is_declared_as_one() -> None:
    source = """
@message
def label_too_high(label, width):
    if label > width:
        return diagnosis.PipelineFailure("cause", "fix")
    return diagnosis.PipelineFailure("other cause", "fix")

def too_high(label, width):
    return diagnosis.PipelineFailure("cause", "fix")
"""
    nodes = [node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)]
    assert [words_a_message(node) for node in nodes] == [True, False]
    assert all(finds_defects(node) for node in nodes)  # undeclared, the builder would be taken for a check


#: What a message builder is given: plain values a check found (a row number, a width, names), never a subject.
PLAIN_VALUES = {"int", "float", "str", "bool", "None", "Sequence", "list", "tuple"}


def test_a_message_builder_is_given_plain_values_not_a_subject() -> None:
    """A builder words what its check found; one given the pipeline, a trainer, a split or a batch could decide a
    defect itself and would stay out of the catalogue."""
    import re

    reading = [
        f"{name}({argument.arg}: {ast.unparse(argument.annotation) if argument.annotation else '?'})"
        for name, function in functions()
        if words_a_message(function)
        for argument in function.args.args + function.args.kwonlyargs
        if argument.annotation is None
        or not set(re.findall(r"[A-Za-z_.]+", ast.unparse(argument.annotation))) <= PLAIN_VALUES
    ]
    assert reading == []


def test_no_error_type_module_words_a_check_s_message() -> None:
    """`diagnosis` keeps the error types and what every stage uses with them; a message lives beside its check."""
    tree = ast.parse((PACKAGE / "diagnosis.py").read_text())
    builders = [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and finds_defects(node)
    ]
    assert builders == []


@pytest.mark.parametrize("subject", sorted(SUBJECTS))
def test_each_subject_is_read_by_a_declared_check(subject: str) -> None:
    read = set()
    for _, function in functions():
        declared = declaration(function)
        if declared is None:
            continue
        for keyword in declared.keywords:
            if keyword.arg == "reads":
                read.add(keyword.value.id.lower() if isinstance(keyword.value, ast.Name) else "")
    assert subject in read


def test_the_ignored_label_is_named_not_written_as_a_number() -> None:
    """-100 is `tasks.IGNORE_INDEX` in the code (prose may say it)."""
    written = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.UnaryOp)
                and isinstance(node.op, ast.USub)
                and isinstance(node.operand, ast.Constant)
                and node.operand.value == 100
            ):
                written.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert written == ["tasks.py:16"]
