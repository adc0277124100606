"""The checks of the `targets` stage (`pytest_trainer.stages.targets`), on trained rows built by hand.

Pinned, each failing on a broken set of rows and silent on the correct one: a row with no supervised token; labels
shifted left by hand for a model that shifts them itself (and not a text of one repeated token, whose labels equal the
next token too); prompt tokens that carry labels although the data marks them as prompt. Reading the rows off the
Trainer's own collator is held by tests/e2e/test_targets.py.
"""

from __future__ import annotations

import pytest
from subjects import answer, asked, row, text_row

from pytest_trainer import diagnosis
from pytest_trainer.stages import targets
from pytest_trainer.tasks import IGNORE_INDEX as X

# ---- rows with nothing to learn, labels shifted by hand, prompt tokens trained --------------------------


def test_a_row_with_no_supervised_token_fails() -> None:
    with pytest.raises(diagnosis.PipelineFailure, match=r"1 of 2 sampled rows have no supervised token") as failed:
        targets.check_rows_supervised(asked([answer([5, 6], [7]), row([5, 6, 7], [X, X, X])]))
    assert "max_length" in failed.value.fix


def test_rows_that_each_train_a_token_pass() -> None:
    targets.check_rows_supervised(asked([answer([5, 6], [7]), text_row([5, 6])]))


def test_labels_shifted_left_by_hand_fail_naming_the_model_that_shifts_them() -> None:
    ids = [5, 6, 7, 8, 9, 10, 11, 12]
    shifted = [row(ids, [*ids[1:], X]), row(ids[::-1], [*ids[::-1][1:], X])]
    with pytest.raises(diagnosis.PipelineFailure, match=r"shifted left by one .* LlamaForCausalLM shifts them itself"):
        targets.check_shift(asked(shifted), "LlamaForCausalLM")


def test_labels_equal_to_the_inputs_pass_the_shift_check() -> None:
    ids = [5, 6, 7, 8, 9, 10]
    targets.check_shift(asked([text_row(ids), text_row(ids[::-1])]), "LlamaForCausalLM")


def test_labels_that_equal_the_next_token_by_a_repeat_are_no_shift() -> None:
    """A text of one repeated token has labels equal to the next token too: under half differ, no shift is told."""
    targets.check_shift(asked([text_row([5, 5, 5, 5, 5, 5])]), "LlamaForCausalLM")


def test_prompt_tokens_that_carry_labels_fail() -> None:
    leaked = row([5, 6, 7, 8], [5, 6, 7, 8], prompt=[True, True, False, False], masked_by="labels")
    with pytest.raises(diagnosis.PipelineFailure, match=r"1 prompt tokens carry labels in 1 of 2 sampled rows"):
        targets.check_prompt_unlabelled(asked([leaked, answer([5, 6], [7, 8])]))


def test_a_prompt_left_out_of_the_loss_passes() -> None:
    kept = row([5, 6, 7, 8], [X, X, 7, 8], prompt=[True, True, False, False], masked_by="labels")
    targets.check_prompt_unlabelled(asked([kept]))
