"""What each kind of task feeds its model and what its labels mean (`pytest_trainer.tasks.Task`), on tasks built here.

Pinned: the token columns are the sequence and the task's other token columns; the collator that pads per-token labels
names itself by the task; a seq2seq model's decoder keys do not run along the encoder's tokens; why a task has no
sequence to vary or no classes to vary is said in the user's terms (a model of one's own, pixels), and nothing for one
that has them. Which task a real model is is held by tests/e2e/test_task_detection.py.
"""

from __future__ import annotations

import pytest

from pytest_trainer import tasks
from pytest_trainer.tasks import Task


def test_token_columns_are_the_sequence_and_the_task_s_other_token_columns() -> None:
    pairs = Task("preference pairs", tasks.PREFERENCE, "input_ids", more_token_columns=("chosen_input_ids",))
    assert pairs.token_columns == ("input_ids", "chosen_input_ids")
    assert Task("image classification", tasks.CLASS, None).token_columns == ()


def test_the_collator_that_pads_per_token_labels_is_named_by_the_task() -> None:
    assert Task("ner", tasks.TOKEN_CLASS, "input_ids").label_collator == "DataCollatorForTokenClassification(tokenizer)"
    assert (
        Task("s2s", tasks.DECODER_TARGETS, "input_ids").label_collator
        == "DataCollatorForSeq2Seq(tokenizer, model=model)"
    )


def test_a_seq2seq_model_s_decoder_keys_do_not_run_along_the_encoder_tokens() -> None:
    seq2seq = Task("sequence to sequence", tasks.DECODER_TARGETS, "input_ids")
    assert [seq2seq.along_sequence(key) for key in ("attention_mask", "labels", "decoder_attention_mask")] == [
        True,
        False,
        False,
    ]
    assert Task("causal lm", tasks.TOKEN_IDS, "input_ids", shifts_labels=True).along_sequence("labels")


def test_why_a_task_has_no_sequence_to_vary_is_said() -> None:
    own = Task("a model of your own (Net)", tasks.UNKNOWN, None, conventional=False)
    assert "cannot tell which input of a model of your own is its token sequence" in (own.no_sequence() or "")
    assert Task("image classification", tasks.CLASS, None).no_sequence() == (
        "image classification: the model takes no token sequence whose length could vary"
    )
    assert Task("text classification", tasks.CLASS, "input_ids").no_sequence() is None


@pytest.mark.parametrize("labels", [tasks.TOKEN_IDS, tasks.DECODER_TARGETS, tasks.POSITIONS, tasks.PREFERENCE])
def test_labels_that_are_no_classes_say_what_they_are(labels: str) -> None:
    assert Task("a task", labels, "input_ids").not_classes() == tasks.NOT_CLASSES[labels]


@pytest.mark.parametrize("labels", tasks.VARIABLE)
def test_labels_a_property_can_vary_say_nothing(labels: str) -> None:
    assert Task("a task", labels, "input_ids").not_classes() is None


def test_labels_of_an_unknown_kind_are_said_to_be_unknown() -> None:
    assert Task("a task", "something new", "input_ids").not_classes() == tasks.NOT_CLASSES[tasks.UNKNOWN]
