"""What the model is trained on against what it will be asked: the `targets` stage reads one view of the rows.

Each bug has its correct twin; every script is TRL's SFTTrainer (or the plain Trainer) on the tiny chat models of
`chat.py`, whose templates follow Llama 3, Qwen and Gemma. These need the `targets` stage; each test runs only
`collate,targets`.
"""

from __future__ import annotations

import json
import re

import pytest
import transformers
import trl  # noqa: F401
from chat_scripts import CHAT, RENDERED, sft
from pipeline_runs import failures, outcomes, run_script, write
from task_scripts import LM
from transformers import DataCollatorForLanguageModeling, LlamaForCausalLM  # noqa: F401
from trl import SFTConfig, SFTTrainer  # noqa: F401

# The libraries above are imported here, before pytester's in-process runs, for the reason conftest gives.

STAGES = "--trainer-stages=collate,targets"
TRANSFORMERS_5 = int(transformers.__version__.split(".")[0]) >= 5
#: The end of turn left out of the {% generation %} block of the Qwen-style template.
EOT_OUTSIDE = (
    "tok.chat_template = tok.chat_template.replace(\"'<|im_end|>' }}{% endgeneration %}\", "
    "\"'' }}{% endgeneration %}{{ '<|im_end|>' }}\")"
)
#: A base model's tokenizer and generation stop at <|endoftext|>; the ChatML template ends turns with <|im_end|>.
BASE_MODEL = (
    'tok.eos_token = "<|endoftext|>"\n    '
    'chat.STYLES["qwen"] = (*chat.STYLES["qwen"][:4], ["<|endoftext|>"], chat.STYLES["qwen"][5])'
)
#: A template that ignores the messages' reasoning_content.
NO_REASONING = 'tok.chat_template = tok.chat_template.replace("{% if m.reasoning_content %}", "{% if false %}")'


@pytest.fixture
def chat_project(project: pytest.Pytester) -> pytest.Pytester:
    project.makepyfile(chat=CHAT)
    return project


def run_targets(project: pytest.Pytester, source: str) -> pytest.RunResult:
    write(project, "train.py", source)
    return run_script(project, STAGES, "--trainer-report=report.json")


def figures(project: pytest.Pytester) -> dict[str, float]:
    items = json.loads((project.path / "report.json").read_text())["items"]
    return next(item["figures"] for item in items if item["stage"] == "targets")


def check_passes(result: pytest.RunResult) -> None:
    assert failures(result) == [], result.stdout.str()[-6000:]
    assert outcomes(result).get("targets[cpu]") == "PASSED", (outcomes(result), result.stdout.str()[-6000:])


def check_fails(result: pytest.RunResult, *patterns: str) -> None:
    assert failures(result) == ["targets[cpu]"], (outcomes(result), result.stdout.str()[-6000:])
    result.stdout.fnmatch_lines([f"*targets[[]cpu[]] failed*{patterns[0]}", *patterns[1:]])


@pytest.mark.parametrize("style", ["llama3", "qwen", "gemma"])
def test_a_correct_chat_sft_of_each_family_passes(chat_project: pytest.Pytester, style: str) -> None:
    # Gemma's tokenizer ends with <eos> but its turns with <end_of_turn>: generation stops at both (its generation
    # config lists them), so answers that end on <end_of_turn> are answers that stop.
    check_passes(run_targets(chat_project, sft(style)))
    found = figures(chat_project)
    assert found["answers"] == found["answers_ending_on_a_stop_token"] == 32, found


def test_an_end_of_turn_outside_the_generation_block_is_named_with_the_template_fix(
    chat_project: pytest.Pytester,
) -> None:
    result = run_targets(chat_project, sft("qwen", EOT_OUTSIDE))
    check_fails(
        result,
        "*32 of 32 sampled answers are followed by '<|im_end|>' but it carries no label*",
        "*fix: move '<|im_end|>' inside the chat template's {% generation %}*",
    )
    result.stdout.no_fnmatch_line("*pad token of its own*")  # the tokenizer has one: not the cause


def test_a_base_model_taught_an_end_of_turn_that_is_not_its_stop_token_is_named(chat_project: pytest.Pytester) -> None:
    result = run_targets(chat_project, sft("qwen", BASE_MODEL))
    check_fails(
        result,
        "*32 of 32 sampled answers end with '<|im_end|>', but generation stops at '<|endoftext|>' "
        "(generation_config.eos_token_id)*",
        "*fix: make generation stop at '<|im_end|>': model.generation_config.eos_token_id = *",
    )


def test_a_base_model_told_to_stop_at_the_end_of_turn_passes(chat_project: pytest.Pytester) -> None:
    # TRL's eos_token setting makes <|im_end|> the tokenizer's eos and adds it to the generation config's stops.
    check_passes(run_targets(chat_project, sft("qwen", BASE_MODEL, args="eos_token='<|im_end|>'")))


def test_reasoning_the_template_drops_is_named_and_one_it_renders_passes(chat_project: pytest.Pytester) -> None:
    check_passes(run_targets(chat_project, sft("qwen", reasoning=True)))
    result = run_targets(chat_project, sft("qwen", NO_REASONING, reasoning=True))
    check_fails(
        result,
        "*the stored conversations' reasoning_content (32 of 32 rows) are never trained*",
        "*fix: use a chat template that renders reasoning_content*",
    )


#: TRL's conversational prompt-completion form: the prompt turns, then the answer turn with its reasoning.
PROMPT_COMPLETION = """
    import chat
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tok = chat.tokenizer("qwen")
    {change}
    rows = chat.conversations(reasoning=True)
    data = Dataset.from_dict({{"prompt": [row[:-1] for row in rows], "completion": [row[-1:] for row in rows]}})
    args = SFTConfig(output_dir="out", max_length=64, bf16=False, per_device_train_batch_size=4, report_to=[]{args})
    trainer = SFTTrainer(chat.model(tok, "qwen"), args=args, train_dataset=data, processing_class=tok)
    trainer.train()
"""


@pytest.mark.parametrize(
    "form",
    ["messages-whole-sequence", "prompt-completion", "prompt-completion-whole-sequence"],
)
def test_reasoning_the_template_drops_is_named_in_every_form_trl_renders(
    chat_project: pytest.Pytester, form: str
) -> None:
    """Beside the assistant-only loss of a {% generation %} template (above): the whole conversation trained, and the
    prompt-completion form with and without its completion-only loss."""

    def source(change: str) -> str:
        if form == "messages-whole-sequence":
            return sft("qwen", change, reasoning=True).replace("assistant_only_loss=True", "assistant_only_loss=False")
        given = ", completion_only_loss=False" if form.endswith("whole-sequence") else ""
        return PROMPT_COMPLETION.format(change=change or "pass", args=given)

    check_passes(run_targets(chat_project, source("")))
    check_fails(
        run_targets(chat_project, source(NO_REASONING)),
        "*the stored conversations' reasoning_content (32 of 32 rows) are never trained*",
    )


#: A template that leaves out the system messages.
NO_SYSTEM = (
    'tok.chat_template = tok.chat_template.replace("{% for m in messages %}", '
    "\"{% for m in messages if m['role'] != 'system' %}\")"
)


@pytest.mark.parametrize("style", ["llama3", "qwen", "gemma"])
def test_a_system_turn_the_template_renders_passes(chat_project: pytest.Pytester, style: str) -> None:
    check_passes(run_targets(chat_project, sft(style, system=True)))


def test_a_turn_the_template_drops_is_named(chat_project: pytest.Pytester) -> None:
    result = run_targets(chat_project, sft("qwen", NO_SYSTEM, system=True))
    check_fails(
        result,
        "*the stored conversations' system turns (* of 32 rows) never reach the model*",
        "*fix: use a chat template that renders every message (system turns are left out)*",
    )


#: A template that leaves out the assistant's tool calls.
NO_TOOL_CALLS = 'tok.chat_template = tok.chat_template.replace("m.tool_calls or []", "[]")'


def test_tool_calls_of_an_earlier_turn_the_template_drops_are_named(chat_project: pytest.Pytester) -> None:
    # The call is an earlier assistant turn, followed by the tool's answer, as in every tool-calling chat.
    check_passes(run_targets(chat_project, sft("qwen", tools=True, max_length=96)))
    result = run_targets(chat_project, sft("qwen", NO_TOOL_CALLS, tools=True, max_length=96))
    check_fails(
        result,
        "*the stored conversations' tool_calls (32 of 32 rows) are never trained*",
        "*fix: use a chat template that renders tool_calls (a tool-calling template writes each call*",
    )
    # The tool's name is in every row (a tools block names it) while the calls are still dropped: the template
    # renders each conversation the same without them.
    named = NO_TOOL_CALLS + "\n    tok.chat_template = \"{{ 'lookup ' }}\" + tok.chat_template"
    result = run_targets(chat_project, sft("qwen", named, tools=True, max_length=96))
    check_fails(result, "*the stored conversations' tool_calls (32 of 32 rows) are never trained*")


def test_answers_cut_by_max_length_name_the_length_that_keeps_them(chat_project: pytest.Pytester) -> None:
    result = run_targets(chat_project, sft("qwen", max_length=14))
    check_fails(
        result,
        "*sampled answers are cut by max_length=14 before their end; max_length=* keeps every "
        "sampled row whole (they lose * tokens)*",
        "*fix: raise max_length to *",
    )


def test_a_template_rendered_to_text_and_tokenized_again_doubles_the_bos(chat_project: pytest.Pytester) -> None:
    result = run_targets(chat_project, RENDERED.format(system="", tokenize=""))
    check_fails(
        result,
        "*32 of 32 sampled rows begin with '<|begin_of_text|>' twice*",
        "*fix: tokenize the rendered text with add_special_tokens=False*",
    )
    result = run_targets(chat_project, RENDERED.format(system="", tokenize=", add_special_tokens=False"))
    check_passes(result)


def test_rows_trained_on_another_prompt_than_inference_gives_are_named(chat_project: pytest.Pytester) -> None:
    system = '[{"role": "system", "content": "the big dog"}] + '
    result = run_targets(chat_project, RENDERED.format(system=system, tokenize=", add_special_tokens=False"))
    check_fails(
        result,
        "*32 of 32 sampled conversations are trained on a prompt that differs from the one inference gives the model*",
        "*fix: build the training rows with the tokenizer's own chat template*",
        "*row as asked:*",
    )


# ---------------------------------------------------------------------------------------------------------------
# Weights whose updates vanish: a full fine-tune with the weights cast to bf16 and the Trainer's plain AdamW.

BF16_WEIGHTS = """
    import lm
    import tiny
    import torch
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    tok = lm.tokenizer()
    data = Dataset.from_dict({{"text": tiny.sentences(32, seed=3)}})
    data = data.map(lambda batch: tok(batch["text"]), batched=True, remove_columns=["text"])
    model = lm.model(){cast}
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, learning_rate=1e-5, report_to=[],
                             bf16={mixed})
    trainer = Trainer(model=model, args=args, train_dataset=data, processing_class=tok,
                      data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
    trainer.train()
"""


@pytest.fixture
def lm_project(project: pytest.Pytester) -> pytest.Pytester:
    project.makepyfile(lm=LM)
    return project


def test_bf16_weights_updated_in_place_are_named_and_fp32_weights_pass(lm_project: pytest.Pytester) -> None:
    write(lm_project, "train.py", BF16_WEIGHTS.format(cast=".to(torch.bfloat16)", mixed=False))
    result = run_script(lm_project, "--trainer-stages=step,padding")
    assert failures(result) == ["step[cpu]"], (outcomes(result), result.stdout.str()[-6000:])
    result.stdout.fnmatch_lines(
        [
            "*step[[]cpu[]] failed: * of * bfloat16 weight elements with a gradient kept their value after one step at "
            "learning rate 1e-05 (* tensors did not move, e.g. *norm*",
            "*fix: keep the trainable weights in float32*",
        ]
    )
    # The padding property reads the same bf16 model: its tolerance follows the weights' precision (no false alarm).
    assert outcomes(result)["padding[cpu]"] == "PASSED", result.stdout.str()[-6000:]

    write(lm_project, "train.py", BF16_WEIGHTS.format(cast="", mixed=True))
    result = run_script(lm_project, "--trainer-stages=step,padding")
    assert failures(result) == [], result.stdout.str()[-6000:]


@pytest.mark.parametrize("mixed", [True, False])
def test_bf16_weights_under_deepspeed_in_bf16_keep_their_updates_in_its_master_weights(
    lm_project: pytest.Pytester, mixed: bool
) -> None:
    # DeepSpeed in bf16 steps float32 master copies of the weights: the run without it here loses what DeepSpeed's
    # does not. In fp32 mode (bf16 not asked) it steps the bf16 weights themselves, as the Trainer does.
    script = BF16_WEIGHTS.format(cast=".to(torch.bfloat16)", mixed=mixed).replace(
        "report_to=[],", 'report_to=[], deepspeed={"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}},'
    )
    assert "deepspeed=" in script
    write(lm_project, "train.py", script)
    result = run_script(lm_project, "--trainer-stages=step", "--trainer-report=report.json")
    if not mixed:
        assert failures(result) == ["step[cpu]"], (outcomes(result), result.stdout.str()[-6000:])
        return
    assert failures(result) == [], result.stdout.str()[-6000:]
    step = next(
        item for item in json.loads((lm_project.path / "report.json").read_text())["items"] if item["stage"] == "step"
    )
    assert any(
        "the script trains with DeepSpeed in bf16, which steps float32 master copies of the weights" in note
        for note in step["notes"]
    ), step["notes"]


# ---------------------------------------------------------------------------------------------------------------
# Packed rows whose documents attend to each other: position_ids restart at each, the attention mask is all ones.

PACKED = """
    import lm
    import tiny
    import torch
    from datasets import Dataset
    from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments

    tok = lm.tokenizer()
    data = Dataset.from_dict({{"text": [text + " [SEP]" for text in tiny.sentences(32, seed=4)]}})
    data = data.map(lambda batch: tok(batch["text"]), batched=True, remove_columns=["text"])


    def pack(rows):
        ids = [token for row in rows for token in row["input_ids"]]
        positions = [index for row in rows for index in range(len(row["input_ids"]))]
        batch = {{"input_ids": torch.tensor([ids]), "position_ids": torch.tensor([positions]),
                 "labels": torch.tensor([ids])}}
        {mask}
        return batch


    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, report_to=[], bf16=False)
    trainer = Trainer(model=lm.model(), args=args, train_dataset=data, processing_class=tok, data_collator={collator})
    trainer.train()
"""
#: The hand-written packer's attention mask of ones over the whole packed row.
MASK_OF_ONES = 'batch["attention_mask"] = torch.ones_like(batch["input_ids"])'

PACKED_SFT = """
    import lm
    import tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    data = Dataset.from_dict({"text": tiny.sentences(32, seed=4)})
    args = SFTConfig(output_dir="out", packing=True, max_length=32, bf16=False, per_device_train_batch_size=4,
                     report_to=[])
    trainer = SFTTrainer(lm.model(), args=args, train_dataset=data, processing_class=lm.tokenizer())
    trainer.train()
"""


def test_packed_documents_under_a_mask_of_ones_attend_to_each_other(lm_project: pytest.Pytester) -> None:
    write(lm_project, "train.py", PACKED.format(mask=MASK_OF_ONES, collator="pack"))
    result = run_script(lm_project, "--trainer-stages=forward")
    assert failures(result) == ["forward[cpu]"], (outcomes(result), result.stdout.str()[-6000:])
    result.stdout.fnmatch_lines(
        [
            "*forward[[]cpu[]] failed: packed documents attend to each other: document 2 of the first packed row "
            "(tokens * to *) gets logits that differ by * from the same document alone, because the batch's "
            "attention_mask is ones over the whole packed row*",
            "*fix: leave attention_mask out of packed batches and pass position_ids*",
        ]
    )


@pytest.mark.parametrize(
    "source",
    [
        PACKED.format(mask="pass", collator="pack"),
        PACKED.format(mask="pass", collator="DataCollatorWithFlattening()"),
        PACKED_SFT,
    ],
    ids=["no-mask", "flattening", "trl-bfd"],
)
def test_packed_documents_kept_apart_pass(lm_project: pytest.Pytester, source: str) -> None:
    # transformers separates packed documents by their position_ids when the model builds no cache: transformers 5's
    # Trainer sets use_cache=False, and TRL's SFT (activation checkpointing on) does under transformers 4 too.
    write(lm_project, "train.py", source)
    result = run_script(lm_project, "--trainer-stages=forward", "--trainer-report=report.json")
    if not TRANSFORMERS_5 and source != PACKED_SFT:
        assert failures(result) == ["forward[cpu]"], result.stdout.str()[-6000:]
        result.stdout.fnmatch_lines(
            [
                "*packed documents attend to each other*because the model builds a generation "
                "cache in training (config.use_cache=True)*",
                "*fix: train without the cache: TrainingArguments(use_cache=False) under transformers 5*",
            ]
        )
        return
    assert failures(result) == [], result.stdout.str()[-6000:]
    notes = [
        note for item in json.loads((lm_project.path / "report.json").read_text())["items"] for note in item["notes"]
    ]
    assert any(note.startswith("packed documents kept apart") for note in notes), notes


def test_packed_documents_of_a_model_that_builds_a_cache_attend_to_each_other(lm_project: pytest.Pytester) -> None:
    # Measured under transformers 4.57 and 5.24 alike: a tiny Llama with use_cache=True gives a packed document
    # logits 0.043 away from its own; with use_cache=False, 4e-8.
    source = PACKED.format(mask="pass", collator="pack").replace(
        "trainer.train()", "trainer.model.config.use_cache = True\n    trainer.train()"
    )
    write(lm_project, "train.py", source)
    result = run_script(lm_project, "--trainer-stages=forward")
    assert failures(result) == ["forward[cpu]"], result.stdout.str()[-6000:]
    result.stdout.fnmatch_lines(
        [
            "*because the model builds a generation cache in training (config.use_cache=True)*",
            "*fix: train without the cache: TrainingArguments(use_cache=False) under transformers 5*",
        ]
    )


# ---------------------------------------------------------------------------------------------------------------
# Preference pairs with nothing left to prefer: a long shared start, and max_length cutting before the answers differ.

DPO_LORA = """
    import lm
    import tiny
    from datasets import Dataset
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer

    prompts = tiny.sentences(32, seed=3, shortest=2, longest=6)
    shared = " the big red dog sat on the mat under the tree and"
    data = Dataset.from_dict({{"prompt": prompts,
                              "chosen": [shared + " " + " ".join(p.split()[::-1]) for p in prompts],
                              "rejected": [shared + " " + " ".join(p.split()[::-1]) + " bird" for p in prompts]}})
    args = DPOConfig(output_dir="out", bf16=False, per_device_train_batch_size=4, max_length={max_length},
                     report_to=[])
    # LoRA and no reference model: the reference is the model with its adapters off.
    trainer = DPOTrainer(lm.model(), args=args, train_dataset=data, processing_class=lm.tokenizer(),
                         peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    trainer.train()
"""


def test_preference_pairs_cut_before_they_differ_are_named(lm_project: pytest.Pytester) -> None:
    write(lm_project, "train.py", DPO_LORA.format(max_length=14))
    result = run_script(lm_project, "--trainer-stages=collate,targets")
    assert failures(result) == ["targets[cpu]"], (outcomes(result), result.stdout.str()[-6000:])
    result.stdout.fnmatch_lines(
        [
            "*targets[[]cpu[]] failed: 32 of 32 sampled preference pairs have the same chosen and rejected tokens once "
            "cut at max_length=14: they first differ at token * to * of the stored pair*",
            "*fix: raise max_length to at least *",
        ]
    )


def test_dpo_with_lora_and_no_reference_model_passes(lm_project: pytest.Pytester) -> None:
    write(lm_project, "train.py", DPO_LORA.format(max_length=64))
    result = run_script(
        lm_project, "--trainer-stages=collate,targets,forward,backward,step", "--trainer-report=report.json"
    )
    assert failures(result) == [], result.stdout.str()[-6000:]
    assert outcomes(result)["targets[cpu]"] == "PASSED"
    assert figures(lm_project)["pairs_the_same"] == 0


def test_the_html_report_shows_a_row_as_trained_beside_the_prompt_inference_gives(
    chat_project: pytest.Pytester,
) -> None:
    write(chat_project, "train.py", sft("qwen"))
    result = run_script(chat_project, STAGES, "--trainer-html=report.html")
    assert failures(result) == [], result.stdout.str()[-6000:]
    text = (chat_project.path / "report.html").read_text()
    assert "rows as trained, each beside the prompt inference gives the model" in text
    rows = text.split("picture-asked", 1)[1].split("class='row'")[1:]
    assert len(rows) == 2, rows
    for row in rows:
        asked = re.findall(r"<span class='asked-token'[^>]*>([^<]*)</span>", row)
        trained = re.findall(r"<span class='token (?:un)?trained'[^>]*>([^<]*)</span>", row)
        # The prompt inference gives is the trained row's start, up to the assistant's header.
        assert asked[:2] == ["&lt;|im_start|&gt;", "user"], asked
        assert asked[-2:] == ["&lt;|im_start|&gt;", "assistant"], asked
        assert trained[: len(asked)] == asked and len(trained) > len(asked), (trained, asked)


# ---------------------------------------------------------------------------------------------------------------
# Truncation no setting of the Trainer names (a framework's cutoff_len, a script's own): read from the rows.

OWN_TRUNCATION = """
    import lm
    import tiny
    from datasets import Dataset
    from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments

    CUTOFF = {cutoff}
    tok = lm.tokenizer()
    prompts = tiny.sentences(32, seed=6, shortest=2, longest=12)
    raw = Dataset.from_dict({{"prompt": prompts, "completion": [" ".join(p.split()[::-1][:3]) for p in prompts]}})


    def preprocess(row):
        prompt = tok(row["prompt"])["input_ids"]
        completion = tok(row["completion"])["input_ids"] + [tok.eos_token_id]
        input_ids = (prompt + completion)[:CUTOFF]
        labels = ([-100] * len(prompt) + completion)[:CUTOFF]
        return {{"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "labels": labels}}


    data = raw.map(preprocess, remove_columns=["prompt", "completion"])
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, report_to=[], bf16=False)
    trainer = Trainer(model=lm.model(), args=args, train_dataset=data, processing_class=tok,
                      data_collator=DataCollatorForSeq2Seq(tok))
    trainer.train()
"""


def test_answers_cut_by_a_truncation_of_the_scripts_own_are_found_from_the_rows(lm_project: pytest.Pytester) -> None:
    result = run_targets(lm_project, OWN_TRUNCATION.format(cutoff=13))
    check_fails(
        result,
        "*sampled answers are cut by max_length=13 before their end*",
        "*fix: raise max_length (or shorten the longest rows*",
    )
    check_passes(run_targets(lm_project, OWN_TRUNCATION.format(cutoff=64)))


def test_rows_cut_at_their_start_lose_the_question(chat_project: pytest.Pytester) -> None:
    result = run_targets(chat_project, sft("qwen", max_length=14, args="truncation_mode='keep_end'"))
    check_fails(
        result,
        "*sampled rows are cut by max_length=14 at their start: they lose the beginning of their "
        "prompt (they do not begin with '<|im_start|>' as the others do)*",
        "*fix: raise max_length*",
    )
    result.stdout.no_fnmatch_line("*before their end*")  # the answers are whole


WRAPPED = """
    import lm
    import tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    data = Dataset.from_dict({"prompt": tiny.sentences(32, seed=4),
                              "completion": [" " + text for text in tiny.sentences(32, seed=5)]})
    args = SFTConfig(output_dir="out", packing=True, packing_strategy="wrapped", max_length=32, bf16=False,
                     per_device_train_batch_size=4, report_to=[])
    trainer = SFTTrainer(lm.model(), args=args, train_dataset=data, processing_class=lm.tokenizer())
    trainer.train()
"""


def test_rows_of_trls_wrapped_packing_are_chunks_whose_ends_are_no_answers_ends(lm_project: pytest.Pytester) -> None:
    # "wrapped" packs the samples end to end and cuts the stream every max_length tokens: an answer that goes on in
    # the next row is not cut by truncation, and the fix "raise max_length" would not follow.
    write(lm_project, "train.py", WRAPPED)
    result = run_script(lm_project, "--trainer-stages=collate,targets")
    assert failures(result) == [], result.stdout.str()[-6000:]
    assert outcomes(result)["targets[cpu]"] == "PASSED"


#: A packer of one's own that joins the samples end to end: no position_ids, an attention mask of ones.
JOINED = PACKED.replace(
    """        positions = [index for row in rows for index in range(len(row["input_ids"]))]
        batch = {{"input_ids": torch.tensor([ids]), "position_ids": torch.tensor([positions]),
                 "labels": torch.tensor([ids])}}""",
    """        batch = {{"input_ids": torch.tensor([ids]), "labels": torch.tensor([ids])}}""",
)


def test_conversations_packed_with_no_boundary_attend_to_each_other(lm_project: pytest.Pytester) -> None:
    assert JOINED != PACKED
    conversations = JOINED.format(mask=MASK_OF_ONES, collator="pack").replace(
        'data = Dataset.from_dict({"text": [text + " [SEP]" for text in tiny.sentences(32, seed=4)]})',
        'data = Dataset.from_dict({"messages": [[{"role": "user", "content": text}, {"role": "assistant", '
        '"content": text + " [SEP]"}] for text in tiny.sentences(32, seed=4)]})\n'
        '    data = data.map(lambda row: {"text": " ".join(turn["content"] for turn in row["messages"])})',
    )
    assert '"messages"' in conversations
    write(lm_project, "train.py", conversations)
    result = run_script(lm_project, "--trainer-stages=forward")
    assert failures(result) == ["forward[cpu]"], (outcomes(result), result.stdout.str()[-6000:])
    result.stdout.fnmatch_lines(
        [
            "*forward[[]cpu[]] failed: the collator packs samples into one sequence with no boundary between them "
            "(position_ids do not restart): the second of two packed samples * attends to the one before it; these "
            "samples are separate conversations*",
            "*fix: give each packed sample position_ids that restart at 0 and leave attention_mask out*",
        ]
    )


def test_texts_packed_with_no_boundary_are_a_note(lm_project: pytest.Pytester) -> None:
    # Pretraining-style packing streams texts end to end on purpose: said, not failed.
    write(lm_project, "train.py", JOINED.format(mask=MASK_OF_ONES, collator="pack"))
    result = run_script(lm_project, "--trainer-stages=forward", "--trainer-report=report.json")
    assert failures(result) == [], result.stdout.str()[-6000:]
    notes = [
        note for item in json.loads((lm_project.path / "report.json").read_text())["items"] for note in item["notes"]
    ]
    assert any(note.startswith("the collator packs samples into one sequence with no boundary") for note in notes)


def test_prompt_and_answer_samples_packed_with_no_boundary_attend_to_each_other(lm_project: pytest.Pytester) -> None:
    # No stored conversation: the labels leave each sample's prompt out (-100), so each is an example of its own.
    prompted = (
        JOINED.format(mask=MASK_OF_ONES, collator="pack")
        .replace(
            'remove_columns=["text"])',
            'remove_columns=["text"])\n    data = data.map(lambda row: {"labels": [-100, -100] + row["input_ids"][2:]})',
        )
        .replace('"labels": torch.tensor([ids])}', '"labels": torch.tensor([[t for r in rows for t in r["labels"]]])}')
    )
    assert prompted.count('"labels"') == 3
    write(lm_project, "train.py", prompted)
    result = run_script(lm_project, "--trainer-stages=forward")
    assert failures(result) == ["forward[cpu]"], (outcomes(result), result.stdout.str()[-6000:])
    result.stdout.fnmatch_lines(
        [
            "*forward[[]cpu[]] failed: the collator packs samples into one sequence with no "
            "boundary between them*these samples are separate conversations*"
        ]
    )
