"""Silent bugs: pipelines that train without an error but learn the wrong thing, found as non-blocking findings.

Each broken form fails at its stage with the cause named, while its correct twin passes. Measured beside their
correct twins (transformers 5.24, torch 2.13, CPU):
- LoRA sequence classification without task_type="SEQ_CLS" (or modules_to_save): the new classifier stays frozen at
  its random weights; eval loss 1.32 against 0.19 with the head trained.
- a compute_loss of one's own that ignores num_items_in_batch, with gradient_accumulation_steps=4: the logged loss and
  the gradients are 4x those of the same samples at accumulation 1 (grad_norm 1.72 against 0.43 in a real train()).
  transformers 5.24's own BertForSequenceClassification does the same under the plain Trainer (its forward takes
  **kwargs, its loss is a plain mean): logged loss 4.39 against 1.10; model.accepts_loss_kwargs = False fixes it.
  transformers 4.57's BERT takes no **kwargs, so the Trainer divides by the accumulation steps there: no finding.
- a masked LM with DataCollatorForLanguageModeling(mlm=False): the labels are the inputs; the model learns to copy.
"""

from __future__ import annotations

import peft  # noqa: F401
import pytest
import transformers
from peft import LoraConfig, get_peft_model  # noqa: F401
from pipeline_runs import KIND_SCRIPTS, failures, outcomes, write

# The libraries above are imported here, before pytester's in-process runs, for the reason conftest gives.

TRANSFORMERS_5 = int(transformers.__version__.split(".")[0]) >= 5


def run_scripts(pytester: pytest.Pytester, scripts: list[str], stages: str) -> pytest.RunResult:
    """All `scripts` in one run, on the CPU, restricted to `stages`."""
    modules = [f"--trainer-module={script}" for script in scripts]
    return pytester.runpytest(*modules, "--trainer-devices=cpu", f"--trainer-stages={stages}", "-v", "-rs")


def passed(result: pytest.RunResult, script: str) -> None:
    statuses = outcomes(result, script)
    assert statuses and set(statuses.values()) == {"PASSED"}, (script, statuses, result.stdout.str()[-5000:])


def failed_only(result: pytest.RunResult, script: str, stage: str) -> None:
    assert failures(result, script) == [f"{stage}[cpu]"], (
        script,
        outcomes(result, script),
        result.stdout.str()[-5000:],
    )


# ---------------------------------------------------------------------------------------------------------------
# 1. A newly initialised head left frozen under PEFT.

LORA_CLASSIFIER = """
    import tiny
    from peft import LoraConfig, get_peft_model
    from transformers import {auto}, Trainer, TrainingArguments

    tok = tiny.tokenizer()
    data = {data}
    {load}
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["query", "value"]{lora}))
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, learning_rate=1e-3, report_to="none")
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data, processing_class=tok)
    trainer.train()
"""

SEQUENCE_DATA = "tiny.tokenized(tiny.text_dataset(), tok)"
TOKEN_DATA = """tiny.text_dataset().map(lambda batch: {**tok(batch["text"], truncation=True), "labels": [
        [-100 if word is None else (i + word) % 4 for word in tok(text).word_ids()]
        for i, text in enumerate(batch["text"])]}, batched=True, remove_columns=["text", "label"])"""
FROM_CONFIG = "model = tiny.classifier()"
#: A checkpoint of the backbone alone, as a pretrained encoder is published: the classifier is new when loaded.
FROM_BACKBONE = (
    'from transformers import BertModel\n    BertModel(tiny.config()).save_pretrained("backbone")\n'
    '    model = BertForSequenceClassification.from_pretrained("backbone", num_labels=3)'
)
#: A checkpoint that has the head (a reward model or classifier trained before, say): nothing is new.
FROM_CLASSIFIER = (
    'tiny.classifier().save_pretrained("trained")\n    model = BertForSequenceClassification.from_pretrained("trained")'
)


def lora_classifier(
    load: str = FROM_CONFIG, lora: str = "", data: str = SEQUENCE_DATA, auto: str = "BertForSequenceClassification"
) -> str:
    return LORA_CLASSIFIER.format(load=load, lora=lora, data=data, auto=auto)


def test_frozen_new_heads_fail_backward_and_their_correct_twins_pass(project: pytest.Pytester) -> None:
    write(project, "config_head.py", lora_classifier())
    write(project, "checkpoint_head.py", lora_classifier(load=FROM_BACKBONE))
    write(project, "seq_cls.py", lora_classifier(lora=', task_type="SEQ_CLS"'))
    write(project, "saved_head.py", lora_classifier(lora=', modules_to_save=["classifier"]'))
    write(project, "trained_head.py", lora_classifier(load=FROM_CLASSIFIER))
    write(
        project,
        "token_cls.py",
        lora_classifier(
            load="model = BertForTokenClassification(tiny.config(num_labels=4))",
            lora=', task_type="TOKEN_CLS"',
            data=TOKEN_DATA,
            auto="BertForTokenClassification, DataCollatorForTokenClassification",
        ).replace(
            "processing_class=tok)",
            "processing_class=tok,\n                      data_collator=DataCollatorForTokenClassification(tok))",
        ),
    )
    scripts = ["config_head.py", "checkpoint_head.py", "seq_cls.py", "saved_head.py", "trained_head.py", "token_cls.py"]
    result = run_scripts(project, scripts, "collate,backward,step,save")
    for script in scripts[2:]:
        passed(result, script)
    for script in scripts[:2]:
        failed_only(result, script, "backward")
        # A finding blocks nothing: one process still trains, so the later stages run and pass.
        assert outcomes(result, script)["step[cpu]"] == "PASSED"
        assert outcomes(result, script)["save[cpu]"] == "PASSED"
    result.stdout.fnmatch_lines(
        [
            "*backward[[]cpu[]] failed: the head classifier (51 parameters) is newly initialised (the model was built "
            "from a config, so its weights are random) but frozen (PEFT trains its adapters only)*",
            '*fix: LoraConfig(..., task_type="SEQ_CLS"), which trains and saves the head, or LoraConfig(..., '
            'modules_to_save=[[]"classifier"[]])*',
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*backward[[]cpu[]] failed: the head classifier * is newly initialised (its weights are not in the "
            "checkpoint 'backbone') but frozen*",
        ]
    )


# ---------------------------------------------------------------------------------------------------------------
# 2. Gradient accumulation that changes the loss and gradients of the same samples.

LM_SCRIPT = """
    import tiny
    from transformers import (DataCollatorForLanguageModeling, GPT2Config, GPT2LMHeadModel, Trainer,
                              TrainingArguments)
{trainer}

    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(), tok).remove_columns(["label"])
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tiny.VOCAB), n_embd=16, n_layer=1, n_head=2,
                                       n_positions=64, pad_token_id=0))
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, gradient_accumulation_steps=4,
                             report_to="none")
    trainer = {cls}(model=model, args=args, train_dataset=data, eval_dataset=data, processing_class=tok,
                    data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
    trainer.train()
"""

#: The bug: each micro-batch's mean loss, whatever the Trainer says it counted.
IGNORES_COUNT = """
    class MeanTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(**inputs)
            return (outputs.loss, outputs) if return_outputs else outputs.loss
"""

#: Its correct twin: the count passed on to the model, whose loss then sums and divides by it.
PASSES_COUNT = """
    class CountingTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(**inputs, num_items_in_batch=num_items_in_batch)
            return (outputs.loss, outputs) if return_outputs else outputs.loss
"""


@pytest.mark.parametrize(("steps", "rows"), [(4, 8), (2, 4)])
def test_accumulation_that_scales_the_gradients_fails_backward_and_correct_forms_pass(
    project: pytest.Pytester, steps: int, rows: int
) -> None:
    # At 2 steps the check takes 2 rows to each micro-batch, 4 of the batch's 8.
    script = LM_SCRIPT.replace("gradient_accumulation_steps=4", f"gradient_accumulation_steps={steps}")
    write(project, "ignores_count.py", script.format(trainer=IGNORES_COUNT, cls="MeanTrainer"))
    write(project, "passes_count.py", script.format(trainer=PASSES_COUNT, cls="CountingTrainer"))
    write(project, "plain.py", script.format(trainer="", cls="Trainer"))
    scripts = ["ignores_count.py", "passes_count.py", "plain.py"]
    result = run_scripts(project, scripts, "backward,step")
    passed(result, "passes_count.py")
    passed(result, "plain.py")
    failed_only(result, "ignores_count.py", "backward")
    assert outcomes(result, "ignores_count.py")["step[cpu]"] == "PASSED"
    result.stdout.fnmatch_lines(
        [
            f"*backward[[]cpu[]] failed: with gradient_accumulation_steps={steps}, the {rows} rows of one batch taken as "
            f"{steps} accumulated micro-batches get gradients {steps}.*x (and a logged loss {steps}.*x) those of the same "
            "rows at accumulation 1: "
            "MeanTrainer.compute_loss returns each micro-batch's mean loss and ignores num_items_in_batch*",
            "*fix: in MeanTrainer.compute_loss, pass num_items_in_batch on to the model*",
        ]
    )


def test_a_classifier_whose_loss_ignores_the_count_under_the_plain_trainer(project: pytest.Pytester) -> None:
    # transformers 5's BERT takes **kwargs but averages its loss: 4x under the plain Trainer (measured above).
    script = KIND_SCRIPTS["classification"].replace(
        "per_device_train_batch_size=8,", "per_device_train_batch_size=8, gradient_accumulation_steps=4,"
    )
    fixed = script.replace(
        "trainer = Trainer(model=tiny.classifier()",
        "model = tiny.classifier()\n    model.accepts_loss_kwargs = False\n    trainer = Trainer(model=model",
    )
    assert "gradient_accumulation_steps=4" in script and "accepts_loss_kwargs" in fixed
    write(project, "classifier.py", script)
    write(project, "fixed.py", fixed)
    result = run_scripts(project, ["classifier.py", "fixed.py"], "backward")
    passed(result, "fixed.py")
    if not TRANSFORMERS_5:
        passed(result, "classifier.py")
        return
    failed_only(result, "classifier.py", "backward")
    result.stdout.fnmatch_lines(
        [
            "*gradients 4.0x (and a logged loss 4.0x) those of the same rows at accumulation 1: "
            "BertForSequenceClassification's loss is a mean over each micro-batch that ignores num_items_in_batch*",
            "*fix: set model.accepts_loss_kwargs = False before building the Trainer*",
        ]
    )


# ---------------------------------------------------------------------------------------------------------------
# 3. A masked language model trained on unmasked labels.


def test_masked_lm_without_masking_fails_collate_and_with_masking_passes(project: pytest.Pytester) -> None:
    masked = KIND_SCRIPTS["masked-lm"]
    unmasked = masked.replace(
        "DataCollatorForLanguageModeling(tok, mlm_probability=0.3)", "DataCollatorForLanguageModeling(tok, mlm=False)"
    )
    assert unmasked != masked
    write(project, "masked.py", masked)
    write(project, "unmasked.py", unmasked)
    result = run_scripts(project, ["masked.py", "unmasked.py"], "collate,forward")
    passed(result, "masked.py")
    failed_only(result, "unmasked.py", "collate")
    assert outcomes(result, "unmasked.py")["forward[cpu]"] == "PASSED"
    result.stdout.fnmatch_lines(
        [
            "*collate[[]cpu[]] failed: a masked language model (BertForMaskedLM) is trained on unmasked labels: "
            "DataCollatorForLanguageModeling(mlm=False) copies input_ids into labels*",
            "*fix: mask the inputs: data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=True)*",
        ]
    )


# ---------------------------------------------------------------------------------------------------------------
# Several findings of one stage are reported together; a blocking failure of the stage comes first.


def test_findings_of_one_stage_are_reported_together(project: pytest.Pytester) -> None:
    script = (
        lora_classifier()
        .replace('report_to="none")', 'report_to="none", gradient_accumulation_steps=2)')
        .replace(
            "model = get_peft_model(",
            "import torch\n    model.unused = torch.nn.Linear(4, 4)\n    model = get_peft_model(",
        )
    )
    script = script.replace(
        'target_modules=["query", "value"]', 'target_modules=["query", "value"], modules_to_save=["unused"]'
    )
    assert "unused" in script and "gradient_accumulation_steps=2" in script
    write(project, "two.py", script)
    result = run_scripts(project, ["two.py"], "backward")
    failed_only(result, "two.py", "backward")
    result.stdout.fnmatch_lines(
        [
            "*backward[[]cpu[]] failed: 2 of * trainable parameters get no gradient from the loss: *unused*",
            "*also: the head classifier * is newly initialised*",
        ]
    )
