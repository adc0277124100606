"""Regenerate the recorded data of the unit tests (tests/unit/data/*.json) from real runs.

- `rank_*.json`: real two-process jobs under torch.distributed.run on the CPU (gloo), started by pytest-trainer's
  own `distributed.processes.run`, as the `distributed` item starts them (3 steps, the Trainer's own train()); each keeps what the
  judges of `distributed.judges` read: every rank's record, torchrun's return code and last lines, whether it timed out, and
  the ranks' stacks. The scripts are those of tests/e2e/test_distributed.py.
- `grpo_*.json`: conftest_examples/grpo/train.py (TRL's GRPOTrainer on a tiny Llama) loaded as the plugin loads it
  and sampled by `sampling.sample`, as the `targets` item does; each keeps the `Sampled` fields `reward_checks` reads
  (not the reward functions: the tests define them, as the script does).

Run from the repository root (each job takes 30 to 60 s on two cores; give names to record only some):

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python tests/unit/record.py [rank_killed grpo_example ...]

This script imports torch; the tests that read its data do not.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DATA = HERE / "data"
# The end-to-end tests' scripts and their conftest's tiny models, as the two-process tests run them.
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from test_distributed import DRIFTS, GOOD, HANGS, OWN_LOADER, WRITES_TWICE  # noqa: E402

GRPO = ROOT / "conftest_examples" / "grpo"

#: test_a_rank_that_dies_is_reported: rank 1 killed (SIGKILL, as the out-of-memory killer does) at its first batch.
#: SLOW_PEER is put before it: rank 0 slowed down at its first batch, as on a loaded machine.
KILLED = """
    import os
    import signal
    import time
    import tiny
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

    tok = tiny.tokenizer()
    pad = DataCollatorWithPadding(tok)

    def collate(rows):
        SLOW_PEER
        if os.environ.get("RANK") == "1":
            os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer does
        return pad(rows)

    data = tiny.tokenized(tiny.text_dataset(24), tok)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, report_to="none")
    trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=data, data_collator=collate)
    trainer.train()
"""

#: Rank 1 raises an error of the user's code at its first batch; rank 0 loses its peer.
RAISES = KILLED.replace("        SLOW_PEER\n", "").replace(
    "os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer does",
    'raise ValueError("row without a label")',
)

#: test_each_process_starts_from_its_own_random_state, unseeded: each rank draws its own split.
UNSEEDED = """
    import tiny
    from transformers import Trainer, TrainingArguments

    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(40), tok)
    splits = data.train_test_split(test_size=0.25)  # before the Trainer seeds anything
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, report_to="none")
    trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=splits["train"], eval_dataset=splits["test"],
                      processing_class=tok)
    trainer.train()
"""


#: test_fsdp_asked_for_says_what_ran_and_round_trips_the_state_dict: a tied Llama whose script asks for FSDP; on the
#: CPU the Trainer trains with DDP and each rank round-trips the state dict through fully_shard.
FSDP = """
    import tiny
    from transformers import (DataCollatorForLanguageModeling, LlamaConfig, LlamaForCausalLM, Trainer,
                              TrainingArguments)

    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(24), tok).remove_columns(["label"])
    config = LlamaConfig(vocab_size=len(tiny.VOCAB), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
                         tie_word_embeddings=True)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, report_to="none", fsdp=True,
                             fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]})
    trainer = Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=data, processing_class=tok,
                      data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
    trainer.train()
"""

#: name: (script, seconds the job may take, the layers to shard with fully_shard or None)
JOBS: dict[str, tuple[str, float, list[str] | None]] = {
    "rank_good": (GOOD, 300, None),
    "rank_killed": (KILLED.replace("        SLOW_PEER\n", ""), 300, None),
    "rank_killed_slow_peer": (
        KILLED.replace(
            "SLOW_PEER",
            'if os.environ.get("RANK") == "0":\n            time.sleep(5)  # rank 0 busy, as on a loaded machine',
        ),
        300,
        None,
    ),
    "rank_raises": (RAISES, 300, None),
    "rank_different_data": (UNSEEDED, 300, None),
    "rank_hangs": (HANGS, 45, None),
    "rank_drifts": (DRIFTS, 300, None),
    "rank_writes_twice": (WRITES_TWICE, 300, None),
    "rank_same_rows": (OWN_LOADER, 300, None),
    "rank_fsdp": (FSDP, 300, ["LlamaDecoderLayer"]),
}

#: What the judges read of a rank's record (its pid, loss and metrics are not).
RECORD_KEYS = ("rank", "progress", "data", "rows", "weights", "written", "engine", "evaluations", "sharding", "error")


def record_job(name: str) -> None:
    from pipeline_runs import TINY

    from pytest_trainer.distributed import processes

    source, timeout, layers = JOBS[name]
    with tempfile.TemporaryDirectory(prefix="record-") as folder:
        project = Path(folder)
        (project / "tiny.py").write_text(textwrap.dedent(TINY))
        (project / "train.py").write_text(textwrap.dedent(source))
        job = processes.Job(project / "train.py", (), None, 0, 0, 2, "cpu", 3, project / "job", layers)
        ranks = processes.run(job, timeout)
        log = (job.folder / "torchrun.log").read_text(errors="replace").splitlines()
    records = [{key: _kept(key, record[key]) for key in RECORD_KEYS if key in record} for record in ranks.records]
    found = {
        "script": textwrap.dedent(source),
        "records": records,
        "returncode": ranks.returncode,
        "timed_out": ranks.timed_out,
        "seconds": round(ranks.seconds, 1),
        "output": [_anonymous(line) for line in ranks.output],
        "stacks": {str(rank): _anonymous(stack) for rank, stack in ranks.stacks.items()},
        # torchrun's account of how each rank ended: its table of failures, in full.
        "failures": [_anonymous(line) for line in _failure_table(log)],
    }
    _write(name, found)


def _kept(key: str, value: Any) -> Any:
    if key == "error":  # the message, traceback, and the exception itself where it unpickles without torch
        error = dict(value)
        if error.get("pickled") and _unpickling_imports_torch(error["pickled"]):
            error["pickled"] = None  # a torch error (gloo's): what the judge reads of it is the message
        error["traceback"] = "\n".join(_anonymous(error.get("traceback") or "").splitlines()[-14:])
        return error
    if key == "evaluations":
        return [
            {name: part for name, part in found.items() if name != "metrics"}
            | {"metrics": {metric: value for metric, value in found["metrics"].items() if "accuracy" in metric}}
            for found in value
        ]
    return value


def _unpickling_imports_torch(pickled: str) -> bool:
    check = "import pickle, sys; pickle.loads(bytes.fromhex(sys.stdin.read())); print('torch' in sys.modules)"
    found = subprocess.run([sys.executable, "-c", check], input=pickled, capture_output=True, text=True, check=False)
    return found.stdout.strip() != "False"


def _failure_table(log: list[str]) -> list[str]:
    """The ChildFailedError table torchrun prints last: from its first border to its last one."""
    starts = [index for index, line in enumerate(log) if "FAILED" in line and "Failures" not in line]
    if not starts:
        return []
    start = max(starts[-1] - 1, 0)
    return [line for line in log[start:] if line.strip()][:60]


def _anonymous(text: str) -> str:
    """Paths of this machine and host names out of recorded text, so the data is the same wherever it is recorded:
    the plugin's own folder and the standard library's as placeholders the tests put back (`{pytest_trainer}`,
    `{stdlib}`: whose code a frame runs is told by them), the script's folder as /tmp/project."""
    text = text.replace(str(ROOT / "pytest_trainer"), "{pytest_trainer}")
    text = re.sub(r"/tmp/record-[^/\s\"]+", "/tmp/project", text)
    text = re.sub(r"[^\s\"']*/site-packages/", "/venv/lib/python3/site-packages/", text)
    text = text.replace(sysconfig.get_paths()["stdlib"], "{stdlib}")
    text = text.replace(str(ROOT), "/repo")
    return re.sub(r"(host\s+:) \S+", r"\1 host", text)


# ---- GRPO -------------------------------------------------------------------------------------------------------

#: The example's reward functions, as conftest_examples/grpo/train.py defines them.
NAMES_THE_ANIMAL = '''def names_the_animal(completions, answer, **kwargs):
    """1 when the answer names the animal of the sentence, else 0."""
    return [float(animal in completion[0]["content"].split())
            for completion, animal in zip(completions, answer, strict=True)]'''

#: name: what replaces in the example (pairs of old, new text).
GRPO_RUNS: dict[str, list[tuple[str, str]]] = {
    # the example as it is
    "grpo_example": [],
    # `names_the_animal` reads a chat completion as a string: len(completion) is its count of messages, 1; and
    # `short_answer` left out, so every group's rewards are equal
    "grpo_reads_no_completion": [
        (
            NAMES_THE_ANIMAL,
            "def names_the_animal(completions, answer, **kwargs):\n"
            "    return [float(len(completion)) for completion in completions]",
        ),
        ("reward_funcs=[names_the_animal, short_answer]", "reward_funcs=[names_the_animal]"),
    ],
    # `names_the_animal` alone, asking for the exact answer: the untrained model never earns it
    "grpo_sparse": [
        (
            NAMES_THE_ANIMAL,
            "def names_the_animal(completions, answer, **kwargs):\n"
            "    return [float(completion[0]['content'].strip() == animal)\n"
            "            for completion, animal in zip(completions, answer, strict=True)]",
        ),
        ("reward_funcs=[names_the_animal, short_answer]", "reward_funcs=[names_the_animal]"),
    ],
    # a third reward function that gives every completion 1, beside the example's two
    "grpo_one_deaf": [
        (
            "def main():",
            "def always_one(completions, **kwargs):\n    return [1.0 for _ in completions]\n\n\ndef main():",
        ),
        ("reward_funcs=[names_the_animal, short_answer]", "reward_funcs=[names_the_animal, short_answer, always_one]"),
    ],
    # completions of 3 tokens that never end (the end token suppressed): the random policy's cut ones still train
    "grpo_never_ends": [
        (
            "max_completion_length=24,",
            "max_completion_length=3,\n        generation_kwargs={'suppress_tokens': [tokenizer.eos_token_id]},",
        ),
    ],
    # the same, the cut completions dropped from the loss
    "grpo_never_ends_masked": [
        (
            "max_completion_length=24,",
            "max_completion_length=3, mask_truncated_completions=True,\n"
            "        generation_kwargs={'suppress_tokens': [tokenizer.eos_token_id]},",
        ),
    ],
}


def record_grpo(name: str) -> None:
    from pytest_trainer import script_runner  # isort: skip (one module a line: a module that moves is renamed with sed)
    from pytest_trainer import sampling  # isort: skip

    source = (GRPO / "train.py").read_text()
    for old, new in GRPO_RUNS[name]:
        if old not in source:
            raise SystemExit(f"{name}: the example no longer has {old!r}")
        source = source.replace(old, new)
    with tempfile.TemporaryDirectory(prefix="record-") as folder:
        project = Path(folder)
        shutil.copytree(GRPO / "data", project / "data")
        (project / "train.py").write_text(source)
        loaded = script_runner.load_trainer(project / "train.py", (), None, script_runner.Sandbox(project / "output"))
        _, sampled = sampling.sample(loaded.trainer)

    def plain(value: Any) -> Any:
        return None if isinstance(value, float) and math.isnan(value) else value

    batches: list[dict[str, Any]] = []  # what the trainer gives every reward function of a batch, kept once
    calls: dict[str, list[dict[str, Any]]] = {}
    for function, made in sampled.calls.items():
        for call in made:
            arguments = {key: value for key, value in call.arguments.items() if key not in sampling.NOT_DATA}
            if arguments not in batches:
                batches.append(arguments)
            answer = [plain(float(value)) if value is not None else None for value in call.answer]
            calls.setdefault(function, []).append({"batch": batches.index(arguments), "answer": answer})
    found = {
        "script": source,
        "names": sampled.names,
        "weights": sampled.weights,
        "group": sampled.group,
        "max_completion_length": sampled.max_completion_length,
        "masks_truncated": sampled.masks_truncated,
        "entropy_share": sampled.entropy_share,
        "seconds": round(sampled.seconds, 2),
        "functions": sorted(sampled.functions),
        "completions": sampled.completions,
        "rewards": [[plain(value) for value in row] for row in sampled.rewards],
        "ended": sampled.ended,
        "lengths": sampled.lengths,
        "calls": calls,
        "batches": batches,
    }
    _write(name, found)


def _write(name: str, found: dict[str, Any]) -> None:
    """One line a key (a list of records or batches: one line an item), in the order recorded: the judges read dicts
    in order."""
    path = DATA / f"{name}.json"
    lines = []
    for key, value in found.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            items = ",\n  ".join(json.dumps(item, ensure_ascii=False) for item in value)
            lines.append(f"{json.dumps(key)}: [\n  {items}\n]")
        else:
            lines.append(f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n", encoding="utf-8")
    print(f"{path.relative_to(ROOT)}: {path.stat().st_size // 1024} KiB", flush=True)


def main(names: list[str]) -> None:
    DATA.mkdir(exist_ok=True)
    for name in names or [*JOBS, *GRPO_RUNS]:
        if name in JOBS:
            record_job(name)
        elif name in GRPO_RUNS:
            record_grpo(name)
        else:
            raise SystemExit(f"no run named {name}: {', '.join([*JOBS, *GRPO_RUNS])}")


if __name__ == "__main__":
    main(sys.argv[1:])
