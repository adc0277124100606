"""Dry-run a training script: train exactly one step, evaluate and save nothing.

This is the "fast_dev_run" a user would otherwise reach for to check a script before
merging it; the benchmark compares the pytest-trainer suite against it.

Usage: ``python bench/dry_run.py path/to/train.py``. The script runs as ``__main__``;
every ``TrainingArguments`` it builds is cut down after its own ``__post_init__``,
so the script itself is not edited. Outputs go to a temporary directory.
"""

from __future__ import annotations

import runpy
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers


def patch_training_arguments(output_dir: str) -> None:
    """Wrap ``TrainingArguments.__post_init__`` so any script trains one step, quietly.

    Set after the original runs, so its validation (e.g. of eval/save strategies against
    load_best_model_at_end) sees what the script asked for and cannot undo ours.
    """
    original = transformers.TrainingArguments.__post_init__
    gpu = torch.cuda.is_available()

    def __post_init__(self: Any) -> None:
        if not gpu:  # fp16/bf16 need a GPU: a dry run on a CPU trains in fp32, as the plugin's CPU items do
            self.fp16 = self.bf16 = False
        original(self)
        self.max_steps = 1
        self.eval_strategy = "no"
        if hasattr(self, "evaluation_strategy"):  # transformers < 4.46 spelling
            self.evaluation_strategy = "no"
        self.save_strategy = "no"
        self.report_to = []
        self.output_dir = output_dir
        self.push_to_hub = False

    transformers.TrainingArguments.__post_init__ = __post_init__  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python bench/dry_run.py path/to/train.py", file=sys.stderr)
        return 2
    script = Path(argv[0]).resolve()
    with tempfile.TemporaryDirectory(prefix="dry-run-") as output_dir:
        patch_training_arguments(output_dir)
        sys.argv = [str(script)]
        sys.path.insert(0, str(script.parent))  # as `python train.py` would
        runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
