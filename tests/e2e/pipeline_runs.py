"""What the end-to-end tests share: the scripts they run and how they run and read them. A test imports what it uses
from here (`from pipeline_runs import write, run_script, failures`); conftest.py holds the fixtures.

The tiny real BERT and the tokenizer built locally (`TINY`) are written beside each test's scripts as `tiny.py`, which
the scripts import as a real repository's scripts import their own helpers.
"""

from __future__ import annotations

import re
import textwrap

import pytest

from pytest_trainer import plan

#: Every item of a script on one device, in the order the plugin runs them (pinned by tests/unit/test_plan.py).
ITEMS = plan.STAGES

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
    trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=data, eval_dataset=data, processing_class=tok)
    trainer.train()
"""


#: Correct pipelines of every kind the plugin must pass without a false alarm.
KIND_SCRIPTS = {
    "classification": GOOD_SCRIPT,
    "regression": """
        import tiny
        from transformers import Trainer, TrainingArguments

        tok = tiny.tokenizer()
        raw = tiny.text_dataset().map(lambda row: {"label": len(row["text"].split()) / 10.0})
        data = tiny.tokenized(raw, tok)
        args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
        trainer = Trainer(model=tiny.classifier(num_labels=1), args=args, train_dataset=data, eval_dataset=data,
                          processing_class=tok)
        trainer.train()
    """,
    "causal-lm": """
        import tiny
        from transformers import (DataCollatorForLanguageModeling, GPT2Config, GPT2LMHeadModel, Trainer,
                                  TrainingArguments)

        tok = tiny.tokenizer()
        data = tiny.tokenized(tiny.text_dataset(), tok).remove_columns(["label"])
        model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tiny.VOCAB), n_embd=16, n_layer=1, n_head=2,
                                           n_positions=64, pad_token_id=0))
        args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
        trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data, processing_class=tok,
                          data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
        trainer.train()
    """,
    "causal-lm-packed": """
        import tiny
        from datasets import Dataset
        from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

        tok = tiny.tokenizer()
        stream = [i for ids in tok(tiny.sentences(96))["input_ids"] for i in ids]
        blocks = [stream[start:start + 16] for start in range(0, len(stream) - 15, 16)]
        data = Dataset.from_dict({"input_ids": blocks, "labels": blocks})
        model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tiny.VOCAB), n_embd=16, n_layer=1, n_head=2,
                                           n_positions=64))
        args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
        trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data)
        trainer.train()
    """,
    "masked-lm": """
        import tiny
        from transformers import BertForMaskedLM, DataCollatorForLanguageModeling, Trainer, TrainingArguments

        tok = tiny.tokenizer()
        data = tiny.tokenized(tiny.text_dataset(), tok).remove_columns(["label"])
        args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
        trainer = Trainer(model=BertForMaskedLM(tiny.config()), args=args, train_dataset=data, eval_dataset=data,
                          processing_class=tok, data_collator=DataCollatorForLanguageModeling(tok, mlm_probability=0.3))
        trainer.train()
    """,
    "token-classification": """
        import tiny
        from transformers import (BertForTokenClassification, DataCollatorForTokenClassification, Trainer,
                                  TrainingArguments)

        tok = tiny.tokenizer()

        def tag(batch):
            encoded = tok(batch["text"], truncation=True)
            encoded["labels"] = [
                [-100 if word is None else (i + word) % 4
                 for word in encoded.word_ids(i)]
                for i in range(len(batch["text"]))
            ]
            return encoded

        data = tiny.text_dataset().map(tag, batched=True, remove_columns=["text", "label"])
        args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
        trainer = Trainer(model=BertForTokenClassification(tiny.config(num_labels=4)), args=args,
                          train_dataset=data, eval_dataset=data, processing_class=tok,
                          data_collator=DataCollatorForTokenClassification(tok))
        trainer.train()
    """,
}


def write(pytester: pytest.Pytester, name: str, source: str) -> str:
    """Write a script into the pytester folder and return its file name."""
    path = pytester.path / name
    path.write_text(textwrap.dedent(source))
    return name


#: A GPU's memory for the `memory` stage to forecast against, so that it runs in every kind of pipeline here (without
#: a GPU or a budget the default suite skips it: tests/e2e/test_memory.py).
BUDGET = "--trainer-gpu-memory=80"


def run_script(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """Run the pipeline items of `train.py` on the CPU, verbosely, so `outcomes` can read each item; the memory
    forecast holds a step to an 80 GiB GPU (a later --trainer-gpu-memory in `args` wins)."""
    return pytester.runpytest("--trainer-module=train.py", "--trainer-devices=cpu", "-v", "-rs", BUDGET, *args)


OUTCOME = "(PASSED|FAILED|SKIPPED|ERROR)"
ITEM = r"(?:\S*/)?([^/\s]+)::(\S+)"
#: `train.py::forward[cpu] PASSED`, or under xdist `[gw0] [ 10%] PASSED train.py::forward[cpu]`.
VERBOSE_LINE = re.compile(rf"^(?:{ITEM} {OUTCOME}|\[gw\d+\] \[\s*\d+%\] {OUTCOME} {ITEM})")


def outcomes(result: pytest.RunResult, script: str = "train.py", load: bool = False) -> dict[str, str]:
    """`{"forward[cpu]": "PASSED", ...}` for each stage item of `script` in a verbose run; with `load`, its
    `load[...]` item too (when it fails, every stage item is skipped, which the stage outcomes show)."""
    found = {}
    for match in filter(None, map(VERBOSE_LINE.match, result.outlines)):
        file, item, outcome = match.group(1, 2, 3) if match[1] else match.group(5, 6, 4)
        if file == script and (load or not item.startswith("load[")):
            found[item] = outcome
    return found


def failures(result: pytest.RunResult, script: str = "train.py") -> list[str]:
    """The items of `script` that failed, its `load` item included."""
    return [item for item, outcome in outcomes(result, script, load=True).items() if outcome in ("FAILED", "ERROR")]
