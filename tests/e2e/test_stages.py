"""Each stage catches its own kind of bug, names the cause in the user's terms, and gives the fix."""

from __future__ import annotations

import json
import textwrap

import pytest
from pipeline_runs import GOOD_SCRIPT, failures, run_script, write

ROWS_SCRIPT = """
    import tiny
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    ids = [[2] + [5 + (i + j) % 10 for j in range(3 + i % 7)] + [3] for i in range(200)]
    {edit}
    data = Dataset.from_dict({{"input_ids": ids, "label": [i % 3 for i in range(200)]}})
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8)
    trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=data, processing_class=tiny.tokenizer())
    trainer.train()
"""


def test_token_id_beyond_the_embedding_deep_in_the_data(project: pytest.Pytester) -> None:
    write(project, "train.py", ROWS_SCRIPT.format(edit="ids[163][2] = 99"))
    result = run_script(project)
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: token id 99 in row 163 of the training dataset but the model's input embedding "
            "has 24 rows*",
            "*fix: *model.resize_token_embeddings(len(tokenizer))*",
        ]
    )


def test_sequence_longer_than_the_positions_deep_in_the_data(project: pytest.Pytester) -> None:
    write(project, "train.py", ROWS_SCRIPT.format(edit="ids[163] = [2] + [6] * 98 + [3]"))
    result = run_script(project)
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: a sequence of 100 tokens in row 163 of the training dataset but the model has "
            "only 64 positions*",
            "*fix: tokenize with truncation=True*",
        ]
    )


def test_text_column_kept_by_remove_unused_columns_false(project: pytest.Pytester) -> None:
    script = GOOD_SCRIPT.replace('report_to="none"', 'report_to="none", remove_unused_columns=False')
    script = script.replace(
        "tiny.tokenized(tiny.text_dataset(), tok)", "tiny.text_dataset().map(lambda b: tok(b['text']), batched=True)"
    )
    write(project, "train.py", script)
    result = run_script(project)
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "*text column(s) 'text' of the training dataset reach the collator*",
            "*fix: drop them*remove_unused_columns=True*",
        ]
    )


def test_missing_labels(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        GOOD_SCRIPT.replace("data = ", "data = (").replace("tok)\n", "tok)).remove_columns(['label'])\n", 1),
    )
    result = run_script(project)
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(
        ["*the training dataset has no labels (columns: *)*", "*fix: keep the target column and name it 'labels'*"]
    )


def test_learning_rate_zero_fails_the_step(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT.replace('report_to="none"', 'report_to="none", learning_rate=0.0'))
    result = run_script(project)
    assert failures(result) == ["step[cpu]"]
    result.stdout.fnmatch_lines(["step[[]cpu[]] failed: the learning rate is 0*", "*fix: set learning_rate*"])


def test_warmup_starting_at_zero_is_not_a_false_alarm(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT.replace('report_to="none"', 'report_to="none", warmup_steps=10'))
    assert failures(run_script(project)) == []


def test_frozen_model_fails_backward(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        textwrap.dedent(GOOD_SCRIPT).replace(
            "trainer = Trainer(model=tiny.classifier()",
            "model = tiny.classifier()\n"
            "for p in model.parameters():\n    p.requires_grad = False\n"
            "trainer = Trainer(model=model",
        ),
    )
    result = run_script(project)
    assert failures(result) == ["backward[cpu]"]
    result.stdout.fnmatch_lines(["backward[[]cpu[]] failed: the model has no trainable parameter*"])


def test_loss_detached_from_the_graph_fails_backward(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        """
        import tiny
        from transformers import Trainer, TrainingArguments

        class LoggingTrainer(Trainer):
            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                loss, outputs = super().compute_loss(model, inputs, return_outputs=True)
                loss = loss.detach()  # the bug: a copy for logging replaced the loss
                return (loss, outputs) if return_outputs else loss

        tok = tiny.tokenizer()
        args = TrainingArguments(output_dir="out", per_device_train_batch_size=8)
        trainer = LoggingTrainer(model=tiny.classifier(), args=args, processing_class=tok,
                                 train_dataset=tiny.tokenized(tiny.text_dataset(), tok))
    """,
    )
    result = run_script(project)
    assert failures(result) == ["backward[cpu]"]
    result.stdout.fnmatch_lines(["backward[[]cpu[]] failed: the loss is detached from the model*"])


UNUSED_HEAD = textwrap.dedent(GOOD_SCRIPT).replace(
    "trainer = Trainer(model=tiny.classifier()",
    "import torch\nmodel = tiny.classifier()\nmodel.unused_head = torch.nn.Linear(16, 3)\n"
    "trainer = Trainer(model=model",
)


def test_parameters_left_out_of_the_loss_are_a_note_where_ddp_looks_for_unused_parameters(
    project: pytest.Pytester,
) -> None:
    """The Trainer sets DDP's find_unused_parameters for a model without gradient checkpointing: a parameter the
    loss leaves out does not train, and no process stops over it."""
    assert "unused_head" in UNUSED_HEAD
    write(project, "train.py", UNUSED_HEAD)
    result = run_script(project, "--trainer-stages=backward", "--trainer-report=report.json")
    assert failures(result) == []
    backward = next(
        item for item in json.loads((project.path / "report.json").read_text())["items"] if item["stage"] == "backward"
    )
    assert any(
        "2 trainable parameters get no gradient from the loss, so they do not train: unused_head.weight, "
        "unused_head.bias" in note
        for note in backward["notes"]
    ), backward["notes"]


def test_a_forward_cut_before_the_layers_fails_backward_though_ddp_looks_for_unused_parameters(
    project: pytest.Pytester,
) -> None:
    """Embeddings whose output is detached get no gradient: the loss is cut through the model, and they never train,
    whatever DistributedDataParallel accepts."""
    script = textwrap.dedent(GOOD_SCRIPT).replace(
        "trainer = Trainer(model=tiny.classifier()",
        "model = tiny.classifier()\nmodel.bert.embeddings.register_forward_hook(lambda module, args, out: out.detach())\n"
        "trainer = Trainer(model=model",
    )
    assert "detach" in script
    write(project, "train.py", script)
    result = run_script(project, "--trainer-stages=backward")
    assert failures(result) == ["backward[cpu]"]
    result.stdout.fnmatch_lines(["*trainable parameters get no gradient from the loss: bert.embeddings.*"])


def test_parameters_left_out_of_the_loss_fail_backward_where_ddp_does_not_look_for_them(
    project: pytest.Pytester,
) -> None:
    script = UNUSED_HEAD.replace("TrainingArguments(", "TrainingArguments(ddp_find_unused_parameters=False, ", 1)
    assert script != UNUSED_HEAD
    write(project, "train.py", script)
    result = run_script(project)
    assert failures(result) == ["backward[cpu]"]
    result.stdout.fnmatch_lines(
        ["*2 of * trainable parameters get no gradient from the loss: unused_head.weight, unused_head.bias*"]
    )


def test_token_labels_not_aligned_with_the_tokens_fail_dataset(project: pytest.Pytester) -> None:
    from pipeline_runs import KIND_SCRIPTS

    write(
        project,
        "train.py",
        KIND_SCRIPTS["token-classification"].replace(
            "for word in encoded.word_ids(i)]", "for word in encoded.word_ids(i)][1:]"
        ),
    )
    result = run_script(project, "--trainer-stages=dataset")
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: row 0 of the training dataset has * labels for * tokens*",
            "*fix: align the labels with the tokens*word_ids()*",
        ]
    )


def test_frozen_model_fix_fits_any_architecture(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        textwrap.dedent(GOOD_SCRIPT).replace(
            "trainer = Trainer(model=tiny.classifier()",
            "model = tiny.classifier()\nmodel.requires_grad_(False)\ntrainer = Trainer(model=model",
        ),
    )
    result = run_script(project, "--trainer-stages=backward")
    result.stdout.fnmatch_lines(["*fix: unfreeze what should train, e.g. model.requires_grad_(True)*"])
