"""Run pytest-trainer on a framework's own entry file, as its users would, and hold it to what it must do.

Usage: python check.py FRAMEWORK    (llamafactory, axolotl or swift), from an empty folder, in a virtualenv that has the
framework and pytest-trainer installed (tox -e llamafactory, say, does all of it).

It builds a tiny Qwen2 model, its tokenizer and data in ./tiny (make_tiny.py), then for each case of the framework,
given as the command its users run (`--trainer-command="llamafactory-cli train sft.yaml"`):

- a correct configuration: every item that runs passes, and the run leaves no file in this folder (the framework's
  output folder included); the same configuration given as the framework's entry file (`--trainer-module` and
  `--trainer-args`) gives the same items with the same outcomes;
- the same configuration with a learning rate of 0, given through the framework's own settings: `step` fails and
  says so;
- the first case on a real 7B checkpoint of which only the config and tokenizer files are here: every item passes on
  its twin, and the summary says so;
- (LLaMA-Factory's SFT) a cutoff_len that cuts the answers: `targets` fails naming cutoff_len, the framework's own
  truncation, which no Trainer setting shows; its ZeRO-3 config where DeepSpeed cannot run: the items pass, and the
  summary says DeepSpeed is not exercised.

It prints each run's summary and exits 1 on the first case that does not hold.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LEARNING_RATE_ZERO = "step[cpu] failed: the learning rate is 0"
#: A real checkpoint without its weights (its public config and tokenizer files, tests/fixtures/checkpoints): the
#: framework's pipeline runs on its twin.
CHECKPOINT = "Qwen--Qwen2.5-7B-Instruct"
TWIN = "model: a twin of"
#: How each framework's own command names the model (axolotl's CLI takes its options with dashes: one it does not
#: know goes on to accelerate launch, which refuses it).
MODEL_SETTING = {"llamafactory": "model_name_or_path={}", "swift": "--model {}", "axolotl": "--base-model={}"}
#: LLaMA-Factory's SFT case with a cutoff_len shorter than many conversations, and what targets says of it.
CUT_OFF = ("cutoff_len=24", "sampled answers are cut by cutoff_len=24 before their end")
#: LLaMA-Factory's SFT case with its ZeRO-3 config (examples/deepspeed/ds_z3_config.json's settings), and what the
#: summary says where DeepSpeed cannot run.
DEEPSPEED = (f"deepspeed={HERE / 'llamafactory' / 'ds_z3.json'}", "not exercised: the script asks for DeepSpeed (")


def entry(package: str, *parts: str) -> str:
    """The path of a module file inside an installed package."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        sys.exit(f"{package} is not installed in this environment: pip install -r {HERE / 'requirements.txt'}")
    return str(Path(spec.origin).parent.joinpath(*parts))


def cases(framework: str) -> list[tuple[str, str, str, str, str]]:
    """(name, the command its users run, its entry file, --trainer-args, the learning-rate-0 override) of each
    case; the command's arguments follow it as --trainer-args follows the entry file."""
    if framework == "llamafactory":
        launcher = entry("llamafactory", "launcher.py")
        return [
            (
                f"LoRA {stage.upper()}",
                "llamafactory-cli train",
                launcher,
                shlex.quote(str(HERE / "llamafactory" / f"{stage}.yaml")),
                "learning_rate=0",
            )
            for stage in ("sft", "dpo")
        ]
    if framework == "swift":
        return [
            (
                "LoRA SFT",
                "swift sft",
                entry("swift", "cli", "sft.py"),
                (HERE / "swift" / "sft.args").read_text().strip(),
                "--learning_rate 0",
            )
        ]
    if framework == "axolotl":
        train = entry("axolotl", "cli", "train.py")
        return [
            (
                f"LoRA SFT{name}",
                "axolotl train",
                train,
                shlex.quote(str(HERE / "axolotl" / config)),
                "--learning-rate=0",  # axolotl's own option: the command passes one it does not know to accelerate
            )
            for name, config in (("", "sft.yml"), (" with sample_packing", "packing.yml"))
        ]
    sys.exit(f"usage: python {Path(__file__).name} llamafactory|axolotl|swift")


def real_checkpoint(root: Path) -> Path:
    """The folder of a real checkpoint's config and tokenizer files, without weights, under `root`."""
    # The tests' own helper, from this clone: the fixture files, and a tokenizer with the checkpoint's special tokens.
    helper = HERE.parents[1] / "tests" / "e2e" / "checkpoints.py"
    spec = importlib.util.spec_from_file_location("checkpoints", helper)
    if spec is None or spec.loader is None:
        sys.exit(f"{helper} is missing: run this check from a clone of pytest-trainer")
    checkpoints = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checkpoints)
    return Path(checkpoints.folder(root.resolve(), CHECKPOINT))


def files_here() -> set[str]:
    """Every file under this folder but the tiny model and data, hypothesis's cache and bytecode."""
    found = set()
    for root, folders, files in os.walk("."):
        folders[:] = [name for name in folders if name not in ("tiny", ".hypothesis", "__pycache__")]
        found.update(os.path.join(root, name) for name in files)
    return found


def pytest(command: str, *options: str) -> tuple[int, str]:
    """Run pytest on the command its users run (`llamafactory-cli train sft.yaml`)."""
    return run_pytest(f"--trainer-command={command}", *options)


def run_pytest(*options: str) -> tuple[int, str]:
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *options]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    output = done.stdout + done.stderr
    summary = [line for line in output.splitlines() if "failed:" in line or " passed" in line or "fix:" in line]
    print("\n".join(summary[-12:]), flush=True)
    return done.returncode, output


def outcomes(report: str) -> dict[str, tuple[str, str]]:
    """Each item's outcome and diagnosis in a JSON report, by stage and device."""
    items = json.loads(Path(report).read_text())["items"]
    Path(report).unlink()
    return {f"{item['stage']}[{item['device']}]": (item["outcome"], item["diagnosis"]) for item in items}


def main() -> None:
    framework = sys.argv[1] if len(sys.argv) == 2 else ""
    found = cases(framework)
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", AXOLOTL_DO_NOT_TRACK="1")
    subprocess.run([sys.executable, str(HERE / "make_tiny.py"), "tiny"], check=True)
    for name, cli, module, arguments, zero in found:
        command = f"{cli} {arguments}"
        print(f"== {framework}, {name}: a correct configuration, `{command}`", flush=True)
        before = files_here()
        code, output = pytest(command, "--trainer-report=command.json")
        left = sorted(files_here() - before - {"./command.json"})
        if code != 0 or left:
            print(output[-6000:])
            sys.exit(
                f"{framework}, {name}: expected every item to pass and no file left; pytest exited {code}, "
                f"files left: {left}"
            )
        print(f"== {framework}, {name}: the same as its entry file, {Path(module).name}", flush=True)
        code, output = run_pytest(
            f"--trainer-module={module}", f"--trainer-args={arguments}", "--trainer-report=module.json"
        )
        given, entry_file = outcomes("command.json"), outcomes("module.json")
        if given != entry_file:
            print(output[-6000:])
            sys.exit(f"{framework}, {name}: the command gave {given}, its entry file {entry_file}")
        print(f"== {framework}, {name}: learning rate 0", flush=True)
        code, output = pytest(f"{command} {zero}", "--trainer-stages=load,step")
        if code != 1 or LEARNING_RATE_ZERO not in output:
            print(output[-6000:])
            sys.exit(f"{framework}, {name}: expected step to fail with {LEARNING_RATE_ZERO!r}; pytest exited {code}")
    name, cli, _, arguments, _ = found[0]
    command = f"{cli} {arguments}"
    print(f"== {framework}, {name}: on {CHECKPOINT.replace('--', '/')}, its config and tokenizer only", flush=True)
    checkpoint = real_checkpoint(Path("tiny"))
    code, output = pytest(f"{command} {MODEL_SETTING[framework].format(checkpoint)}")
    if code != 0 or TWIN not in output:
        print(output[-6000:])
        sys.exit(f"{framework}, {name}: expected every item to pass on the checkpoint's twin; pytest exited {code}")
    if framework == "llamafactory":
        print(f"== {framework}, {name}: answers cut by {CUT_OFF[0]}", flush=True)
        code, output = pytest(f"{command} {CUT_OFF[0]}", "--trainer-stages=load,collate,targets")
        if code != 1 or CUT_OFF[1] not in output:
            print(output[-6000:])
            sys.exit(f"{framework}, {name}: expected targets to fail with {CUT_OFF[1]!r}; pytest exited {code}")
        print(f"== {framework}, {name}: with a DeepSpeed config, {DEEPSPEED[0]}", flush=True)
        code, output = pytest(f"{command} {DEEPSPEED[0]}", "--trainer-stages=load,forward,step")
        if code != 0 or DEEPSPEED[1] not in output:
            print(output[-6000:])
            sys.exit(f"{framework}, {name}: expected every item to pass and {DEEPSPEED[1]!r}; pytest exited {code}")
    print(f"{framework}: every case holds")


if __name__ == "__main__":
    main()
