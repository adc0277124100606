"""The loud errors of the Trainer, TRL and PEFT, each shown with its cause and a fix (pytest_trainer/explanations/).

Every row of the table has a broken script here (or in the test named in the README's table) that fails at its
stage with the cause on the item's first failure line. Several scripts share one pytester run, restricted to the
stage where the error surfaces, so that the explanation (not an earlier check of the plugin) is what shows it.
"""

from __future__ import annotations

import pytest
from pipeline_runs import failures, write
from task_scripts import LM

CLASSIFIER = """
    import tiny
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    tok = tiny.tokenizer()
    raw = Dataset.from_dict({{"text": tiny.sentences(48), "label": {labels}}})
    data = tiny.tokenized(raw, tok){after}
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
    trainer = Trainer(model={model}, args=args, train_dataset=data, processing_class=tok)
    trainer.train()
"""


def classifier(labels: str = "[i % 3 for i in range(48)]", model: str = "tiny.classifier()", after: str = "") -> str:
    return CLASSIFIER.format(labels=labels, model=model, after=after)


T5_TARGET_NOT_LABELS = """
    import tiny
    from datasets import Dataset
    from transformers import (DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments, T5Config,
                              T5ForConditionalGeneration)

    tok = tiny.tokenizer()
    sources = tiny.sentences(32, seed=2, shortest=3, longest=10)
    raw = Dataset.from_dict({"source": sources, "target": [" ".join(s.split()[:2]) for s in sources]})


    def preprocess(batch):
        encoded = tok(batch["source"], truncation=True, max_length=32)
        encoded["target_ids"] = tok(text_target=batch["target"], truncation=True, max_length=8)["input_ids"]
        return encoded


    data = raw.map(preprocess, batched=True, remove_columns=["source", "target"])
    config = T5Config(vocab_size=len(tiny.VOCAB), d_model=16, d_ff=32, d_kv=8, num_layers=1, num_decoder_layers=1,
                      num_heads=2, pad_token_id=tok.pad_token_id, eos_token_id=tok.sep_token_id,
                      decoder_start_token_id=tok.pad_token_id)
    model = T5ForConditionalGeneration(config)
    args = Seq2SeqTrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=data, processing_class=tok,
                             data_collator=DataCollatorForSeq2Seq(tok, model=model))
    trainer.train()
"""

GPT2_CLASSIFIER_WITHOUT_PAD_ID = classifier(
    model="GPT2ForSequenceClassification(GPT2Config(vocab_size=len(tiny.VOCAB), n_embd=16, n_layer=1, n_head=2, "
    "n_positions=64, num_labels=3))"
).replace(
    "from transformers import Trainer", "from transformers import GPT2Config, GPT2ForSequenceClassification, Trainer"
)

CUSTOM_MODEL = """
    import tiny
    import torch
    from transformers import Trainer, TrainingArguments


    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(len(tiny.VOCAB), 8)
            self.head = torch.nn.Linear(8, 3)

        def forward(self, input_ids, attention_mask=None{labels}):
            logits = self.head(self.embed(input_ids).mean(1))
            return {{"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}}


    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(), tok){after}
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none"{args})
    trainer = Trainer(model=Classifier(), args=args, train_dataset=data, processing_class=tok)
    trainer.train()
"""

#: Scripts whose error surfaces in the forward stage, and the first failure line each must show.
FORWARD = {
    "out_of_bounds.py": (
        classifier(model="tiny.classifier(num_labels=2)"),
        "forward[[]cpu[]] failed: labels range 0..2 (3 classes) but the model has 2 outputs*",
    ),
    "vocabulary.py": (
        classifier(model="tiny.classifier(vocab_size=12)"),
        "forward[[]cpu[]] failed: token id * but the model's input embedding has 12 rows*",
    ),
    "positions.py": (
        classifier(model="tiny.classifier(max_position_embeddings=6)"),
        "forward[[]cpu[]] failed: a sequence of * tokens * but the model has only 6 positions*",
    ),
    "float_labels.py": (
        classifier(labels="[float(i % 3) for i in range(48)]"),
        "forward[[]cpu[]] failed: the labels are floats, one per example (*): for a 3-class head "
        "transformers then takes float labels for multi-label rows*",
    ),
    "float_class_ids.py": (
        classifier(
            labels="[float(i % 3) for i in range(48)]",
            model="tiny.classifier(problem_type='single_label_classification')",
        ),
        "forward[[]cpu[]] failed: the labels are floats (*) but single-label classification's "
        "cross-entropy takes integer class ids",
    ),
    "one_hot.py": (
        classifier(labels="[[int(i % 3 == c) for c in range(3)] for i in range(48)]"),
        "forward[[]cpu[]] failed: the labels are rows of 3 values per example (labels [[]8, 3[]]) but "
        "BertForSequenceClassification predicts one class per example*",
    ),
    "target_column.py": (
        classifier(after='.rename_column("label", "target")'),
        "forward[[]cpu[]] failed: the batch has no labels: the Trainer dropped the column 'target' "
        "(remove_unused_columns) because BertForSequenceClassification.forward takes no parameter*",
    ),
    "headless.py": (
        classifier(model="BertModel(tiny.config())").replace(
            "from transformers import Trainer", "from transformers import BertModel, Trainer"
        ),
        # transformers 5 passes the labels into **kwargs, 4.57 rejects them: both say the model has no loss
        "forward[[]cpu[]] failed: BertModel*no*labels*",
    ),
    "t5_target.py": (
        T5_TARGET_NOT_LABELS,
        "forward[[]cpu[]] failed: the decoder got no input: the batch has no 'labels', because the "
        "Trainer dropped the target column 'target_ids'*",
    ),
    "gpt2_no_pad_id.py": (
        GPT2_CLASSIFIER_WITHOUT_PAD_ID,
        "forward[[]cpu[]] failed: GPT2ForSequenceClassification classifies from each row's last "
        "real token, which it finds by the pad id, but model.config.pad_token_id is None",
    ),
    "extra_column.py": (
        CUSTOM_MODEL.format(
            labels=", labels=None", after='.add_column("weight", [1.0] * 48)', args=", remove_unused_columns=False"
        ),
        # 4.57's tokenizer also returns token_type_ids, which it meets first
        "forward[[]cpu[]] failed: the batch has '*', which Classifier.forward does not take "
        "(the script sets remove_unused_columns=False*",
    ),
    "no_labels_parameter.py": (
        CUSTOM_MODEL.format(labels="", after="", args=""),
        "forward[[]cpu[]] failed: Classifier.forward takes no 'labels'*",
    ),
}

FIXES = {
    "float_labels.py": "*fix: for one class per example make the label column integers: "
    "dataset = dataset.cast_column('label', Value('int64'))*",
    "target_column.py": "*fix: name the target column 'labels': dataset = dataset.rename_column('target', 'labels')",
    "t5_target.py": "*fix: name the target column 'labels' when tokenizing*rename_column('target_ids', 'labels')",
    "gpt2_no_pad_id.py": "*fix: set model.config.pad_token_id = tokenizer.pad_token_id (0) before building the Trainer",
}


def run_group(project: pytest.Pytester, scripts: dict[str, tuple[str, str]], stage: str) -> pytest.RunResult:
    for name, (source, _) in scripts.items():
        write(project, name, source)
    modules = [f"--trainer-module={name}" for name in scripts]
    return project.runpytest(*modules, "--trainer-devices=cpu", f"--trainer-stages={stage}", "-v")


def test_errors_in_the_forward_are_shown_with_their_cause(project: pytest.Pytester) -> None:
    result = run_group(project, FORWARD, "forward")
    output = result.stdout.str()
    for name, (_, line) in FORWARD.items():
        assert failures(result, name) == ["forward[cpu]"], (name, output[-6000:])
        result.stdout.fnmatch_lines([line])
    for line in FIXES.values():
        result.stdout.fnmatch_lines([line])
    assert "not yet explained by pytest-trainer" not in output, output[-6000:]


TOKEN_LABELS = """
    import tiny
    from transformers import BertForTokenClassification, DataCollatorWithPadding, Trainer, TrainingArguments

    tok = tiny.tokenizer()


    def tag(batch):
        encoded = tok(batch["text"], truncation=True)
        encoded["labels"] = [[-100 if word is None else (i + word) % 4 for word in encoded.word_ids(i)]
                             for i in range(len(batch["text"]))]
        return encoded


    data = tiny.text_dataset().map(tag, batched=True, remove_columns=["text", "label"])
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
    trainer = Trainer(model=BertForTokenClassification(tiny.config(num_labels=4)), args=args, train_dataset=data,
                      processing_class=tok, data_collator=DataCollatorWithPadding(tok))
    trainer.train()
"""

ON_THE_FLY = """
    import tiny
    from transformers import Trainer, TrainingArguments

    tok = tiny.tokenizer()
    raw = tiny.text_dataset()
    raw.set_transform(lambda batch: {**tok(batch["text"], truncation=True), "labels": batch["label"]})
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
    trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=raw, processing_class=tok)
    trainer.train()
"""

#: A model of one's own whose forward takes its inputs as **inputs: the Trainer keeps no column it does not name.
KWARGS_FORWARD = CUSTOM_MODEL.format(labels="", after="", args="").replace(
    "def forward(self, input_ids, attention_mask=None):\n            logits = self.head(self.embed(input_ids).mean(1))",
    "def forward(self, **inputs):\n            logits = self.head(self.embed(inputs['input_ids']).mean(1))\n"
    "            labels = inputs['labels']",
)

#: Scripts whose error surfaces while the data is read or collated.
DATA = {
    "kwargs_forward.py": (
        KWARGS_FORWARD,
        "collate[[]cpu[]] failed: Classifier.forward(**inputs) names no input: the Trainer keeps only "
        "the columns the forward's signature names (and the labels), so it dropped 'input_ids', "
        "*without 'labels' in the signature the evaluation also computes no loss",
    ),
    "token_labels.py": (
        TOKEN_LABELS,
        "collate[[]cpu[]] failed: the 'labels' of the first rows have different lengths (*): "
        "DataCollatorWithPadding pads the tokenizer's inputs but not labels*",
    ),
    "string_labels.py": (
        classifier(labels='[["bird", "cat", "dog"][i % 3] for i in range(48)]'),
        "collate[[]cpu[]] failed: the 'label' column holds strings ('bird', 'cat', 'dog', ...)*",
    ),
    "on_the_fly.py": (
        ON_THE_FLY,
        "collate[[]cpu[]] failed: the Trainer dropped the column 'text' before your transform or "
        "collator reads it (remove_unused_columns: BertForSequenceClassification.forward takes no*",
    ),
    "raw_text.py": (
        classifier(after="").replace("tiny.tokenized(raw, tok)", "raw"),
        "collate[[]cpu[]] failed: the training dataset has text columns 'text' but no 'input_ids'*",
    ),
}


def test_errors_of_the_data_are_shown_with_their_cause(project: pytest.Pytester) -> None:
    result = run_group(project, DATA, "collate")
    output = result.stdout.str()
    for name, (_, line) in DATA.items():
        assert failures(result, name) == ["collate[cpu]"], (name, output[-6000:])
        result.stdout.fnmatch_lines([line])
    result.stdout.fnmatch_lines(
        [
            "*fix: use data_collator=DataCollatorForTokenClassification(tokenizer), which pads the labels with -100*",
            "*fix: map the names to ids before training: dataset = dataset.class_encode_column('label')*",
            "*fix: set remove_unused_columns=False in TrainingArguments*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*fix: name the inputs: def forward(self, input_ids, *attention_mask, labels=None), or keep every column with "
            "TrainingArguments(remove_unused_columns=False, label_names=[[]'labels'[]])"
        ]
    )
    # A wrong fix is worse than none: the fix never offers the collator the script already uses.
    assert "fix: use data_collator=DataCollatorWithPadding" not in output
    assert "not yet explained by pytest-trainer" not in output, output[-6000:]


def test_a_forward_of_inputs_kept_whole_passes(project: pytest.Pytester) -> None:
    """The fix of a forward(**inputs): every column kept, the labels named."""
    script = KWARGS_FORWARD.replace(
        'report_to="none"', 'report_to="none", remove_unused_columns=False, label_names=["labels"]'
    ).replace("train_dataset=data,", "train_dataset=data, eval_dataset=data,")
    assert script != KWARGS_FORWARD
    write(project, "train.py", script)
    result = project.runpytest(
        "--trainer-module=train.py", "--trainer-devices=cpu", "--trainer-stages=collate,forward,backward,eval", "-v"
    )
    assert failures(result) == [], result.stdout.str()[-3000:]
    result.assert_outcomes(passed=5)


GRPO = """
    import lm
    import tiny
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    data = Dataset.from_dict({"prompt": tiny.sentences(16, seed=5)})
    args = GRPOConfig(output_dir="out", per_device_train_batch_size=6, num_generations=8, bf16=False, report_to=[])
    trainer = GRPOTrainer(model=lm.model(), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=args, train_dataset=data, processing_class=lm.tokenizer())
    trainer.train()
"""

SAME_REFERENCE = """
    import lm
    import tiny
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    prompts = tiny.sentences(16, seed=3, shortest=2, longest=6)
    data = Dataset.from_dict({"prompt": prompts, "chosen": prompts, "rejected": prompts})
    model = lm.model()
    args = DPOConfig(output_dir="out", bf16=False, per_device_train_batch_size=4, max_length=32, report_to=[])
    trainer = DPOTrainer(model, ref_model=model, args=args, train_dataset=data, processing_class=lm.tokenizer())
    trainer.train()
"""

CAUSAL_LM = """
    import lm
    import tiny
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    tok = lm.tokenizer()
    data = tiny.text_dataset().map(lambda batch: tok(batch["text"]), batched=True, remove_columns=["text", "label"])
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none"{args})
    trainer = Trainer(model=lm.model(), args=args, train_dataset=data, eval_dataset=data, processing_class=tok,
                      data_collator=DataCollatorForLanguageModeling(tok{mlm}))
    trainer.train()
"""

#: Scripts that fail while they build their Trainer: the failure is shown on the script's load item.
SCRIPT = {
    "grpo.py": (
        GRPO,
        "load[[]cpu[]] failed: grpo.py: GRPO samples num_generations=8 completions of each prompt "
        "and scores them as a group*but it holds 6 completions*",
    ),
    "same_reference.py": (
        SAME_REFERENCE,
        "load[[]cpu[]] failed: same_reference.py: the same model object is passed as the policy and as ref_model*",
    ),
    "mlm.py": (
        CAUSAL_LM.format(args="", mlm=""),
        "load[[]cpu[]] failed: mlm.py: DataCollatorForLanguageModeling masks tokens by default (mlm=True*",
    ),
    "best_strategy.py": (
        CAUSAL_LM.format(
            args=', load_best_model_at_end=True, eval_strategy="steps", save_strategy="epoch"', mlm=", mlm=False"
        ),
        "load[[]cpu[]] failed: best_strategy.py: load_best_model_at_end keeps the checkpoint of "
        "the best evaluation, but the script evaluates by 'steps' and saves by 'epoch'*",
    ),
    "best_steps.py": (
        CAUSAL_LM.format(
            args=', load_best_model_at_end=True, eval_strategy="steps", '
            'save_strategy="steps", eval_steps=30, save_steps=50',
            mlm=", mlm=False",
        ),
        "load[[]cpu[]] failed: best_steps.py: load_best_model_at_end keeps the checkpoint of the best "
        "evaluation, but checkpoints every 50 steps miss most evaluations every 30 steps",
    ),
}


def test_errors_while_the_script_builds_its_trainer_are_shown_with_their_cause(project: pytest.Pytester) -> None:
    project.makepyfile(lm=LM)
    result = run_group(project, SCRIPT, "dataset")
    output = result.stdout.str()
    for name, (_, line) in SCRIPT.items():
        assert failures(result, name) == ["load[cpu]"], (name, output[-6000:])
        result.stdout.fnmatch_lines([line])
    result.stdout.fnmatch_lines(
        [
            "*fix: make the generation batch a multiple of 8 (e.g. per_device_train_batch_size=8 or "
            "generation_batch_size=24), or set num_generations to a divisor of 6 (2, 3, 6)",
            "*fix: pass ref_model=copy.deepcopy(model)*",
            "*fix: for a causal LM pass DataCollatorForLanguageModeling(tokenizer, mlm=False)*",
            "*fix: save when you evaluate: save_strategy='steps'*",
            "*fix: make save_steps a multiple of eval_steps: save_steps=60 (or eval_steps=50)*",
        ]
    )
