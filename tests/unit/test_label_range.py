"""Class ids beyond the head (`diagnosis.labels_beyond_head`): the fix that follows from the ids given."""

from __future__ import annotations

from pytest_trainer import diagnosis


def test_ids_counted_from_one_are_shifted_not_given_another_output() -> None:
    found = diagnosis.labels_beyond_head(1, 3, 3, " (row 4 of the training dataset has label 3)", column="label")
    assert found.cause == (
        "labels range 1..3: 3 classes counted from 1, but class ids run from 0 to num_labels - 1, so label 3 is "
        "beyond the model's 3 outputs (row 4 of the training dataset has label 3)"
    )
    assert found.fix == (
        "shift the class ids to start at 0 where the labels are made, e.g. dataset = dataset.map(lambda row: "
        "{'label': row['label'] - 1}) (another output would leave class 0 without a row)"
    )


def test_more_classes_than_outputs_get_the_number_of_outputs() -> None:
    found = diagnosis.labels_beyond_head(0, 2, 2, column="label")
    assert found.fix.startswith("pass num_labels=3 when building the model")
    # Counted from 1 but more classes than outputs: shifting alone would not fit them.
    assert diagnosis.labels_beyond_head(1, 3, 2, column="label").fix.startswith("pass num_labels=4")
    # Per-token labels (no column to shift one value of): the number of outputs.
    assert diagnosis.labels_beyond_head(1, 3, 3).fix.startswith("pass num_labels=4")
