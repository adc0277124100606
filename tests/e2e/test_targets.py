"""The `targets` stage: what a causal-LM fine-tune really supervises, on batches made by the Trainer's own collator.

Each bug has a correct script and its broken form, on the tiny Llama of `lm.py`. Every correct script was trained
with `python train.py` first, and the harm of every broken form measured in a direct run without the plugin
(numbers on the same data and sizes as below, batch 4 to 8, 3 to 300 steps):

- A. no supervised token: a prompt that fills `max_length` leaves its row with labels all -100 (12 of 32 rows with the
  plain Trainer and with packed completion-only SFT, 18 of 32 with packed assistant-only SFT); the loss still looks
  normal (about 3.18, like the correct run), a batch made only of such rows logs loss 0 and grad_norm 0
  (assistant-only SFT, step 5 of 8) or NaN (a forward pass of the plain Trainer).
- B. pad = eos with transformers' DataCollatorForLanguageModeling: end-of-sequence supervised 0 of 32 (32 of 32
  correct); after 300 steps P(eos) where every text ends is 0.012 (0.997 correct) and greedy decoding never stops.
- C. labels shifted by hand for a LlamaForCausalLM: the train loss falls as in the correct run (0.26 vs 0.22) but
  next-token accuracy is 0.03 (0.90 correct) while the token two ahead is predicted 0.88 of the time; greedy
  decoding skips every other word.
- D. a custom collator under SFT's completion-only loss: 155 of 155 prompt tokens carry a label (0 correct).

These need the `targets` stage (after `collate`); each test runs only `collate,targets`.
"""

from __future__ import annotations

import pytest
import trl  # noqa: F401
from pipeline_runs import GOOD_SCRIPT, failures, outcomes, run_script, write
from task_scripts import LM
from transformers import DataCollatorForLanguageModeling, DataCollatorForSeq2Seq, LlamaForCausalLM  # noqa: F401
from trl import SFTConfig, SFTTrainer  # noqa: F401

# The libraries above are imported here, before pytester's in-process runs, for the reason conftest gives.

STAGES = "--trainer-stages=collate,targets"


@pytest.fixture
def lm_project(project: pytest.Pytester) -> pytest.Pytester:
    project.makepyfile(lm=LM)
    return project


def run_targets(project: pytest.Pytester, source: str) -> pytest.RunResult:
    write(project, "train.py", source)
    return run_script(project, STAGES)


def check_passes(result: pytest.RunResult) -> None:
    statuses = outcomes(result)
    assert failures(result) == [], result.stdout.str()[-6000:]
    assert statuses.get("targets[cpu]") == "PASSED", (statuses, result.stdout.str()[-6000:])


def check_fails(result: pytest.RunResult, *patterns: str) -> None:
    assert failures(result) == ["targets[cpu]"], (outcomes(result), result.stdout.str()[-6000:])
    result.stdout.fnmatch_lines([f"*targets[[]cpu[]] failed*{patterns[0]}", *patterns[1:]])


# ---------------------------------------------------------------------------------------------------------------
# A. Rows with no supervised token: the completion cut off by max_length under a completion-only loss.

#: Plain Trainer, the Alpaca-style recipe: the prompt's labels set to -100, then prompt + completion truncated.
PLAIN_COMPLETION_ONLY = """
    import lm
    import tiny
    from datasets import Dataset
    from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments

    MAX_LENGTH = 32
    tok = lm.tokenizer()
    prompts = tiny.sentences(32, seed=6, shortest=2, longest=12)
    raw = Dataset.from_dict({"prompt": prompts, "completion": [" ".join(p.split()[::-1][:3]) for p in prompts]})


    def preprocess(row):
        prompt = tok(row["prompt"])["input_ids"]
        completion = tok(row["completion"])["input_ids"] + [tok.eos_token_id]
        input_ids = (prompt + completion)[:MAX_LENGTH]
        labels = ([-100] * len(prompt) + completion)[:MAX_LENGTH]
        return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "labels": labels}


    data = raw.map(preprocess, remove_columns=["prompt", "completion"])
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, report_to=[], bf16=False)
    trainer = Trainer(model=lm.model(), args=args, train_dataset=data, processing_class=tok,
                      data_collator=DataCollatorForSeq2Seq(tok))
    trainer.train()
"""

#: TRL, prompt-completion data (completion-only loss), packed: a prompt longer than max_length fills a packed row alone.
SFT_COMPLETION_ONLY = """
    import lm
    import tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    prompts = tiny.sentences(32, seed=6, shortest=2, longest=12)
    data = Dataset.from_dict({"prompt": prompts, "completion": [" " + " ".join(p.split()[::-1][:3]) for p in prompts]})
    args = SFTConfig(output_dir="out", completion_only_loss=True, packing=True, max_length=32, bf16=False,
                     per_device_train_batch_size=4, report_to=[])
    trainer = SFTTrainer(lm.model(), args=args, train_dataset=data, processing_class=lm.tokenizer())
    trainer.train()
"""

#: TRL, conversational data with the assistant-only loss: a chat template with {% generation %} markers, packed.
SFT_ASSISTANT_ONLY = """
    import lm
    import tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tok = lm.tokenizer()
    tok.chat_template = (
        "{% for message in messages %}"
        "{% if message['role'] == 'user' %}{{ '[CLS] ' + message['content'] + ' [SEP] ' }}"
        "{% else %}{% generation %}{{ message['content'] + ' [SEP]' }}{% endgeneration %}{{ ' ' }}{% endif %}"
        "{% endfor %}"
    )
    prompts = tiny.sentences(32, seed=6, shortest=2, longest=12)
    data = Dataset.from_dict({"messages": [[{"role": "user", "content": p},
                                            {"role": "assistant", "content": " ".join(p.split()[::-1][:3])}]
                                           for p in prompts]})
    args = SFTConfig(output_dir="out", assistant_only_loss=True, packing=True, max_length=32, bf16=False,
                     per_device_train_batch_size=4, report_to=[])
    trainer = SFTTrainer(lm.model(), args=args, train_dataset=data, processing_class=tok)
    trainer.train()
"""

#: Prompts of up to 12 words, max_length 8: 12 of the 32 rows (18 of 32 with the chat template) keep no completion.
CUT = {"MAX_LENGTH = 32": "MAX_LENGTH = 8", "max_length=32": "max_length=8"}


def cut(source: str) -> str:
    for old, new in CUT.items():
        source = source.replace(old, new)
    return source


def test_plain_trainer_completion_only_passes(lm_project: pytest.Pytester) -> None:
    check_passes(run_targets(lm_project, PLAIN_COMPLETION_ONLY))


def test_plain_trainer_completion_cut_off_by_max_length_fails(lm_project: pytest.Pytester) -> None:
    result = run_targets(lm_project, cut(PLAIN_COMPLETION_ONLY))
    check_fails(result, "*no supervised token*")


def test_sft_completion_only_packed_passes(lm_project: pytest.Pytester) -> None:
    check_passes(run_targets(lm_project, SFT_COMPLETION_ONLY))


def test_sft_completion_only_unpacked_short_max_length_cuts_the_answers(lm_project: pytest.Pytester) -> None:
    # Without packing, TRL 1.16 truncates in dataset preparation and drops the rows left with labels all -100
    # ("Dropping fully masked examples"): the rows that are fed all carry a supervised token, but most answers lose
    # their end (and their end token) to max_length=8: the model learns to break off. The length named keeps them.
    result = run_targets(lm_project, cut(SFT_COMPLETION_ONLY).replace("packing=True", "packing=False"))
    check_fails(
        result,
        "*sampled answers are cut by max_length=8 before their end; max_length=* keeps every sampled row whole*",
        "*fix: raise max_length to *",
    )
    result.stdout.no_fnmatch_line("*no supervised token*")


def test_sft_completion_only_packed_prompt_filling_max_length_fails(lm_project: pytest.Pytester) -> None:
    # Packing skips that filter: the "bfd" packer truncates each sequence to max_length, so a prompt that fills it
    # is a packed sequence of its own with nothing to learn. The batch is padding-free (one row of flattened
    # sequences, position_ids restarting at 0): the sequences, not the batch rows, are what has no supervised token.
    result = run_targets(lm_project, cut(SFT_COMPLETION_ONLY))
    check_fails(result, "*no supervised token*")


def test_sft_assistant_only_packed_passes(lm_project: pytest.Pytester) -> None:
    check_passes(run_targets(lm_project, SFT_ASSISTANT_ONLY))


def test_sft_assistant_only_answer_cut_off_by_max_length_fails(lm_project: pytest.Pytester) -> None:
    result = run_targets(lm_project, cut(SFT_ASSISTANT_ONLY))
    check_fails(result, "*no supervised token*")


# ---------------------------------------------------------------------------------------------------------------
# B. The end-of-sequence token never supervised: pad = eos, and a collator that sets the labels of pad ids to -100.

EOS = """
    import lm
    import tiny
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    tok = lm.tokenizer()
    texts = [text + " " + tok.eos_token for text in tiny.sentences(32, seed=7)]
    data = Dataset.from_dict({"text": texts}).map(lambda batch: tok(batch["text"]), batched=True, remove_columns=["text"])
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to=[], bf16=False)
    trainer = Trainer(model=lm.model(), args=args, train_dataset=data, processing_class=tok,
                      data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
    trainer.train()
"""

#: The common recipe for a tokenizer without a pad token, here on one that has one.
PAD_IS_EOS = ("    tok = lm.tokenizer()\n", "    tok = lm.tokenizer()\n    tok.pad_token = tok.eos_token\n")

#: TRL builds the labels before padding and pads them with -100, so pad = eos keeps the real eos supervised.
SFT_PAD_IS_EOS = """
    import lm
    import tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tok = lm.tokenizer()
    tok.pad_token = tok.eos_token
    data = Dataset.from_dict({"text": tiny.sentences(32, seed=7)})
    args = SFTConfig(output_dir="out", max_length=32, bf16=False, per_device_train_batch_size=8, report_to=[])
    trainer = SFTTrainer(lm.model(), args=args, train_dataset=data, processing_class=tok)
    trainer.train()
"""


def test_eos_with_its_own_pad_token_passes(lm_project: pytest.Pytester) -> None:
    check_passes(run_targets(lm_project, EOS))


def test_pad_token_equal_to_eos_fails_eos_never_supervised(lm_project: pytest.Pytester) -> None:
    result = run_targets(lm_project, EOS.replace(*PAD_IS_EOS))
    check_fails(result, "*end-of-sequence*never learns to stop*")


def test_sft_pad_token_equal_to_eos_passes(lm_project: pytest.Pytester) -> None:
    check_passes(run_targets(lm_project, SFT_PAD_IS_EOS))


# ---------------------------------------------------------------------------------------------------------------
# C. Labels shifted by hand for a model that shifts them itself.

SHIFT = """
    import lm
    import tiny
    from datasets import Dataset
    from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments

    tok = lm.tokenizer()


    def tokenize(row):
        ids = tok(row["text"])["input_ids"] + [tok.eos_token_id]
        return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": list(ids)}


    data = Dataset.from_dict({"text": tiny.sentences(32, seed=9)}).map(tokenize, remove_columns=["text"])
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to=[], bf16=False)
    trainer = Trainer(model=lm.model(), args=args, train_dataset=data, processing_class=tok,
                      data_collator=DataCollatorForSeq2Seq(tok))
    trainer.train()
"""

#: "the label of token t is token t+1", as for a model that does not shift: a LlamaForCausalLM does it again.
SHIFTED_BY_HAND = ('"labels": list(ids)', '"labels": ids[1:] + [-100]')


def test_labels_equal_to_inputs_pass(lm_project: pytest.Pytester) -> None:
    check_passes(run_targets(lm_project, SHIFT))


def test_labels_shifted_by_hand_fail(lm_project: pytest.Pytester) -> None:
    result = run_targets(lm_project, SHIFT.replace(*SHIFTED_BY_HAND))
    check_fails(result, "*shifted left by one*")


# ---------------------------------------------------------------------------------------------------------------
# D. Prompt tokens carrying labels under a completion-only loss.
#
# In TRL 1.16 SFTTrainer builds the labels during dataset preparation (-100 on the prompt) and drops the
# completion_mask column: no batch of its carries a completion_mask. A collator of the user's own that builds the
# labels from input_ids (as for pretraining) ignores the prepared labels, and every prompt token is trained. The
# prompt positions are those whose prepared label is -100 in the training split the Trainer holds.
# (transformers' DataCollatorForLanguageModeling cannot be the culprit here: it fails on the ragged labels column.)

COMPLETION_ONLY_COLLATOR = """
    import lm
    import tiny
    import torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tok = lm.tokenizer()
    prompts = tiny.sentences(32, seed=8, shortest=2, longest=8)
    data = Dataset.from_dict({"prompt": prompts, "completion": [" " + " ".join(p.split()[::-1][:3]) for p in prompts]})


    def collate(rows):
        batch = tok.pad([{"input_ids": row["input_ids"]} for row in rows], return_tensors="pt")
        width = batch["input_ids"].shape[1]
        batch["labels"] = torch.tensor([row["labels"] + [-100] * (width - len(row["labels"])) for row in rows])
        return batch


    args = SFTConfig(output_dir="out", completion_only_loss=True, max_length=32, bf16=False,
                     per_device_train_batch_size=4, report_to=[])
    trainer = SFTTrainer(lm.model(), args=args, train_dataset=data, processing_class=tok, data_collator=collate)
    trainer.train()
"""

#: The correct collator pads the prepared labels with -100; the broken one rebuilds them from input_ids.
IGNORES_PREPARED_LABELS = (
    'torch.tensor([row["labels"] + [-100] * (width - len(row["labels"])) for row in rows])',
    'batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)',
)


def test_sft_default_collator_completion_only_passes(lm_project: pytest.Pytester) -> None:
    source = COMPLETION_ONLY_COLLATOR.replace(", data_collator=collate", "")
    check_passes(run_targets(lm_project, source))


def test_sft_collator_padding_the_prepared_labels_passes(lm_project: pytest.Pytester) -> None:
    check_passes(run_targets(lm_project, COMPLETION_ONLY_COLLATOR))


def test_sft_collator_ignoring_the_prepared_labels_fails(lm_project: pytest.Pytester) -> None:
    source = COMPLETION_ONLY_COLLATOR.replace(*IGNORES_PREPARED_LABELS)
    assert source != COMPLETION_ONLY_COLLATOR
    result = run_targets(lm_project, source)
    check_fails(result, "*prompt tokens carry labels*")


# ---------------------------------------------------------------------------------------------------------------
# Not a causal LM: the stage does not apply, and says why.


def test_classification_skips_targets_with_a_reason(project: pytest.Pytester) -> None:
    result = run_targets(project, GOOD_SCRIPT)
    assert failures(result) == [], result.stdout.str()[-6000:]
    assert outcomes(result).get("targets[cpu]") == "SKIPPED", outcomes(result)
    # collate passed: the only skip is targets, and its `-rs` line gives a reason after the location.
    skips = [line for line in result.outlines if line.startswith("SKIPPED [")]
    print(*skips, sep="\n")
    assert len(skips) == 1 and skips[0].split(": ", 1)[-1].strip(), result.stdout.str()[-3000:]


def test_left_padding_for_training_names_the_prediction_made_from_a_pad(lm_project: pytest.Pytester) -> None:
    # A rotary Llama sees no position shift, but the first real token keeps its label, predicted from a pad.
    source = EOS.replace("    tok = lm.tokenizer()\n", "    tok = lm.tokenizer()\n    tok.padding_side = 'left'\n")
    assert source != EOS
    write(lm_project, "train.py", source)
    result = run_script(lm_project, "--trainer-stages=forward,padding")
    assert failures(result) == ["padding[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "*the loss differs*the tokenizer pads on the left, so the first real token keeps its label and is predicted "
            "from a pad position*",
            "*fix: pad on the right for training*",
        ]
    )
    result.stdout.no_fnmatch_line("*shortest failing row as text: '*[[]PAD[]]*")
