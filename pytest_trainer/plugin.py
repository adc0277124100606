"""pytest hooks and fixtures of pytest-trainer. Each is a few lines; the work is in the modules they call."""

from __future__ import annotations

import os
import zlib
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

from pytest_trainer import devices, extensions, options, usage
from pytest_trainer.commands import Command, CommandError, parse, script_command
from pytest_trainer.diagnosis import ScriptError, TrainerError
from pytest_trainer.families import registered
from pytest_trainer.items import GivenScript, StageItem, TrainerCommand, TrainerScript, stated_failure
from pytest_trainer.plan import DEVICES, LOAD, OPT_IN, STAGES, Step, cpu_first, plan
from pytest_trainer.report import summary
from pytest_trainer.schema import ItemFacts, Pictures, Sampling
from pytest_trainer.session import ALL, has_session, session_of, start_session
from pytest_trainer.settings import MODELS, Settings

if TYPE_CHECKING:
    from transformers import Trainer

    from pytest_trainer.pipeline import Pipeline
    from pytest_trainer.stages import TrainerStage

MARKER = "trainer_pipeline"
#: Why an item did not run, for the report: "blocked" (a stage it needs failed) or "unavailable" (its device).
_NOT_RUN = pytest.StashKey[Literal["blocked", "unavailable"]]()


# ---- configuration and collection ---------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    options.register(parser)


def pytest_load_initial_conftests(early_config: pytest.Config, args: list[str]) -> None:
    misspelt = usage.misspelt(args, [option.flag for option in options.OPTIONS])
    if misspelt:
        raise pytest.UsageError(misspelt)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", options.MARKER_LINE)
    registered()  # the installed packages' families: what cannot be loaded stops the run here, as stages do
    refused = extensions.problems()
    if refused:
        raise pytest.UsageError("\n".join(refused))
    settings = options.resolve(config)
    start_session(config, settings)
    given = config.getoption("trainer_module") or config.getoption("trainer_command")
    if given and config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = []  # `pytest --trainer-module=train.py` alone tests the script, not testpaths too
    for script in (*settings.modules, *(command.file for command in settings.commands)):
        if all(Path(arg.split("::")[0]).resolve() != script for arg in config.args):
            config.args.append(str(script))  # so it is collected even outside the folders pytest walks
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(), "trainer-xdist")
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(ReportHooks(settings), "trainer-report")


def pytest_unconfigure(config: pytest.Config) -> None:
    if has_session(config):
        session_of(config).close()


def pytest_report_header(config: pytest.Config) -> list[str]:
    settings = session_of(config).settings
    if not settings.modules and not settings.commands:
        return []
    named = [path.name for path in settings.modules] + [f"`{command.text}`" for command in settings.commands]
    return [f"trainer: {', '.join(named)}; stages: {','.join(settings.stages)}; devices: {','.join(settings.devices)}"]


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> Generator[None, Any, Any]:
    collected = yield
    settings = session_of(parent.config).settings
    resolved = file_path.resolve()
    # A command is named after itself, and collected from the file it runs first (several commands may share one).
    ours: list[pytest.Collector] = [
        TrainerCommand.from_parent(
            parent, path=file_path, name=command.text, nodeid=_command_id(command, parent.config), command=command
        )
        for command in settings.commands
        if command.file.resolve() == resolved
    ]
    if resolved in settings.modules:
        script = TrainerScript.from_parent(parent, path=file_path)
        if not script.nodeid:  # a script outside the rootdir (an installed library's, say) is named by its file
            script = TrainerScript.from_parent(parent, path=file_path, nodeid=file_path.name)
        ours.insert(0, script)
    if ours:  # the script is ours alone: no other collector may import it as a test module
        return ours
    if file_path.suffix == ".py" and file_path.resolve() in _given(parent.config) and usage.training_script(file_path):
        return [GivenScript.from_parent(parent, path=file_path)]
    return collected


def _command_id(command: Command, config: pytest.Config) -> str:
    """A command's node id: the command, under the folder it runs from where that is not the rootdir (so that pytest,
    which shows node ids from where it was started, shows the command as given)."""
    cwd = command.cwd
    if cwd is None or cwd == config.rootpath or not cwd.is_relative_to(config.rootpath):
        return command.text
    return f"{cwd.relative_to(config.rootpath).as_posix()}/{command.text}"


_GIVEN = pytest.StashKey[set[Path]]()


def _given(config: pytest.Config) -> set[Path]:
    """The files named on the command line, resolved once."""
    if _GIVEN not in config.stash:
        config.stash[_GIVEN] = {(config.invocation_params.dir / arg.split("::")[0]).resolve() for arg in config.args}
    return config.stash[_GIVEN]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is None:
        return
    if "_trainer_step" not in metafunc.fixturenames:
        name = metafunc.definition.name
        pytest.fail(
            f"{metafunc.definition.nodeid}: a test marked {MARKER} must take the trainer_stage fixture, "
            f"e.g. def {name}(trainer_stage): trainer_stage.run()",
            pytrace=False,
        )
    settings = session_of(metafunc.config).settings
    source = f"{MARKER} marker of {metafunc.definition.nodeid}"
    # A script to run (module=) has a load item of its own, as with --trainer-module, unless stages= leaves it out;
    # a `trainer` fixture builds the Trainer itself, and an error there is that fixture's, in each test's setup.
    runs = marker.kwargs.get("module") or marker.kwargs.get("command")
    choices = (LOAD, *STAGES) if runs else STAGES
    stages = options.parse_choices(marker.kwargs.get("stages") or choices, choices, source)
    on = options.parse_choices(marker.kwargs.get("devices") or DEVICES, DEVICES, source)
    devices_on = [device for device in on if device in settings.devices]
    steps = [Step(LOAD, devices_on[0])] if LOAD in stages and devices_on else []
    steps += [
        step for step in plan([stage for stage in stages if stage in settings.stages], devices_on) if step.stage != LOAD
    ]
    metafunc.parametrize("_trainer_step", steps, ids=[step.marker_id for step in steps], indirect=True)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    steps = {id(item): step for item in items if (step := _step_of(item)) is not None}
    items[:] = cpu_first(items, steps)


class XdistHooks:
    """Registered only with pytest-xdist: every item of one script runs on one worker, which loads it once."""

    def pytest_configure(self, config: pytest.Config) -> None:
        # loadfile sends all items of a file, hence of a script, to one worker. (loadgroup would need
        # node-id rewriting that pytest 9.2 ignores: pytest-xdist issue 1386.)
        settings = session_of(config).settings
        if getattr(config.option, "dist", "no") == "load" and (settings.modules or settings.commands):
            config.option.dist = "loadfile"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    step = _step_of(item)
    if step is None:
        return report
    error = call.excinfo.value if call.excinfo is not None else None
    if report.failed and report.when == "call":
        _block_what_needs(item, step, error)
        if isinstance(error, TrainerError) and not isinstance(item, StageItem):  # a marked test: told as items are
            report.longrepr = stated_failure(step.name, error, item.path)
    if report.skipped and isinstance(report.longrepr, tuple):
        path, line, _ = item.reportinfo()  # a skip points at the script or the marked test, not the plugin's source
        report.longrepr = (str(path), (line or 0) + 1, report.longrepr[2])
    report.user_properties.append((summary.PROPERTY, _facts(item, step, call).to_json()))
    pictures = _pictures(item, call)
    if pictures:
        report.trainer_pictures = pictures  # a report attribute: it travels from xdist workers, not into junit
        if item.config.pluginmanager.hasplugin("html") and item.config.getoption("htmlpath", None):  # pytest-html
            from pytest_trainer.report import html

            report.extras = [*getattr(report, "extras", []), *html.pytest_html_extras(pictures)]
    return report


def _block_what_needs(item: pytest.Item, step: Step, error: BaseException | None) -> None:
    """After a failure: every item of a script that did not load, or the stages that need this one, skip."""
    session = session_of(item.config)
    if isinstance(error, ScriptError):
        session.block(_pipeline_key(item), ALL, ALL, f"the Trainer did not load (see {step.name})")
    elif getattr(error, "blocks", True):  # a finding that leaves training working blocks nothing
        session.block(_pipeline_key(item), step.device, step.stage, f"blocked by {step.name}")


class ReportHooks:
    """Registered on the main process only: gathers every item's report (a worker's too) and shows the result."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.report = summary.PipelineReport()
        #: The reports written at the session's end, named last in the terminal (pytest-html names its file too).
        self.written: list[tuple[str, Path]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.report.add(report)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        expression = terminalreporter.config.option.keyword
        deselected = [
            (item.name, step.stage) for item in terminalreporter.stats.get("deselected", []) if (step := _step_of(item))
        ]
        if expression and deselected and not self.report.by_script():  # -k left no pipeline item
            names, stages = zip(*deselected, strict=True)
            terminalreporter.write_line(usage.deselected(expression, names, stages))
        for title, lines in self.report.terminal_sections():
            terminalreporter.write_sep("-", title)
            for line in lines:  # pieces with pytest's markup: colour as pytest's own lines, --color and NO_COLOR kept
                terminalreporter.ensure_newline()
                for text, markup in line:
                    terminalreporter.write(text, **markup)
                terminalreporter.line("")
        for what, path in self.written:
            terminalreporter.write_sep("-", f"pytest-trainer {what}: {path.resolve().as_uri()}")

    def pytest_sessionfinish(self) -> None:
        """Writes the reports; the terminal summary, which pytest shows after this hook, names them."""
        if not self.report.by_script():
            return
        if self.settings.report is not None:
            self.report.write_json(self.settings.report)
            self.written.append(("JSON report", Path(self.settings.report)))
        if self.settings.html is not None:
            from pytest_trainer.report import html

            html.write(self.settings.html, self.report)
            self.written.append(("HTML report", Path(self.settings.html)))
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if step_summary:
            with open(step_summary, "a", encoding="utf-8") as summary:
                summary.write(self.report.markdown())


# ---- fixtures -------------------------------------------------------------------------------------


@pytest.fixture
def _trainer_step(request: pytest.FixtureRequest) -> Step:
    step = getattr(request, "param", None) or getattr(request.node, "step", None)
    if not isinstance(step, Step):
        pytest.fail(f"{request.node.nodeid}: pipeline fixtures need @pytest.mark.{MARKER}", pytrace=False)
    return step


@pytest.fixture
def pipeline_device(request: pytest.FixtureRequest, _trainer_step: Step) -> str:
    """The device of this pipeline item, "cpu" or "cuda"; the test is skipped where it cannot run."""
    reason = devices.unavailable_reason(_trainer_step.device)
    if reason:
        request.node.stash[_NOT_RUN] = "unavailable"
        pytest.skip(reason)
    return _trainer_step.device


@pytest.fixture
def trainer(request: pytest.FixtureRequest) -> Trainer:
    """The Trainer under test. Define your own `trainer` fixture to test a Trainer you build."""
    if not _script_of(request.node):
        pytest.fail(
            f"{request.node.nodeid}: no Trainer to test. Define a `trainer` fixture in conftest.py that "
            f"returns one, or give the marker the script: @pytest.mark.{MARKER}(module='train.py')",
            pytrace=False,
        )
    pipeline = _pipeline(request)
    # the script's own items may have left a shared training run: its starting weights back
    pipeline.end_fixed_batch_runs()
    return pipeline.trainer


@pytest.fixture
def trainer_stage(request: pytest.FixtureRequest, _trainer_step: Step, pipeline_device: str) -> Iterator[TrainerStage]:
    """This item's pipeline stage on its device; `.run()` checks it and returns a StageResult. A run that left the
    CUDA context unusable tells the session, which skips the later cuda items."""
    from pytest_trainer.stages import TrainerStage

    session = session_of(request.config)
    reason = session.blocker(_pipeline_key(request.node), pipeline_device, _trainer_step.stage)
    if reason:
        request.node.stash[_NOT_RUN] = "blocked"
        pytest.skip(reason)
    session.import_libraries()
    stage = TrainerStage(
        lambda: _pipeline(request),
        _trainer_step.stage,
        pipeline_device,
        seed=zlib.crc32(request.node.nodeid.encode()),
        shares_training=isinstance(request.node, StageItem),
        named=session.settings.stages_named or _marker_names_stages(request.node),
    )
    yield stage
    if stage.cuda_broken:
        session.cuda_broken = stage.cuda_broken


def _marker_names_stages(node: pytest.Item) -> bool:
    """Whether a marked test names its stages (stages=): a stage with nothing to check then runs, as one named by
    --trainer-stages does; with none named, the marker gives the items the command line gives."""
    marker = node.get_closest_marker(MARKER) if not isinstance(node, StageItem) else None
    return marker is not None and bool(marker.kwargs.get("stages"))


@pytest.fixture
def train_batch(trainer_stage: TrainerStage) -> dict[str, Any]:
    """The first batch of the Trainer's train dataloader (fixed seed), on this item's device."""
    return trainer_stage.pipeline.batches.first_on(trainer_stage.device)


@pytest.fixture
def trainer_strategies(trainer_stage: TrainerStage) -> Any:
    """Hypothesis strategies over this pipeline's data: `.label_values()`, `.rows()`, `.batches()`, ..."""
    from pytest_trainer import strategies

    return strategies.TrainerStrategies(trainer_stage.pipeline)


def _facts(item: pytest.Item, step: Step, call: pytest.CallInfo[None]) -> ItemFacts:
    """What the report needs of this item."""
    facts = ItemFacts(_pipeline_key(item), step.stage, step.device, opt_in=OPT_IN.get(step.stage, ""))
    not_run = item.stash.get(_NOT_RUN, "")
    facts.blocked, facts.unavailable = not_run == "blocked", not_run == "unavailable"
    error = call.excinfo.value if call.excinfo is not None else None
    if isinstance(error, TrainerError):
        facts.diagnosis, facts.fix, facts.unexplained = error.cause, error.fix, error.unexplained
    stage = getattr(item, "funcargs", {}).get("trainer_stage")
    result = getattr(stage, "result", None)
    if result is not None:
        facts.figures, facts.notes = dict(result.figures), list(result.notes)
        if isinstance(result.measured, Sampling):
            facts.sampling_seconds = result.measured.sampling_seconds
    pipeline = getattr(stage, "__dict__", {}).get("pipeline")  # only when it was loaded
    if pipeline is not None and pipeline.notes:
        facts.notes.extend(pipeline.notes)
    return facts


def _pictures(item: pytest.Item, call: pytest.CallInfo[None]) -> Pictures:
    """What the stage drew (the rows fed, the loss curve, the memory by part), passed or failed."""
    if call.when != "call":
        return {}
    error = call.excinfo.value if call.excinfo is not None else None
    if isinstance(error, TrainerError):
        return Pictures(**error.pictures)
    result = getattr(getattr(item, "funcargs", {}).get("trainer_stage"), "result", None)
    return Pictures(**result.pictures) if result is not None else {}


# ---- helpers ---------------------------------------------------------------------------------------


def _step_of(item: pytest.Item) -> Step | None:
    if isinstance(item, StageItem):
        return item.step
    callspec = getattr(item, "callspec", None)
    step = callspec.params.get("_trainer_step") if callspec is not None else None
    return step if isinstance(step, Step) else None


def _pipeline_key(item: pytest.Item) -> str:
    """The pipeline an item belongs to, as pytest shows it: the script, or the marked test function.

    It is what a failure blocks and what the report groups by.
    """
    parent = item.parent.nodeid if item.parent else ""
    if isinstance(item, StageItem):
        return parent
    return f"{parent}::{getattr(item, 'originalname', item.name)}"


def _script_of(node: Any) -> tuple[Command, str | None, str | None] | None:
    """The command (a script's), factory and model choice (--trainer-model where None) that give this item its
    Trainer, or None when a `trainer` fixture does."""
    settings = session_of(node.config).settings
    if isinstance(node, StageItem):
        command = node.parent.command if isinstance(node.parent, TrainerScript) else script_command(node.path)
        return command, None if isinstance(node.parent, TrainerCommand) else settings.factory, None
    marker = node.get_closest_marker(MARKER)
    module = marker.kwargs.get("module") if marker else None
    text = marker.kwargs.get("command") if marker else None
    if not module and not text:
        return None
    if module and text:
        pytest.fail(f"{node.nodeid}: the {MARKER} marker takes module= or command=, not both", pytrace=False)
    if text:
        try:
            command = parse(text, node.config.rootpath)
        except CommandError as error:
            pytest.fail(f"{node.nodeid}: the {MARKER} marker's command=: {error}", pytrace=False)
    else:
        path = Path(str(module))
        if not path.is_absolute():
            beside_test = node.path.parent / path
            path = beside_test if beside_test.exists() else node.config.rootpath / path
        command = script_command(path.resolve(), settings.script_args)
    model = marker.kwargs.get("model")
    if model is not None and model not in MODELS:
        pytest.fail(
            f"{node.nodeid}: the {MARKER} marker's model={model!r} is none of {', '.join(MODELS)}", pytrace=False
        )
    return command, marker.kwargs.get("factory"), model


def _pipeline(request: pytest.FixtureRequest) -> Pipeline:
    session = session_of(request.config)
    script = _script_of(request.node)
    if script is not None:
        step = _step_of(request.node)
        return session.script_pipeline(*script, device=step.device if step else None)
    return session.fixture_pipeline(request.getfixturevalue("trainer"), _pipeline_key(request.node))
