"""The checks of the `eval` stage that read an evaluation split (`pytest_trainer.stages.evaluation`), on built splits.

Pinned: references longer than what evaluation generates fail where most are, naming a generation length that keeps
95% of them whole, and are a note where few are; the -100 a target is padded with is no part of its length; targets
that are not token ids are left alone. How long evaluation generates (`generation_limit`, from the arguments and the
model's generation config) is held by tests/e2e/test_eval_generation.py.
"""

from __future__ import annotations

import pytest
from subjects import Facts, StoredSplit

from pytest_trainer import diagnosis
from pytest_trainer.stages import evaluation
from pytest_trainer.tasks import DECODER_TARGETS, Task
from pytest_trainer.tasks import IGNORE_INDEX as X

SEQ2SEQ = Task("sequence to sequence", DECODER_TARGETS, "input_ids")
SETTING = "generation_max_length=6"


def references(*lengths: int, padded_to: int = 0) -> StoredSplit:
    rows = [[7] * length + [X] * max(padded_to - length, 0) for length in lengths]
    return StoredSplit.of("evaluation", labels=rows)


def test_references_mostly_longer_than_generation_fail_with_a_length_that_keeps_them() -> None:
    with pytest.raises(
        diagnosis.Finding, match=r"3 of the 4 reference targets of the evaluation dataset are longer"
    ) as found:
        evaluation.check_generation_length(Facts(SEQ2SEQ), references(4, 9, 12, 20), 5, SETTING)
    assert "(generation_max_length=6; median 10 tokens, longest 20)" in found.value.cause
    assert found.value.fix.startswith("let evaluation generate as long as the references: generation_max_length=20")


def test_a_few_references_longer_than_generation_are_a_note() -> None:
    notes = evaluation.check_generation_length(Facts(SEQ2SEQ), references(3, 4, 4, 5, 9), 5, SETTING)
    assert notes == [
        "evaluation: 1 of the 5 reference targets of the evaluation dataset are longer than the 5 tokens evaluation "
        "generates (generation_max_length=6; median 4 tokens, longest 9): their predictions are cut"
    ]


def test_references_within_the_length_pass_and_their_padding_is_no_part_of_it() -> None:
    assert evaluation.check_generation_length(Facts(SEQ2SEQ), references(3, 4, 5, padded_to=12), 5, SETTING) == []


def test_targets_that_are_not_token_ids_are_left_alone() -> None:
    floats = StoredSplit.of("evaluation", labels=[[0.5] * 9, [0.1] * 9])
    assert evaluation.check_generation_length(Facts(SEQ2SEQ), floats, 5, SETTING) == []
    assert evaluation.check_generation_length(Facts(SEQ2SEQ, label=None), references(9, 9), 5, SETTING) == []
