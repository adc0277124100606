"""Benchmark: does the pytest-trainer suite cost about what a one-step dry run costs?

A pre-merge gate is only used if it is cheap, so the suite is timed against the
"train one step" dry run a user would otherwise run (bench/dry_run.py), against the
bare import of torch/transformers/datasets (the floor neither can go under), and the
dataset stage is timed on 1k vs 100k training rows (``--trainer-sample`` should make
the stage's cost independent of the data's size once the Arrow cache is warm). Every
other bundled example's whole default suite is timed beside its own dry run too: the
figure a CI user of that kind of pipeline feels.

Usage: ``python bench/run.py [--runs N]`` with the project's virtual environment.
Every command runs as its own subprocess; each repetition runs all of them in turn
(ABAB..., so drift on a busy machine hits every command alike) and medians are reported.
Prints a table and writes bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

BENCH = Path(__file__).resolve().parent
EXAMPLES_DIR = BENCH.parent / "conftest_examples"
MNLI = EXAMPLES_DIR / "mnli"
#: The bundled examples timed suite against dry run, by the kind of pipeline they stand for.
EXAMPLES: dict[str, Path] = {
    "text classification (pretrained MiniLM)": MNLI / "train.py",
    "causal LM (tiny GPT-2)": EXAMPLES_DIR / "causal_lm" / "train.py",
    "seq2seq (tiny T5, Seq2SeqTrainer)": EXAMPLES_DIR / "seq2seq" / "train.py",
    "vision (tiny ViT)": EXAMPLES_DIR / "vision" / "train.py",
    "SFT + LoRA (tiny Qwen2, TRL, PEFT)": EXAMPLES_DIR / "sft_lora" / "train.py",
    "online RL: GRPO (tiny Llama, TRL)": EXAMPLES_DIR / "grpo" / "train.py",
    "vision-language SFT (tiny LLaVA, TRL)": EXAMPLES_DIR / "vlm_sft" / "train.py",
    "token classification (tiny BERT)": EXAMPLES_DIR / "token_classification" / "train.py",
    "masked LM (tiny BERT)": EXAMPLES_DIR / "masked_lm" / "train.py",
    "regression (tiny BERT)": EXAMPLES_DIR / "regression" / "train.py",
    "custom Trainer subclass (tiny BERT)": EXAMPLES_DIR / "custom_trainer" / "train.py",
}
#: Every example's whole suite against its own dry run (wall): the target each one is held to.
EXAMPLE_TARGET = 1.3
#: A script of a real 7B checkpoint whose weights are absent: the plugin tests it on the checkpoint's twin.
TWIN_SCRIPT = BENCH / "twin_qlora.py"
TWIN_CHECKPOINT = "Qwen--Qwen2.5-7B-Instruct"
TWIN_SUITE = "suite: twin of Qwen2.5 7B (QLoRA SFT by hub id, config and tokenizer only)"
TWIN_WITHOUT_HUGE_PAGES = f"{TWIN_SUITE}, THP_MEM_ALLOC_ENABLE=0"
#: What the twin's whole suite is held to on a CPU runner: wall seconds and peak RSS MiB. No dry run stands beside
#: it: the real model's step needs its weights, which the runner neither has nor could hold.
TWIN_TARGETS = (60.0, 4096.0)
PY = sys.executable
SUITE, DRY, DS_1K, DS_100K, IMPORTS, FEWER = (
    "suite (default CPU)",
    "dry run (1 train step)",
    "dataset stage, 1k rows",
    "dataset stage, 100k rows",
    "import torch, transformers, datasets",
    "suite (default CPU), --trainer-examples=10",
)
# (name of the numerator, name of the denominator, "wall" or "rss", target ratio)
RATIOS: list[tuple[str, str, str, float]] = [
    (SUITE, DRY, "wall", 1.3),
    (DS_100K, DS_1K, "wall", 1.2),
    (SUITE, DRY, "rss", 1.2),
]


@dataclass(frozen=True)
class Command:
    name: str
    argv: list[str]


@dataclass(frozen=True)
class Sample:
    wall_s: float
    rss_mib: float


def measure(command: Command, cwd: Path, env: dict[str, str], log: Path) -> Sample:
    """Run one command; wall time from the parent, peak RSS of that child from wait4.

    Popen + os.wait4 rather than subprocess.run: wait4 hands back the child's own
    rusage, whereas getrusage(RUSAGE_CHILDREN) would mix every child ever reaped.
    Output goes to a file (no pipe to drain) and is shown only if the command fails.
    """
    with log.open("wb") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(command.argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; keep Popen consistent
    if proc.returncode != 0:
        print(log.read_text(errors="replace"), file=sys.stderr)
        sys.exit(f"{command.name} exited {proc.returncode}: {shlex.join(command.argv)}")
    return Sample(wall, usage.ru_maxrss / 1024)  # ru_maxrss is KiB on Linux


def make_variant(dest: Path, rows: int) -> Path:
    """Copy the mnli example with train.jsonl repeated to `rows` rows; return its script.

    Only the row count changes (same rows, same validation split), so any difference
    in the dataset stage's time is the cost of the data's size.
    """
    shutil.copytree(MNLI, dest, ignore=shutil.ignore_patterns("__pycache__"))
    bundled = (MNLI / "data" / "train.jsonl").read_text().splitlines()
    lines = (bundled[i % len(bundled)] for i in range(rows))
    (dest / "data" / "train.jsonl").write_text("\n".join(lines) + "\n")
    return dest / "train.py"


PYTEST = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider"]


def suite(script: Path) -> list[str]:
    return [*PYTEST, f"--trainer-module={script}", "--trainer-devices=cpu"]


def dry_run(script: Path) -> list[str]:
    return [PY, str(BENCH / "dry_run.py"), str(script)]


def commands(root: Path) -> list[Command]:
    """The measured commands, in the order each repetition runs them."""
    stage = ["--trainer-stages=dataset", "--trainer-devices=cpu"]
    found = [
        Command(SUITE, suite(MNLI / "train.py")),
        Command(DRY, dry_run(MNLI / "train.py")),
        Command(DS_1K, [*PYTEST, f"--trainer-module={make_variant(root / 'rows-1k', 1_000)}", *stage]),
        Command(DS_100K, [*PYTEST, f"--trainer-module={make_variant(root / 'rows-100k', 100_000)}", *stage]),
        Command(IMPORTS, [PY, "-c", "import torch, transformers, datasets"]),
        # What half the hypothesis examples would save on the 22M-parameter model (lengths and padding forward each).
        Command(FEWER, [*suite(MNLI / "train.py"), "--trainer-examples=10"]),
    ]
    for kind, script in EXAMPLES.items():
        if script != MNLI / "train.py":  # measured above
            found += [Command(f"suite: {kind}", suite(script)), Command(f"dry run: {kind}", dry_run(script))]
    twin = [*suite(TWIN_SCRIPT), "--trainer-gpu-memory=24"]  # the memory item forecasts the checkpoint against 24 GiB
    # The same suite with torch's huge pages turned off: what pytest_trainer/huge_pages.py saves.
    found += [Command(TWIN_SUITE, twin), Command(TWIN_WITHOUT_HUGE_PAGES, ["env", "THP_MEM_ALLOC_ENABLE=0", *twin])]
    return found


def twin_cache(home: Path) -> None:
    """The checkpoint's config and tokenizer files in a Hugging Face cache under `home`, as the twin tests lay it."""
    sys.path.insert(0, str(BENCH.parent / "tests" / "e2e"))
    import checkpoints

    checkpoints.cache(home, TWIN_CHECKPOINT)


def twin_rows(medians: dict[str, Sample]) -> list[str]:
    """The twin's suites against TWIN_TARGETS, each marked met or missed."""
    wall, rss = TWIN_TARGETS
    rows = []
    for name in (TWIN_SUITE, TWIN_WITHOUT_HUGE_PAGES):
        sample = medians[name]
        verdict = "met" if sample.wall_s <= wall and sample.rss_mib <= rss else "missed"
        rows.append(
            f"| {name} | {sample.wall_s:.2f} | {sample.rss_mib:.0f} | ≤ {wall:g} s, ≤ {rss:g} MiB | {verdict} |"
        )
    return rows


def stage_times(
    cwd: Path, env: dict[str, str], log: Path, script: Path = MNLI / "train.py"
) -> tuple[float, list[tuple[str, float]]]:
    """One more run of a suite with --durations: its wall time and each item's time (setup, call and teardown
    together), longest first."""
    command = Command("suite with --durations", [*suite(script), "--durations=0", "--durations-min=0"])
    wall = measure(command, cwd, env, log).wall_s
    times: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        match = re.match(r"([0-9.]+)s (setup|call|teardown)\s+.*::(\S+)$", line.strip())
        if match:
            times[match.group(3)] = times.get(match.group(3), 0.0) + float(match.group(1))
    return wall, sorted(times.items(), key=lambda item: -item[1])


def profile_rows(wall: float, times: list[tuple[str, float]]) -> list[str]:
    rows = [
        f"| `{item}` | {seconds:.2f} |"
        + (
            " runs the script up to `trainer.train()` first, as a dry run does |"
            if item.startswith("dataset")
            else " |"
        )
        for item, seconds in times
    ]
    rest = wall - sum(seconds for _, seconds in times)
    rows.append(
        f"| startup, collection, report and exit | {rest:.2f} | pytest and its plugins (hypothesis's "
        "among them) start before any item |"
    )
    return rows


def example_rows(medians: dict[str, Sample]) -> list[str]:
    """Per bundled example: the whole default suite beside its dry run, and the wall ratio against its target."""
    rows = []
    for kind, script in EXAMPLES.items():
        top, bottom = (SUITE, DRY) if script == MNLI / "train.py" else (f"suite: {kind}", f"dry run: {kind}")
        a, b = medians[top], medians[bottom]
        verdict = "met" if a.wall_s / b.wall_s <= EXAMPLE_TARGET else "missed"
        rows.append(
            f"| {kind} | `{script.parent.name}` | {a.wall_s:.2f} | {b.wall_s:.2f} | {a.wall_s / b.wall_s:.2f} "
            f"{verdict} | {a.rss_mib:.0f} | {b.rss_mib:.0f} | {a.rss_mib / b.rss_mib:.2f} |"
        )
    return rows


def example_profile_rows(profiles: dict[str, tuple[float, list[tuple[str, float]]]]) -> list[str]:
    """Per bundled example, from one run with --durations: the load (the script up to trainer.train()), every other
    item together, pytest's own share, and the costliest items after the load."""
    rows = []
    for kind, (wall, times) in profiles.items():
        load = sum(seconds for item, seconds in times if item.startswith("load"))
        stages = sum(seconds for item, seconds in times if not item.startswith("load"))
        top = ", ".join(
            f"{item} {seconds:.2f}" for item, seconds in times if not item.startswith("load") and seconds >= 0.05
        )[:160]
        rows.append(
            f"| `{EXAMPLES[kind].parent.name}` | {wall:.2f} | {load:.2f} | {stages:.2f} | "
            f"{wall - load - stages:.2f} | {top or '-'} |"
        )
    return rows


def machine() -> str:
    """nproc, CPU model and total memory: enough to tell whose numbers these are."""
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "?")
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
    return f"{len(os.sched_getaffinity(0))} CPUs ({model}), {kib / 1024**2:.1f} GiB memory"


def versions() -> str:
    """Library versions, and the commit measured: the package is installed editable."""
    libs = ["torch", "transformers", "datasets", "pytest", "pytest-trainer"]
    git = ["git", "-C", str(BENCH.parent)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "pytest_trainer"], capture_output=True, text=True)
    commit = f"commit {head or '?'}{' + uncommitted changes in pytest_trainer/' if dirty.stdout.strip() else ''}"
    return ", ".join([f"Python {platform.python_version()}", *(f"{lib} {version(lib)}" for lib in libs), commit])


def value(sample: Sample, metric: str) -> float:
    return sample.wall_s if metric == "wall" else sample.rss_mib


def report(
    medians: dict[str, Sample],
    walls: dict[str, list[float]],
    cmds: list[Command],
    runs: int,
    profile: tuple[float, list[tuple[str, float]]],
    profiles: dict[str, tuple[float, list[tuple[str, float]]]],
) -> str:
    """RESULTS.md: context, the medians, and each ratio against its target."""
    rows = [
        f"| {name} | {s.wall_s:.2f} | {min(walls[name]):.2f}-{max(walls[name]):.2f} | {s.rss_mib:.0f} |"
        for name, s in medians.items()
    ]
    ratio_rows = []
    for top, bottom, metric, target in RATIOS:
        ratio = value(medians[top], metric) / value(medians[bottom], metric)
        verdict = "met" if ratio <= target else "missed"
        label = "wall" if metric == "wall" else "peak RSS"
        ratio_rows.append(f"| {top} / {bottom} ({label}) | {ratio:.3f} | ≤ {target} | {verdict} |")
    shown = [f"- {c.name}: `{shlex.join(c.argv)}`" for c in cmds]
    return "\n".join(
        [
            "# Benchmark results",
            "",
            f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
            f"- Machine: {machine()}",
            f"- Versions: {versions()}",
            f"- Runs: {runs} per command, alternated within each repetition; medians below",
            "- Caches: one temporary HF_DATASETS_CACHE for the whole run, and one untimed warm-up of"
            " every command first, so JSON→Arrow preparation is cached (as on a CI runner with a cache)"
            " and the OS file cache is warm",
            "- Environment: HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1; every command runs in a temporary working"
            " directory. Bytecode caching is on, as in a CI job: the warm-up leaves pytest's assertion-rewritten"
            " modules (hypothesis is a pytest plugin) cached, which a job on a fresh virtualenv pays once, about 1 s",
            "",
            "| Command | Wall s (median) | Wall s (min-max) | Peak RSS MiB (median) |",
            "| --- | ---: | ---: | ---: |",
            *rows,
            "",
            "| Ratio | Value | Target | |",
            "| --- | ---: | ---: | --- |",
            *ratio_rows,
            "",
            "Every bundled example: the whole default CPU suite beside its dry run (medians):",
            "",
            f"| Pipeline | Example | Suite wall s | Dry run wall s | Ratio (target ≤ {EXAMPLE_TARGET}) "
            "| Suite peak RSS MiB | Dry run peak RSS MiB | Ratio |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
            *example_rows(medians),
            "",
            "A real checkpoint on a CPU runner: the whole default suite of `bench/twin_qlora.py` on the twin of "
            "Qwen2.5 7B (medians; no dry run beside it, the real model's step needs weights the runner has not):",
            "",
            "| Command | Wall s | Peak RSS MiB | Target | |",
            "| --- | ---: | ---: | --- | --- |",
            *twin_rows(medians),
            "",
            "Where each suite's time goes (one more run of each with `--durations=0`; pytest's share is its start-up, "
            "collection, report and exit):",
            "",
            "| Example | Wall s | load s | other items s | pytest s | costliest items after the load (s) |",
            "| --- | ---: | ---: | ---: | ---: | --- |",
            *example_profile_rows(profiles),
            "",
            f"Where the MiniLM suite's time goes (one more run with `--durations=0`, {profile[0]:.2f} s wall):",
            "",
            "| Item | Seconds | |",
            "| --- | ---: | --- |",
            *profile_rows(*profile),
            "",
            "Commands (`<tmp>` paths are the bench run's temporary copies):",
            "",
            *shown,
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="Time the pytest-trainer suite against a dry run.")
    parser.add_argument("--runs", type=int, default=5, help="repetitions of every command (default 5)")
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory(prefix="pytest-trainer-bench-") as tmp:
        root = Path(tmp)
        (cwd := root / "cwd").mkdir()
        env = {
            **{key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"},  # as in CI
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "HF_DATASETS_CACHE": str(root / "hf-datasets-cache"),
            "HF_HOME": str(root / "hf-home"),
        }
        twin_cache(root / "hf-home")
        cmds = commands(root)
        log = root / "output.log"
        for cmd in cmds:
            print(f"warm-up: {cmd.name}", flush=True)
            measure(cmd, cwd, env, log)
        samples: dict[str, list[Sample]] = {c.name: [] for c in cmds}
        for run in range(1, runs + 1):
            for cmd in cmds:
                s = measure(cmd, cwd, env, log)
                samples[cmd.name].append(s)
                print(f"run {run}/{runs}: {cmd.name}: {s.wall_s:.2f} s, {s.rss_mib:.0f} MiB", flush=True)
        text = report(
            {
                n: Sample(statistics.median(s.wall_s for s in ss), statistics.median(s.rss_mib for s in ss))
                for n, ss in samples.items()
            },
            {n: [s.wall_s for s in ss] for n, ss in samples.items()},
            cmds,
            runs,
            stage_times(cwd, env, log),
            {kind: stage_times(cwd, env, log, script) for kind, script in EXAMPLES.items()},
        ).replace(tmp, "<tmp>")
    (BENCH / "RESULTS.md").write_text(text)
    print()
    print(text.split("\n\n", 1)[1].split("\nCommands")[0])
    print(f"written: {BENCH / 'RESULTS.md'}")


if __name__ == "__main__":
    main()
