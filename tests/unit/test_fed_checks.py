"""The checks of every split as fed (`pytest_trainer.fed_checks`), on built splits.

Pinned, each on a broken split and a correct one: NaN or infinite numbers name their column, their row and their
count; class ids fit the head (a label past it names the range and the head's width, a negative one the range, float
labels the cast, -100 is ignored), as do choice indices the choices; float rows of one value per class are multi-label
classification (a single-label head's refusal of them reads the model's config: end to end); a training split of one class, or of classes counted from 1
over a head with an output more, is a finding, unless the script cuts the split. What reads the model (token ids
against its embedding, lengths against its positions) is held by the end-to-end tests.
"""

from __future__ import annotations

import math

import pytest
from subjects import CHOICES, TEXT_CLASSES, TOKEN_CLASSES, Facts, StoredSplit

from pytest_trainer import diagnosis, fed_checks
from pytest_trainer.tasks import IGNORE_INDEX as X

# ---- numbers that make the loss NaN ----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_number_names_its_column_row_and_count(bad: float) -> None:
    split = StoredSplit.of(score=[0.5, 1.0, bad, bad], label=[0, 1, 0, 1])
    with pytest.raises(
        diagnosis.PipelineFailure, match=rf"column 'score' of the training dataset holds {bad} in row 2 \(2 non-finite"
    ):
        fed_checks.check_finite(split.description, split.table, split.row)


def test_a_non_finite_number_in_a_list_column_names_the_row_that_holds_it() -> None:
    split = StoredSplit.of(pixel_values=[[0.1, 0.2], [0.3], [math.nan, 0.4]])
    with pytest.raises(diagnosis.PipelineFailure, match=r"holds nan in row 2 \(1 non-finite"):
        fed_checks.check_finite("evaluation", split.table)


def test_rows_read_spread_over_the_split_name_the_dataset_row() -> None:
    split = StoredSplit.of(score=[0.5, math.nan])
    with pytest.raises(diagnosis.PipelineFailure, match=r"in row 70 "):
        fed_checks.check_finite("training", split.table, lambda position: [10, 70][position])


def test_finite_numbers_integers_and_text_pass() -> None:
    split = StoredSplit.of(score=[0.5, -1e30], label=[0, 1], text=["nan", "inf"], ids=[[1, 2], [3]])
    fed_checks.check_finite("training", split.table)


# ---- class ids against the head --------------------------------------------------------------------------------


def test_class_ids_within_the_head_and_ignored_positions_pass() -> None:
    fed_checks.check_labels(Facts(TEXT_CLASSES), StoredSplit.of(labels=[0, 1, 2, 1]))
    fed_checks.check_labels(Facts(TOKEN_CLASSES), StoredSplit.of(labels=[[X, 0, 4, X], [X, 3, X]]))


def test_a_class_id_past_the_head_names_the_range_and_the_width() -> None:
    with pytest.raises(diagnosis.PipelineFailure, match=r"row 3 of the training dataset has label 3") as failed:
        fed_checks.check_labels(Facts(TEXT_CLASSES), StoredSplit.of(labels=[0, 2, 1, 3, 0]))
    assert "num_labels=4" in failed.value.fix


def test_class_ids_counted_from_one_over_a_head_of_their_number_are_shifted() -> None:
    """Labels 1..3 over a 3-class head: the fix shifts them to 0..2, not another output (which would leave 0 empty)."""
    with pytest.raises(diagnosis.PipelineFailure) as failed:
        fed_checks.check_labels(Facts(TEXT_CLASSES), StoredSplit.of(labels=[1, 2, 3, 2]))
    assert "row['labels'] - 1" in failed.value.fix


def test_a_token_label_past_the_head_names_its_row() -> None:
    split = StoredSplit.of("evaluation", labels=[[X, 0, 1, X], [X, 5, X]])
    with pytest.raises(diagnosis.PipelineFailure, match=r"row 1 of the evaluation dataset has label 5"):
        fed_checks.check_labels(Facts(TOKEN_CLASSES), split)


def test_a_negative_class_id_other_than_the_ignored_one_fails() -> None:
    with pytest.raises(diagnosis.PipelineFailure, match=r"label -1 in row 2 of the training dataset is negative"):
        fed_checks.check_labels(Facts(TEXT_CLASSES), StoredSplit.of(labels=[0, 1, -1]))


def test_float_labels_of_a_single_label_head_are_cast() -> None:
    with pytest.raises(diagnosis.PipelineFailure, match=r"labels are floats but the model is a 3-class") as failed:
        fed_checks.check_labels(Facts(TEXT_CLASSES), StoredSplit.of(labels=[0.0, 1.0, 2.0]))
    assert "cast_column('labels', Value('int64'))" in failed.value.fix


def test_float_rows_of_one_value_per_class_are_multi_label_classification() -> None:
    fed_checks.check_labels(Facts(TEXT_CLASSES), StoredSplit.of(labels=[[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]))


def test_a_choice_index_past_the_choices_names_their_number() -> None:
    ids = [[[5, 6], [7, 8]], [[5, 6], [9, 8]]]
    with pytest.raises(diagnosis.PipelineFailure, match=r"each example has 2 choices \(labels 0..1\)"):
        fed_checks.check_labels(Facts(CHOICES), StoredSplit.of(input_ids=ids, labels=[0, 2]))
    fed_checks.check_labels(Facts(CHOICES), StoredSplit.of(input_ids=ids, labels=[0, 1]))


def test_a_split_without_its_label_column_is_left_to_the_labels_present_check() -> None:
    fed_checks.check_labels(Facts(TEXT_CLASSES, label=None), StoredSplit.of(labels=[7, 8]))


# ---- the fix of class ids beyond the head, from the ids given ------------------------------------------------


def test_ids_counted_from_one_are_shifted_not_given_another_output() -> None:
    found = fed_checks.labels_beyond_head(1, 3, 3, " (row 4 of the training dataset has label 3)", column="label")
    assert found.cause == (
        "labels range 1..3: 3 classes counted from 1, but class ids run from 0 to num_labels - 1, so label 3 is "
        "beyond the model's 3 outputs (row 4 of the training dataset has label 3)"
    )
    assert found.fix == (
        "shift the class ids to start at 0 where the labels are made, e.g. dataset = dataset.map(lambda row: "
        "{'label': row['label'] - 1}) (another output would leave class 0 without a row)"
    )


def test_more_classes_than_outputs_get_the_number_of_outputs() -> None:
    found = fed_checks.labels_beyond_head(0, 2, 2, column="label")
    assert found.fix.startswith("pass num_labels=3 when building the model")
    # Counted from 1 but more classes than outputs: shifting alone would not fit them.
    assert fed_checks.labels_beyond_head(1, 3, 2, column="label").fix.startswith("pass num_labels=4")
    # Per-token labels (no column to shift one value of): the number of outputs.
    assert fed_checks.labels_beyond_head(1, 3, 3).fix.startswith("pass num_labels=4")


# ---- the classes the training split holds ---------------------------------------------------------------------


def test_a_training_split_of_one_class_fails() -> None:
    with pytest.raises(diagnosis.Finding, match=r"every label of the training dataset is 1"):
        fed_checks.check_labels_vary(Facts(TEXT_CLASSES), StoredSplit.of(labels=[1, 1, 1, 1]))


def test_classes_counted_from_one_over_a_head_with_an_output_more_leave_output_0_untrained() -> None:
    labels = [1, 2, 1, 2, 2, 1]
    with pytest.raises(diagnosis.Finding, match=r"class 0 has no row in the training dataset") as found:
        fed_checks.check_labels_vary(Facts(TEXT_CLASSES), StoredSplit.of(labels=labels))
    assert "num_labels=2" in found.value.fix


def test_a_split_the_script_cuts_may_miss_class_0() -> None:
    fed_checks.check_labels_vary(Facts(TEXT_CLASSES, cuts=True), StoredSplit.of(labels=[1, 2, 1, 2, 2, 1]))


def test_a_split_of_several_classes_passes_and_token_labels_ignore_the_ignored_positions() -> None:
    fed_checks.check_labels_vary(Facts(TEXT_CLASSES), StoredSplit.of(labels=[0, 1, 2, 0]))
    fed_checks.check_labels_vary(Facts(TOKEN_CLASSES), StoredSplit.of(labels=[[X, 0, 1], [X, 4, X]]))
    with pytest.raises(diagnosis.Finding):
        fed_checks.check_labels_vary(Facts(TOKEN_CLASSES), StoredSplit.of(labels=[[X, 3, X], [X, 3, 3]]))
