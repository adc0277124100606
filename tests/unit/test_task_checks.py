"""The checks of the fed data that belong to one task (`pytest_trainer.task_checks`), on built splits.

Pinned, each on a broken split and a correct one: seq2seq targets padded with the pad id (every one where the pad id
is no real target; only the run after the end token where it is, as Whisper's is), rows of a batch or of a flat
column; answer
spans outside their sequence, ending before they start (one past, from a search loop that steps once too far), all at
position 0, or in the question (the shorter sequence of each pair, by token_type_ids or between the separators);
token-classification labels counted per word rather than per token. What reads a tokenizer (the answer text read
back, the question found by its stored text, word labels on their first token) and the pad id the tokenizer gives
(`target_ends`) are held by the end-to-end tests (tests/e2e/test_fed_data.py: in the split and in a batch).
"""

from __future__ import annotations

import numpy as np
import pytest
from subjects import QUESTIONS, TOKEN_CLASSES, Facts, StoredSplit

from pytest_trainer import diagnosis, task_checks
from pytest_trainer.tasks import IGNORE_INDEX as X

PAD, EOS = 0, 1

# ---- seq2seq targets padded with the pad id --------------------------------------------------------------------


def test_every_pad_id_is_padding_where_the_pad_id_is_no_real_target() -> None:
    targets = np.array([[5, 6, EOS, PAD, PAD], [5, EOS, PAD, PAD, PAD]])
    assert task_checks.padded_targets(targets, PAD, shared=False) == (3, 5)


def test_where_the_pad_id_is_the_end_token_one_per_row_is_the_end_and_the_run_after_it_padding() -> None:
    """Whisper pads with <|endoftext|>, its end token: the first is a target, the ones after it padding."""
    ended = np.array([[5, 6, EOS, X, X], [5, EOS, X, X, X]])
    assert task_checks.padded_targets(ended, EOS, shared=True) is None
    padded = np.array([[5, 6, EOS, EOS, EOS], [5, EOS, X, X, X]])
    assert task_checks.padded_targets(padded, EOS, shared=True) == (3, 2)


def test_a_pad_run_does_not_go_on_from_one_row_to_the_next() -> None:
    rows = np.array([[5, 6, EOS], [EOS, 7, 8]])  # an end, then a row that begins with the same token
    assert task_checks.padded_targets(rows, EOS, shared=True) is None
    flat, ends = np.array([5, 6, EOS, EOS, 7, 8]), np.array([3, 6])
    assert task_checks.padded_targets(flat, EOS, shared=True, ends=ends) is None
    assert task_checks.padded_targets(flat, EOS, shared=True) == (3, 1)  # taken as one sequence


def test_targets_padded_with_the_ignore_index_pass_and_float_values_are_no_targets() -> None:
    assert task_checks.padded_targets(np.array([[5, 6, EOS, X, X]]), PAD, shared=False) is None
    assert task_checks.padded_targets(np.array([[0.0, 1.0]]), PAD, shared=False) is None
    assert task_checks.padded_targets(np.array([[5, PAD]]), None, shared=False) is None  # no pad id known


# ---- answer spans ----------------------------------------------------------------------------------------------


def qa_split(starts: list[int], ends: list[int], *, rows: int = 1, **more: list) -> StoredSplit:
    ids = [[101, 7, 8, 102, 20, 21, 22, 23, 102]] * rows
    return StoredSplit.of(input_ids=ids, start_positions=starts, end_positions=ends, **more)


def test_spans_inside_the_context_pass() -> None:
    task_checks.check_answer_positions(Facts(QUESTIONS, label=None), qa_split([4, 5, 0], [5, 7, 0], rows=3))


def test_a_span_past_the_sequence_names_the_row_and_its_length() -> None:
    with pytest.raises(
        diagnosis.Finding, match=r"row 1 of the training dataset has an answer span 4..12 outside its 9"
    ):
        task_checks.check_answer_positions(Facts(QUESTIONS, label=None), qa_split([4, 4], [5, 12], rows=2))


def test_a_span_one_past_its_end_names_the_search_loop_that_steps_once_too_far() -> None:
    with pytest.raises(diagnosis.Finding, match=r"an answer that ends \(5\) before it starts \(6\)") as found:
        task_checks.check_answer_positions(Facts(QUESTIONS, label=None), qa_split([6], [5]))
    assert "start_positions.append(idx - 1)" in found.value.fix
    with pytest.raises(diagnosis.Finding) as found:
        task_checks.check_answer_positions(Facts(QUESTIONS, label=None), qa_split([7], [4]))
    assert "idx - 1" not in found.value.fix


def test_every_answer_at_position_0_is_answers_never_found() -> None:
    with pytest.raises(diagnosis.Finding, match=r"every one of the 8 training answers is at position 0"):
        task_checks.check_answer_positions(Facts(QUESTIONS, label=None), qa_split([0] * 8, [0] * 8, rows=8))
    task_checks.check_answer_positions(Facts(QUESTIONS, label=None), qa_split([0] * 7, [0] * 7, rows=7))  # too few


def test_spans_in_the_question_by_token_type_ids_fail() -> None:
    types = [[0, 0, 0, 1, 1, 1, 1, 1, 1]] * 4  # [CLS] q q | c c c c c [SEP]: the question is the shorter
    with pytest.raises(diagnosis.Finding, match=r"the answer spans of 4 of the 4 answered rows .* lie in the question"):
        task_checks.check_answer_positions(
            Facts(QUESTIONS, label=None), qa_split([1, 1, 2, 1], [2, 1, 2, 2], rows=4, token_type_ids=types)
        )
    task_checks.check_answer_positions(
        Facts(QUESTIONS, label=None), qa_split([4, 5, 6, 4], [5, 5, 7, 7], rows=4, token_type_ids=types)
    )


def test_a_question_as_long_as_its_context_is_not_told_apart_by_length() -> None:
    """Without the stored question, the question is the sequence twice shorter: of two alike, neither is named."""
    types = [[0, 0, 0, 0, 0, 1, 1, 1, 1]] * 4
    task_checks.check_answer_positions(
        Facts(QUESTIONS, label=None), qa_split([1, 1, 2, 1], [2, 1, 2, 2], rows=4, token_type_ids=types)
    )


# ---- token-classification labels -------------------------------------------------------------------------------


def test_labels_counted_per_word_rather_than_per_token_fail() -> None:
    split = StoredSplit.of(input_ids=[[101, 7, 8, 9, 102], [101, 7, 102]], labels=[[X, 1, 2, 0, X], [1, 2]])
    with pytest.raises(diagnosis.PipelineFailure, match=r"row 1 of the training dataset has 2 labels for 3 tokens"):
        task_checks.check_token_labels(Facts(TOKEN_CLASSES), split)


def test_one_label_per_token_passes() -> None:
    split = StoredSplit.of(input_ids=[[101, 7, 8, 9, 102], [101, 7, 102]], labels=[[X, 1, 2, 0, X], [X, 2, X]])
    task_checks.check_token_labels(Facts(TOKEN_CLASSES), split)
