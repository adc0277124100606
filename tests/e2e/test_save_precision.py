"""The `save` and `precision` stages: what fails hours into a run, found on the fixed batch before it starts.

`save` writes the first checkpoint with the Trainer's own code and reloads it as a user would; `precision` checks the
script's own fp16/bf16 (read from its flags: on this machine without a GPU the plugin turns them off so the Trainer
builds, and the other items run in fp32).

Each broken form was first run without the plugin (transformers 5.23, torch 2.13, safetensors 0.8, CPU):

- shared weights not declared tied, in a model of one's own: `Trainer.save_model` stops in safetensors' save_file
  with "RuntimeError: Some tensors share memory ... [{'head.weight', 'encoder.embeddings.word_embeddings.weight'}]";
- a set in the model's config: `save_pretrained` stops with "TypeError: Object of type set is not JSON serializable"
  (so do object(), a torch.dtype or a function set as an extra config attribute);
- fp16=True is accepted by TrainingArguments on a CPU (bf16=True is not: "Your setup doesn't support bf16/gpu");
- the tiny BERT with `intermediate.dense.weight` scaled by 1e6: that layer's largest output on the first batch is
  2.7e5, it holds inf under fp16 autocast and the loss is NaN; under bf16 autocast the loss is 1.099 (fp32: 1.098).
  Scaled by 1e4 its largest output is only 2.7e3 and fp16 autocast stays finite, so 1e6 is used below.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import peft  # noqa: F401
import pytest
import torch
from peft import LoraConfig, get_peft_model  # noqa: F401
from pipeline_runs import GOOD_SCRIPT, failures, outcomes, run_script, write
from task_scripts import LM
from transformers import BertModel, LlamaForCausalLM  # noqa: F401

# The libraries above are imported here, before pytester's in-process runs, for the reason conftest gives.

#: save needs step; precision needs only backward.
SAVE_STAGES = ("dataset", "collate", "forward", "backward", "step", "save")
PRECISION_STAGES = ("dataset", "collate", "forward", "backward", "precision")

#: What the plugin says when it turns the script's mixed precision off on a machine without a GPU.
TURNED_OFF = "precision: the script asks for {flag}=True; this machine has no GPU, so the items run in fp32"


def run_stages(project: pytest.Pytester, source: str, stages: tuple[str, ...]) -> tuple[pytest.RunResult, dict]:
    """Run `stages` of `source` as train.py; the run and the JSON report's items of train.py on the CPU, by stage."""
    write(project, "train.py", source)
    result = run_script(project, "--trainer-stages=" + ",".join(stages), "--trainer-report=report.json")
    report = json.loads((project.path / "report.json").read_text())
    items = {
        item["stage"]: item
        for item in report["items"]
        if item["script"] == "train.py" and item["device"] == "cpu" and item["stage"] != "load"
    }
    assert set(items) == set(stages), (sorted(items), result.stdout.str()[-6000:])
    return result, items


def check_passes(result: pytest.RunResult, items: dict, stages: tuple[str, ...]) -> dict[str, Any]:
    """Every item ran and passed; the report's item of the last stage."""
    assert failures(result) == [], result.stdout.str()[-6000:]
    assert outcomes(result) == {f"{stage}[cpu]": "PASSED" for stage in stages}, result.stdout.str()[-6000:]
    item = items[stages[-1]]
    assert item["outcome"] == "passed" and item["diagnosis"] == "" and item["fix"] == "", item
    return item


def check_fails(result: pytest.RunResult, items: dict, stages: tuple[str, ...]) -> dict[str, Any]:
    """The last stage, alone, failed (its prerequisites passed); the report's item of it, shown in the terminal."""
    stage = stages[-1]
    expected = {f"{name}[cpu]": "PASSED" for name in stages[:-1]} | {f"{stage}[cpu]": "FAILED"}
    assert outcomes(result) == expected, result.stdout.str()[-6000:]
    item = items[stage]
    assert item["outcome"] == "failed" and item["diagnosis"] and item["fix"], item
    first = item["diagnosis"].splitlines()[0]
    assert f"{stage}[cpu] failed: {first}" in result.outlines, result.stdout.str()[-6000:]  # the item's own report
    assert f"  fix: {item['fix']}" in result.outlines, result.stdout.str()[-6000:]
    return item


def saved_files(note: str) -> set[str]:
    """The files the save note lists: `checkpoint of 0.1 MiB (config.json, model.safetensors, ...); how`."""
    assert note.startswith("checkpoint of ") and " (" in note and "); " in note, note
    return set(note.split(" (", 1)[1].split("); ", 1)[0].split(", "))


def turned_off(result: pytest.RunResult, flag: str) -> None:
    """Without a GPU the plugin says it turned the script's flag off (the precision stage still reads it)."""
    if not torch.cuda.is_available():
        result.stdout.fnmatch_lines([TURNED_OFF.format(flag=flag) + "*"])


# ---------------------------------------------------------------------------------------------------------------
# save


#: GOOD_SCRIPT with a line run on the built model (`change`) and TrainingArguments flags.
CLASSIFIER_SCRIPT = """
    import tiny
    from transformers import Trainer, TrainingArguments

    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(), tok)
    model = tiny.classifier()
    {change}
    args = TrainingArguments(output_dir="checkpoints", per_device_train_batch_size=8, report_to="none"{flags})
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data, processing_class=tok)
    trainer.train()
"""


def classifier_script(change: str = "", flags: str = "") -> str:
    return CLASSIFIER_SCRIPT.format(change=change, flags=flags)


def test_correct_pipeline_saves_and_reloads_to_the_same_outputs(project: pytest.Pytester) -> None:
    result, items = run_stages(project, GOOD_SCRIPT, SAVE_STAGES)
    save = check_passes(result, items, SAVE_STAGES)
    (note,) = save["notes"]
    assert note.endswith("BertForSequenceClassification.from_pretrained reloads it to the same outputs"), note
    assert {
        "config.json",
        "model.safetensors",
        "optimizer.pt",
        "scheduler.pt",
        "rng_state.pth",
        "tokenizer.json",
        "training_args.bin",
    } <= saved_files(note), note
    # The tiny BERT holds about 4,000 fp32 weights: 16 KiB, 48 KiB with Adam's two moments, and the tokenizer.
    assert 0.01 < save["figures"]["checkpoint_mib"] < 1, save["figures"]
    assert save["figures"]["checkpoint_files"] >= 7, save["figures"]


#: An optimizer whose state cannot be saved: the Trainer's checkpoints fail where they hold it.
UNSAVED_STATE = """
    import tiny
    import torch
    from transformers import Trainer, TrainingArguments

    class NoState(torch.optim.AdamW):  # a callable in its param groups: torch.save cannot pickle it
        def __init__(self, params, **kwargs):
            super().__init__(params, **kwargs)
            for group in self.param_groups:
                group["on_step"] = lambda: None

    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(), tok)
    model = tiny.classifier()
    args = TrainingArguments(output_dir="checkpoints", per_device_train_batch_size=8, report_to="none"{flags})
    trainer = Trainer(model=model, args=args, train_dataset=data, processing_class=tok,
                      optimizers=(NoState(model.parameters(), lr=5e-5), None))
    trainer.train()
"""


def test_resuming_is_checked_only_where_the_checkpoints_hold_the_optimizer(project: pytest.Pytester) -> None:
    result, items = run_stages(project, UNSAVED_STATE.format(flags=""), SAVE_STAGES)
    item = check_fails(result, items, SAVE_STAGES)
    assert "pickle" in item["diagnosis"], item
    result, items = run_stages(project, UNSAVED_STATE.format(flags=", save_only_model=True"), SAVE_STAGES)
    save = check_passes(result, items, SAVE_STAGES)
    assert any(
        note.startswith("save_only_model=True: the Trainer's checkpoints hold the model alone")
        for note in save["notes"]
    ), save
    assert "optimizer.pt" not in " ".join(save["notes"]), save["notes"]


#: A masked LM of the user's own (an nn.Module, not a PreTrainedModel): a BERT encoder and a vocabulary head.
OWN_MASKED_LM = """
    import tiny
    from torch import nn
    from transformers import BertModel, DataCollatorForLanguageModeling, Trainer, TrainingArguments


    class MaskedLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = BertModel(tiny.config(), add_pooling_layer=False)
            self.head = nn.Linear(16, len(tiny.VOCAB))
            {tie}

        def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                  token_type_ids=token_type_ids).last_hidden_state
            logits = self.head(hidden)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
            return {{"loss": loss, "logits": logits}}


    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(), tok).remove_columns(["label"])
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
    trainer = Trainer(model=MaskedLM(), args=args, train_dataset=data, eval_dataset=data, processing_class=tok,
                      data_collator=DataCollatorForLanguageModeling(tok, mlm_probability=0.3))
    trainer.train()
"""

#: The head's weight made the very Parameter of the word embeddings, with nothing declaring the tie.
SHARED_HEAD = "self.head.weight = self.encoder.embeddings.word_embeddings.weight"


def test_own_model_with_undeclared_shared_weights_fails_save(project: pytest.Pytester) -> None:
    result, items = run_stages(project, OWN_MASKED_LM.format(tie=SHARED_HEAD), SAVE_STAGES)
    save = check_fails(result, items, SAVE_STAGES)
    diagnosis, fix = save["diagnosis"], save["fix"]
    assert diagnosis.startswith("safetensors refuses to save weights that share memory without being declared tied"), (
        diagnosis
    )
    assert "'head.weight'" in diagnosis and "'encoder.embeddings.word_embeddings.weight'" in diagnosis, diagnosis
    assert "save_model fail" in diagnosis, diagnosis
    assert "_tied_weights_keys" in fix and "tie_weights" in fix and "nn.Parameter(weight.clone())" in fix, fix


def test_own_model_without_shared_weights_passes_save(project: pytest.Pytester) -> None:
    result, items = run_stages(project, OWN_MASKED_LM.format(tie=""), SAVE_STAGES)
    save = check_passes(result, items, SAVE_STAGES)
    (note,) = save["notes"]
    # No config: Trainer._save writes the state dict alone with safetensors for a model that is not a PreTrainedModel.
    assert "model.safetensors" in saved_files(note) and "config.json" not in saved_files(note), note
    assert note.endswith(
        "the MaskedLM has no from_pretrained: its checkpoint holds its whole state dict "
        "(reload it with load_state_dict(safetensors.torch.load_file(...)))"
    ), note


LORA_LM = """
    import lm
    import tiny
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    tok = lm.tokenizer()
    data = Dataset.from_dict({"text": tiny.sentences(32, seed=7)}).map(lambda batch: tok(batch["text"]), batched=True,
                                                                        remove_columns=["text"])
    model = get_peft_model(lm.model(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, learning_rate=1e-3, report_to="none")
    trainer = Trainer(model=model, args=args, train_dataset=data, processing_class=tok,
                      data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
    trainer.train()
"""


def test_lora_adapter_saves_and_reloads_with_load_adapter(project: pytest.Pytester) -> None:
    project.makepyfile(lm=LM)
    result, items = run_stages(project, LORA_LM, SAVE_STAGES)
    save = check_passes(result, items, SAVE_STAGES)
    (note,) = save["notes"]
    # Only the adapter is written, not the base model's weights.
    files = saved_files(note)
    assert {"adapter_model.safetensors", "adapter_config.json"} <= files and "model.safetensors" not in files, note
    assert note.endswith("the adapter reloads (PeftModel.load_adapter) to the same outputs"), note


def test_a_lora_checkpoint_the_trainer_saves_without_its_tokenizer_passes_save(project: pytest.Pytester) -> None:
    """A trainer that writes the adapter alone (as ms-swift's does): its tokenizer is the base model's."""
    project.makepyfile(lm=LM)
    adapter_only = LORA_LM.replace("trainer = Trainer(", "trainer = AdapterOnly(").replace(
        "tok = lm.tokenizer()",
        "class AdapterOnly(Trainer):\n        def _save(self, output_dir=None, state_dict=None):\n"
        "            self.model.save_pretrained(output_dir)\n\n\n    tok = lm.tokenizer()",
    )
    assert adapter_only.count("AdapterOnly") == 2
    result, items = run_stages(project, adapter_only, SAVE_STAGES)
    save = check_passes(result, items, SAVE_STAGES)
    (note,) = save["notes"]
    assert not saved_files(note) & {"tokenizer.json", "tokenizer_config.json"}, note
    assert "the adapter reloads (PeftModel.load_adapter) to the same outputs; the trainer saves no " in note, note
    assert note.endswith("with it (reload that from where the script loads it)"), note


def test_config_value_json_cannot_store_fails_save(project: pytest.Pytester) -> None:
    script = classifier_script('model.config.class_names = {"neg", "neutral", "pos"}')
    result, items = run_stages(project, script, SAVE_STAGES)
    save = check_fails(result, items, SAVE_STAGES)
    diagnosis, fix = save["diagnosis"], save["fix"]
    assert diagnosis.startswith("the model's config holds a value JSON cannot store"), diagnosis
    assert "Object of type set is not JSON serializable" in diagnosis and "save_pretrained fails" in diagnosis, (
        diagnosis
    )
    assert fix.startswith("keep config attributes to plain values"), fix


def test_tokenizer_setting_json_cannot_store_fails_save_naming_the_tokenizer(project: pytest.Pytester) -> None:
    script = classifier_script('tok.init_kwargs["special_words"] = {"cat", "dog"}')
    result, items = run_stages(project, script, SAVE_STAGES)
    save = check_fails(result, items, SAVE_STAGES)
    diagnosis, fix = save["diagnosis"], save["fix"]
    # The class is PreTrainedTokenizerFast in transformers 4, TokenizersBackend in 5.
    assert re.match(r"the \w+ saved beside the model holds a setting JSON cannot store", diagnosis), diagnosis
    assert "config" not in diagnosis, diagnosis
    assert "tokenizer's or processor's settings" in fix, fix


# ---------------------------------------------------------------------------------------------------------------
# precision

#: The feed-forward's first layer scaled so that its outputs reach 2.7e5, beyond fp16's 65504 (measured above).
SCALED = "model.bert.encoder.layer[0].intermediate.dense.weight.data.mul_(1e6)"
OVERFLOWING = "bert.encoder.layer.0.intermediate.dense"


def test_fp16_trainable_weights_under_fp16_fail_precision(project: pytest.Pytester) -> None:
    result, items = run_stages(project, classifier_script("model = model.half()", ", fp16=True"), PRECISION_STAGES)
    precision = check_fails(result, items, PRECISION_STAGES)
    turned_off(result, "fp16")
    diagnosis, fix = precision["diagnosis"], precision["fix"]
    assert diagnosis.startswith("25 trainable weights are fp16 under fp16=True mixed precision"), diagnosis
    assert "Attempting to unscale FP16 gradients" in diagnosis and "NaN" in diagnosis, diagnosis
    assert fix.startswith("keep trainable weights in fp32"), fix
    assert "cast the trainable ones (adapters, heads) to float32" in fix, fix


def test_layer_beyond_the_fp16_range_fails_precision_under_fp16(project: pytest.Pytester) -> None:
    result, items = run_stages(project, classifier_script(SCALED, ", fp16=True"), PRECISION_STAGES)
    precision = check_fails(result, items, PRECISION_STAGES)
    turned_off(result, "fp16")
    diagnosis, fix = precision["diagnosis"], precision["fix"]
    assert diagnosis.startswith("under fp16=True, 1 layers produce values beyond the fp16 range (65504)"), diagnosis
    assert f"first {OVERFLOWING} (" in diagnosis, diagnosis
    peak = float(diagnosis.split(f"first {OVERFLOWING} (")[1].split(")")[0])
    assert 65504 < peak < 1e7, diagnosis
    assert fix.startswith("train in bf16 (bf16=True)") and "keep the overflowing layers in fp32" in fix, fix


def test_layer_beyond_the_fp16_range_passes_precision_under_bf16(project: pytest.Pytester) -> None:
    # bf16 has fp32's range: the same model trains (its autocast loss is finite), and no fp16 range is checked.
    result, items = run_stages(project, classifier_script(SCALED, ", bf16=True"), PRECISION_STAGES)
    precision = check_passes(result, items, PRECISION_STAGES)
    turned_off(result, "bf16")
    assert "mixed precision: bf16; trainable weights: 25 in float32" in precision["notes"], precision["notes"]
    assert "largest_half_activation" not in precision["figures"], precision["figures"]
    assert precision["figures"]["autocast_loss"] == pytest.approx(math.log(3), abs=0.1), precision["figures"]
    assert "65504" not in result.stdout.str()


def test_unscaled_model_passes_precision_under_fp16(project: pytest.Pytester) -> None:
    result, items = run_stages(project, classifier_script(flags=", fp16=True"), PRECISION_STAGES)
    precision = check_passes(result, items, PRECISION_STAGES)
    turned_off(result, "fp16")
    assert "mixed precision: fp16; trainable weights: 25 in float32" in precision["notes"], precision["notes"]
    # The range was checked (the figure is only set by that check) and is far within fp16's.
    assert 0 < precision["figures"]["largest_half_activation"] < 100, precision["figures"]
    assert precision["figures"]["autocast_loss"] == pytest.approx(math.log(3), abs=0.1), precision["figures"]


def test_bf16_with_fp32_weights_passes_precision(project: pytest.Pytester) -> None:
    result, items = run_stages(project, classifier_script(flags=", bf16=True"), PRECISION_STAGES)
    precision = check_passes(result, items, PRECISION_STAGES)
    turned_off(result, "bf16")
    assert "mixed precision: bf16; trainable weights: 25 in float32" in precision["notes"], precision["notes"]
    assert precision["figures"]["autocast_loss"] == pytest.approx(math.log(3), abs=0.1), precision["figures"]
    assert "largest_half_activation" not in precision["figures"], precision["figures"]


def test_fp32_script_passes_precision(project: pytest.Pytester) -> None:
    result, items = run_stages(project, classifier_script(), PRECISION_STAGES)
    precision = check_passes(result, items, PRECISION_STAGES)
    assert precision["notes"] == ["mixed precision: none (fp32); trainable weights: 25 in float32"], precision["notes"]
    # Nothing runs under autocast in fp32, and the plugin turned no flag off.
    assert precision["figures"] == {}, precision["figures"]
    assert not any(line.startswith("precision: the script asks for") for line in result.outlines)


def test_a_finding_in_backward_does_not_hide_a_checkpoint_that_cannot_be_written(project: pytest.Pytester) -> None:
    # A pooler the forward never uses (no gradient: DDP's unused-parameter failure, where the script tells DDP not to
    # look for unused parameters) and a head sharing the embedding without declaring it: one run names both, since
    # one process still trains past the first.
    script = (
        OWN_MASKED_LM.format(tie=SHARED_HEAD)
        .replace("add_pooling_layer=False", "add_pooling_layer=True")
        .replace('report_to="none")', 'report_to="none", ddp_find_unused_parameters=False)', 1)
    )
    assert "ddp_find_unused_parameters=False" in script
    result, items = run_stages(project, script, SAVE_STAGES)
    assert outcomes(result) == {
        "dataset[cpu]": "PASSED",
        "collate[cpu]": "PASSED",
        "forward[cpu]": "PASSED",
        "backward[cpu]": "FAILED",
        "step[cpu]": "PASSED",
        "save[cpu]": "FAILED",
    }
    assert items["backward"]["diagnosis"].startswith("2 of "), items["backward"]
    assert "encoder.pooler.dense.weight" in items["backward"]["diagnosis"], items["backward"]
    assert items["save"]["diagnosis"].startswith("safetensors refuses to save weights that share memory"), items["save"]
