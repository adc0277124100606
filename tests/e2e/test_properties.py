"""The hypothesis property items find label, length and padding bugs, shrunk, without false alarms."""

from __future__ import annotations

import textwrap

import pytest
from pipeline_runs import GOOD_SCRIPT, KIND_SCRIPTS, failures, outcomes, run_script, write

PROPERTIES = "--trainer-stages=labels,lengths,padding"


@pytest.mark.parametrize("kind", sorted(KIND_SCRIPTS))
def test_no_false_alarm_on_correct_pipelines(project: pytest.Pytester, kind: str) -> None:
    write(project, "train.py", KIND_SCRIPTS[kind])
    result = run_script(project, PROPERTIES)
    assert failures(result) == []
    # Blocks of one length, stacked by the default collator: no row is ever padded (see the test of GROUPED below).
    assert outcomes(result)["padding[cpu]"] == ("SKIPPED" if kind == "causal-lm-packed" else "PASSED")
    assert outcomes(result)["lengths[cpu]"] == "PASSED"


def test_class_the_split_never_shows_fails_labels(project: pytest.Pytester) -> None:
    # The ClassLabel names three classes, the rows only use 0 and 1, the head has 2 outputs:
    # the dataset stage sees nothing wrong, but the third class would crash training when it appears.
    write(
        project,
        "train.py",
        GOOD_SCRIPT.replace(
            "data = tiny.tokenized(tiny.text_dataset(), tok)",
            "from datasets import ClassLabel\n"
            "    data = tiny.tokenized(tiny.text_dataset(classes=2), tok)\n"
            "    data = data.cast_column('label', ClassLabel(names=['entailment', 'neutral', 'contradiction']))",
        ).replace("tiny.classifier()", "tiny.classifier(num_labels=2)"),
    )
    result = run_script(project, "--trainer-stages=dataset,labels")
    assert outcomes(result) == {"dataset[cpu]": "PASSED", "labels[cpu]": "FAILED"}
    result.stdout.fnmatch_lines(
        [
            "labels[[]cpu[]] failed: labels range 0..2 (3 classes) but the model has 2 outputs, from the ClassLabel of "
            "'label': 3 classes*",
            "*fix: pass num_labels=3*",
        ]
    )


def test_class_ids_for_a_multi_label_head_are_explained(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        GOOD_SCRIPT.replace("tiny.classifier()", "tiny.classifier(problem_type='multi_label_classification')"),
    )
    result = run_script(project)
    assert failures(result) == ["forward[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "forward[[]cpu[]] failed: multi-label classification (problem_type='multi_label_classification') needs "
            "float multi-hot labels, one row of 3 zeros and ones per example, but the labels are one value per example*",
            "*fix: give each example a float row of width 3*",
        ]
    )


def test_tokenizer_that_does_not_truncate_to_the_positions_fails_lengths(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        GOOD_SCRIPT.replace("tok = tiny.tokenizer()", "tok = tiny.tokenizer()\n    tok.model_max_length = 512"),
    )
    result = run_script(project, "--trainer-stages=dataset,lengths")
    assert outcomes(result) == {"dataset[cpu]": "PASSED", "lengths[cpu]": "FAILED"}
    result.stdout.fnmatch_lines(
        [
            "lengths[[]cpu[]] failed: the tokenizer's model_max_length is 512 but the model has 64 positions*",
            "*fix: set tokenizer.model_max_length = 64*",
        ]
    )


#: A RoBERTa classifier: its position table of 66 starts after the padding index (0 here), so it takes 65 tokens.
ROBERTA = GOOD_SCRIPT.replace(
    "tok = tiny.tokenizer()", "tok = tiny.tokenizer()\n    tok.model_max_length = {max_length}"
).replace(
    "tiny.classifier()",
    "__import__('transformers').RobertaForSequenceClassification(__import__('transformers').RobertaConfig("
    "vocab_size=len(tiny.VOCAB), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, "
    "max_position_embeddings=66, pad_token_id=tok.pad_token_id, num_labels=3))",
)


def test_a_roberta_classifier_is_held_to_the_tokens_its_positions_take(project: pytest.Pytester) -> None:
    """RoBERTa's positions count from its padding index + 1 (roberta-base: 514 positions, 512 tokens): rows of the
    table's size are no length it takes, nor one its tokenizer gives."""
    write(project, "train.py", ROBERTA.format(max_length=65))
    assert failures(run_script(project, "--trainer-stages=dataset,lengths")) == []
    write(project, "train.py", ROBERTA.format(max_length=66))
    result = run_script(project, "--trainer-stages=dataset,lengths")
    assert outcomes(result)["lengths[cpu]"] == "FAILED"
    result.stdout.fnmatch_lines(
        ["lengths[[]cpu[]] failed: the tokenizer's model_max_length is 66 but the model has 65 positions*"]
    )


def write_with_collator(project: pytest.Pytester, reads_batch: str) -> None:
    """The good script, its rows batched by a DataCollatorWithPadding that then runs `reads_batch` on the batch."""
    write(
        project,
        "train.py",
        textwrap.dedent(GOOD_SCRIPT).replace(
            "trainer = Trainer(",
            "from transformers import DataCollatorWithPadding\n"
            "class Reading(DataCollatorWithPadding):\n"
            "    def __call__(self, features):\n"
            "        batch = super().__call__(features)\n"
            f"        {reads_batch}\n"
            "        return batch\n"
            "trainer = Trainer(data_collator=Reading(tok), ",
        ),
    )


def test_collator_that_breaks_past_the_data_fails_lengths_at_the_position_limit(project: pytest.Pytester) -> None:
    """Past the longest row read lengths are drawn far between, but the limit itself is always tried."""
    write_with_collator(project, "assert batch['input_ids'].shape[1] < 64, 'rows longer than the 63-token buffer'")
    result = run_script(project, "--trainer-stages=forward,lengths")
    assert outcomes(result) == {"forward[cpu]": "PASSED", "lengths[cpu]": "FAILED"}
    result.stdout.fnmatch_lines(["lengths[[]cpu[]] failed: row* resized to 64 tokens fail: *63-token buffer*"])


def test_collator_that_breaks_on_short_rows_fails_lengths_with_the_shortest(project: pytest.Pytester) -> None:
    write_with_collator(project, "batch['input_ids'][:, 2]  # reads the third token of every row")
    result = run_script(project, "--trainer-stages=lengths")
    assert failures(result) == ["lengths[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "lengths[[]cpu[]] failed: row* resized to 1 token fail: IndexError: *",
            "*shortest failing row as text: '[[]SEP[]]'*",
        ]
    )  # its end token kept, as truncation keeps it


def test_missing_attention_mask_fails_padding(project: pytest.Pytester) -> None:
    # Weights of a realistic scale: with BERT's 0.02 init a tiny model barely reacts to anything.
    write(
        project,
        "train.py",
        GOOD_SCRIPT.replace(
            "data = tiny.tokenized(tiny.text_dataset(), tok)",
            "tok.model_input_names = ['input_ids']\n    data = tiny.tokenized(tiny.text_dataset(), tok)",
        ).replace("tiny.classifier()", "tiny.classifier(initializer_range=0.5)"),
    )
    result = run_script(project, PROPERTIES)
    assert failures(result) == ["padding[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "padding[[]cpu[]] failed: row * cut to * token* gives other results alone and padded to * beside a longer "
            "row: logits differ by *; the batch has no attention_mask, so the model attends to the padding*",
            "*fix: return attention_mask from the tokenizer*",
        ]
    )


def test_token_labels_padded_with_zero_fail_padding(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        KIND_SCRIPTS["token-classification"].replace(
            "DataCollatorForTokenClassification(tok)", "DataCollatorForTokenClassification(tok, label_pad_token_id=0)"
        ),
    )
    result = run_script(project, PROPERTIES)
    assert failures(result) == ["padding[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "padding[[]cpu[]] failed: *: the loss differs (*); labels on padded positions are [[]0[]], not -100*",
            "*fix: pad labels with -100*",
        ]
    )


def test_left_padding_on_a_causal_model_fails_padding(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        KIND_SCRIPTS["causal-lm"].replace(
            "tok = tiny.tokenizer()", "tok = tiny.tokenizer()\n        tok.padding_side = 'left'"
        ),
    )
    result = run_script(project, PROPERTIES)
    assert failures(result) == ["padding[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "*the tokenizer pads on the left, which shifts this model's positions*",
            "*fix: pad on the right for training*",
        ]
    )


def test_examples_option_and_strategies_fixture(project: pytest.Pytester) -> None:
    write(
        project,
        "conftest.py",
        """
        import pytest
        import tiny
        from transformers import Trainer, TrainingArguments

        @pytest.fixture(scope="session")
        def trainer(tmp_path_factory):
            tok = tiny.tokenizer()
            args = TrainingArguments(output_dir=str(tmp_path_factory.mktemp("out")), per_device_train_batch_size=8)
            return Trainer(model=tiny.classifier(), args=args, processing_class=tok,
                           train_dataset=tiny.tokenized(tiny.text_dataset(), tok))
    """,
    )
    write(
        project,
        "test_own.py",
        """
        import pytest
        from hypothesis import given, settings

        @pytest.mark.trainer_pipeline(stages=["forward"], devices=["cpu"])
        def test_my_property(trainer_strategies, trainer):
            @settings(max_examples=10, deadline=None)
            @given(trainer_strategies.label_values(), trainer_strategies.rows())
            def labels_and_rows_are_real(label, row):
                assert label in (0, 1, 2)
                assert 0 <= row < len(trainer.train_dataset)

            labels_and_rows_are_real()
    """,
    )
    project.runpytest("--trainer-examples=5").assert_outcomes(passed=1)
    bad = project.runpytest("--trainer-examples=zero")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--trainer-examples on the command line: 'zero' is not a positive whole number*"])


def test_model_and_tokenizer_disagreeing_on_the_pad_token_fail_padding(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT.replace("tiny.classifier()", "tiny.classifier(pad_token_id=1)"))
    result = run_script(project, "--trainer-stages=padding")
    assert failures(result) == ["padding[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "padding[[]cpu[]] failed: the model's config.pad_token_id is 1 but the tokenizer pads with 0*",
            "*fix: model.config.pad_token_id = tokenizer.pad_token_id*",
        ]
    )


def test_rows_padded_when_tokenized_pass_lengths_and_padding(project: pytest.Pytester) -> None:
    """A row tokenized with padding='max_length' ends with pad ids: resizing it keeps no pad as its end token."""
    script = GOOD_SCRIPT.replace(
        "tiny.tokenized(tiny.text_dataset(), tok)",
        "tiny.text_dataset().map(lambda batch: tok(batch['text'], truncation=True, padding='max_length', "
        "max_length=16), batched=True, remove_columns=['text'])",
    )
    assert script != GOOD_SCRIPT
    write(project, "train.py", script)
    result = run_script(project, "--trainer-stages=lengths,padding")
    assert outcomes(result) == {"lengths[cpu]": "PASSED", "padding[cpu]": "PASSED"}, result.stdout.str()[-3000:]


#: A collator that packs the rows of a batch into one sequence, restarting position_ids at each row (padding-free).
FLATTENED = """
    import lm
    import tiny
    from datasets import Dataset
    from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments

    tok = lm.tokenizer()
    data = Dataset.from_dict({"text": tiny.sentences(48, seed=7)}).map(
        lambda batch: {**tok(batch["text"]), "labels": tok(batch["text"])["input_ids"]}, batched=True,
        remove_columns=["text"])
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, learning_rate=1e-3, report_to="none")
    model = lm.model()
    model.config.use_cache = False  # transformers 4 separates packed documents by position_ids only without a cache
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data, processing_class=tok,
                      data_collator=DataCollatorWithFlattening())
    trainer.train()
"""


def test_a_packing_collator_is_not_compared_as_padded_rows(project: pytest.Pytester) -> None:
    from task_scripts import LM

    project.makepyfile(lm=LM)
    write(project, "train.py", FLATTENED)
    result = run_script(project)
    assert failures(result) == [], result.stdout.str()[-3000:]
    assert outcomes(result)["padding[cpu]"] == "SKIPPED"
    assert outcomes(result)["lengths[cpu]"] == "PASSED"
    result.stdout.fnmatch_lines(
        [
            "*the collator packs rows into one sequence (it makes 1 sequence of the 2 rows it is "
            "given): no row is padded beside another*"
        ]
    )


#: Text concatenated and cut into blocks of 16 tokens (the "group_texts" recipe): every row has the same length.
GROUPED = """
    import lm
    import tiny
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments, default_data_collator

    tok = lm.tokenizer()
    ids = [token for text in tiny.sentences(64, seed=7) for token in tok(text)["input_ids"]]
    blocks = [ids[start:start + 16] for start in range(0, len(ids) - 15, 16)]
    data = Dataset.from_dict({"input_ids": blocks, "attention_mask": [[1] * 16 for _ in blocks]})
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, learning_rate=1e-3, report_to="none")
    trainer = Trainer(model=lm.model(), args=args, train_dataset=COLUMNS, processing_class=tok, data_collator=COLLATOR)
    trainer.train()
"""


def test_a_collator_that_never_pads_skips_padding_saying_so(project: pytest.Pytester) -> None:
    """default_data_collator stacks rows of one length and refuses others: no example is padded, so none is
    compared, and the item says so rather than passing."""
    from task_scripts import LM

    project.makepyfile(lm=LM)
    grouped = GROUPED.replace("COLUMNS", 'data.map(lambda row: {"labels": row["input_ids"]})')
    write(project, "train.py", grouped.replace("COLLATOR", "default_data_collator"))
    result = run_script(project, "--trainer-stages=padding", "-rs")
    assert outcomes(result) == {"padding[cpu]": "SKIPPED"}, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*the collator does not pad: it refuses a row cut shorter beside a longer one (*)*"])


def test_the_same_blocks_padded_by_the_lm_collator_are_compared(project: pytest.Pytester) -> None:
    from task_scripts import LM

    project.makepyfile(lm=LM)
    grouped = GROUPED.replace("COLUMNS", "data").replace("COLLATOR", "DataCollatorForLanguageModeling(tok, mlm=False)")
    write(project, "train.py", grouped)
    result = run_script(project, "--trainer-stages=padding")
    assert outcomes(result) == {"padding[cpu]": "PASSED"}, result.stdout.str()[-3000:]
