"""Shared test helpers: a tiny real BERT and a tokenizer built locally, written beside each test's scripts."""

from __future__ import annotations

import textwrap

import accelerate  # noqa: F401
import datasets  # noqa: F401
import pyarrow  # noqa: F401
import pytest
import tokenizers  # noqa: F401
import torch  # noqa: F401
import transformers  # noqa: F401
from transformers import BertForSequenceClassification, PreTrainedTokenizerFast, Trainer  # noqa: F401

# Imported here, once: pytester's in-process runs forget modules first imported inside them, and
# libraries with C extensions (torch above all) cannot be imported a second time in one process.
pytest_plugins = ["pytester"]

#: A module the test scripts import, as a real repository's scripts import their own helpers.
TINY = '''
"""Tiny real models and data for pipeline tests: a config-built BERT and a WordLevel tokenizer."""
import random

from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

WORDS = "the a cat dog bird sat ran flew on under mat log tree big small red blue fast slow".split()
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = {word: index for index, word in enumerate(SPECIAL + WORDS)}


def tokenizer(pad=True):
    core = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", VOCAB["[CLS]"]), ("[SEP]", VOCAB["[SEP]"])],
    )
    special = dict(unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    if pad:
        special["pad_token"] = "[PAD]"
    return PreTrainedTokenizerFast(tokenizer_object=core, model_max_length=64, **special)


def sentences(count, seed=0, shortest=2, longest=12):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(shortest, longest))) for _ in range(count)]


def text_dataset(count=48, classes=3, seed=0):
    return Dataset.from_dict({"text": sentences(count, seed), "label": [i % classes for i in range(count)]})


def tokenized(dataset, tok=None):
    tok = tok or tokenizer()
    return dataset.map(lambda batch: tok(batch["text"], truncation=True), batched=True, remove_columns=["text"])


def config(**overrides):
    settings = dict(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=64, num_labels=3)
    settings.update(overrides)
    return BertConfig(**settings)


def classifier(**overrides):
    return BertForSequenceClassification(config(**overrides))
'''

#: The smallest correct script: tokenized data, a 3-class head, the tokenizer given to the Trainer.
GOOD_SCRIPT = """
    import tiny
    from transformers import Trainer, TrainingArguments

    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(), tok)
    args = TrainingArguments(output_dir="checkpoints", per_device_train_batch_size=8, report_to="none")
    trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=data, processing_class=tok)
    trainer.train()
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A pytester folder holding `tiny.py`, ready for scripts."""
    pytester.makepyfile(tiny=TINY)
    return pytester


def write(pytester: pytest.Pytester, name: str, source: str) -> str:
    """Write a script into the pytester folder and return its file name."""
    path = pytester.path / name
    path.write_text(textwrap.dedent(source))
    return name
