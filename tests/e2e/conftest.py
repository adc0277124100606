"""The fixtures of the end-to-end tests (what they share besides, the scripts and how to run them, is in
`pipeline_runs`).

The heavy libraries are imported here, once: pytester's in-process runs forget modules first imported inside them,
libraries with C extensions (torch above all) cannot be imported a second time in one process, nor can two copies of
hypothesis's classes meet. The unit tests (tests/unit) import none of them.
"""

from __future__ import annotations

import os

import accelerate  # noqa: F401
import datasets  # noqa: F401
import hypothesis.strategies  # noqa: F401
import pyarrow  # noqa: F401
import pytest
import tokenizers  # noqa: F401
import torch
import transformers  # noqa: F401
from pipeline_runs import TINY
from transformers import (  # noqa: F401
    BertForSequenceClassification,
    PreTrainedTokenizerFast,
    Seq2SeqTrainingArguments,  # its module, once forgotten by pytester, would make pickling the arguments fail
    Trainer,
)

import pytest_trainer.stages.labels
import pytest_trainer.stages.lengths
import pytest_trainer.stages.padding
import pytest_trainer.strategies  # noqa: F401

#: Under pytest-xdist, each worker's share of the cores. torch's pool would start a thread per core in every worker, and
#: workers that wait on each other's threads run two to three times slower (on 2 cores, with -n 2: 29 s against 79 s
#: for test_tasks, test_properties and test_targets). Subprocesses the tests start (pytester's, torchrun's) get it too.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // WORKERS)))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A pytester folder holding `tiny.py`, ready for scripts."""
    pytester.makepyfile(tiny=TINY)
    return pytester
