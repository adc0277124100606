"""The checks of the `collate` stage that read a batch's arrays (`pytest_trainer.stages.collate`), on built batches.

Pinned, each on a broken batch and a correct one: seq2seq labels that all begin with the decoder start token the model
prepends itself (a row with nothing supervised, or a single row, proves nothing); a masked language model's labels
that copy every input token unmasked, named by the collator told mlm=False or by a labels column copied from the
inputs, against labels the collator masked. Reading them off a real collator's tensors is held by the end-to-end
tests.
"""

from __future__ import annotations

import numpy as np
import pytest

from pytest_trainer import diagnosis
from pytest_trainer.stages import collate
from pytest_trainer.tasks import IGNORE_INDEX as X

START = 50258  # Whisper's <|startoftranscript|>


def test_labels_that_all_begin_with_the_decoder_start_token_fail() -> None:
    labels = np.array([[START, 5, 6, X], [START, 7, X, X], [X, X, X, X]])
    with pytest.raises(
        diagnosis.Finding, match=r"every label row of the first batch \(2 rows\) begins with '<\|sot\|>'"
    ):
        collate.check_start_token(labels, START, "WhisperForConditionalGeneration", "'<|sot|>'")


def test_labels_without_the_start_token_pass() -> None:
    collate.check_start_token(np.array([[5, 6, X], [7, X, X]]), START, "T5ForConditionalGeneration", "'<pad>'")
    collate.check_start_token(np.array([[START, 6, X], [7, X, X]]), START, "T5ForConditionalGeneration", "'<pad>'")


def test_one_row_or_flat_labels_prove_nothing() -> None:
    collate.check_start_token(np.array([[START, 5, 6]]), START, "Whisper", "x")
    collate.check_start_token(np.array([START, START]), START, "Whisper", "x")


IDS = np.array([[101, 7, 8, 9, 102, 0], [101, 10, 11, 102, 0, 0]])
MASK = (IDS != 0).astype(int)


def test_labels_that_copy_every_input_token_fail_naming_the_collator_told_not_to_mask() -> None:
    copied = np.where(MASK == 1, IDS, X)
    found = collate.check_masked_targets(copied, IDS, MASK, "BertForMaskedLM", "DataCollatorForLanguageModeling")
    assert found is not None
    assert "DataCollatorForLanguageModeling(mlm=False) copies input_ids into labels" in found.cause
    assert "all 9 supervised tokens" in found.cause
    assert found.fix.startswith("mask the inputs: ")


def test_a_labels_column_copied_from_the_inputs_is_dropped_and_the_inputs_masked() -> None:
    found = collate.check_masked_targets(IDS.copy(), IDS, None, "BertForMaskedLM", None)
    assert found is not None and "the labels are a copy of input_ids" in found.cause
    assert found.fix.startswith("drop the labels column and mask the inputs: ")


def test_masked_labels_pass() -> None:
    """Every supervised position's input replaced by the mask token: the labels are no copy of what the model sees,
    however many positions are supervised."""
    masked = np.where(MASK == 1, IDS, X)
    inputs = np.where(MASK == 1, 103, IDS)  # [MASK] at every real position
    assert collate.check_masked_targets(masked, inputs, MASK, "BertForMaskedLM", None) is None


def test_labels_that_supervise_under_half_the_tokens_or_differ_pass() -> None:
    few = np.full_like(IDS, X)
    few[0, 1:3] = IDS[0, 1:3]
    assert collate.check_masked_targets(few, IDS, MASK, "BertForMaskedLM", None) is None
    other = np.where(MASK == 1, IDS + 1, X)
    assert collate.check_masked_targets(other, IDS, MASK, "BertForMaskedLM", None) is None
    assert collate.check_masked_targets(IDS[:, :3], IDS, MASK, "BertForMaskedLM", None) is None  # shapes differ
