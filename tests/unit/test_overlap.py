"""Rows repeated between two splits (`overlap`): the hash of a row, the pairs found with their targets or under other
targets, and the verdict on natural repeats, a split made from training rows and the training split evaluated.
The end-to-end runs (splits as the Trainer feeds them) are in tests/e2e/test_overlapping_splits.py.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pytest

from pytest_trainer import diagnosis, overlap


def rows(*sequences: list[int]) -> overlap.Rows:
    return overlap.rows_of(sequences)


def fed(inputs: Sequence[list[int]], others: dict[str, list[object]] | None = None, **targets: Sequence[object]):
    """A split of these token ids, `others` columns (compared, not hashed) and targets, shown as given."""
    return overlap.Fed(
        "input_ids",
        rows(*inputs),
        {name: overlap.rows_of(values) for name, values in targets.items()},  # type: ignore[arg-type]
        others or {},
        dict(targets),
    )


def evaluated(acting: Sequence[str] = (), training_rows: int = 1000, targets: Sequence[str] = ("label",)):
    return overlap.Evaluated(
        "evaluation",
        acting,
        training_rows,
        lambda row, source: f"evaluation row {row} = training row {source}",
        "(tuple(row['input_ids']), row['label'])",
        targets,
    )


def found(leaked: int, rows: int, short: int = 0, conflicting: int = 0) -> overlap.Overlap:
    """An overlap of `leaked` repeated rows (the first `short` of them short) among `rows` evaluation rows."""
    return overlap.Overlap(
        [(row, row) for row in range(leaked)], [(row, row) for row in range(leaked, leaked + conflicting)], rows, short
    )


LONG = list(range(10, 30))  # 20 tokens


def test_equal_rows_hash_equal_and_order_matters() -> None:
    hashed = rows([5, 6, 7], [7, 6, 5], [5, 6, 7], [], [5, 6], [5, 6, 7, 0]).hashes
    assert hashed[0] == hashed[2]
    assert len({int(hashed[index]) for index in (0, 1, 4, 5)}) == 4
    assert hashed[3] == 0


def test_labels_as_numbers_compare_by_value_whatever_their_type() -> None:
    assert overlap.rows_of([1, 2.0, 2.5]).hashes[1] == overlap.rows_of([7, 2, 9]).hashes[1]
    assert overlap.rows_of([2.5]).hashes[0] != overlap.rows_of([2.4]).hashes[0]
    assert overlap.rows_of([[0, 1], [1, 0]]).listed and not overlap.rows_of([0, 1]).listed
    # A score stored as float64 in one split and float32 in the other is the float32 the loss reads in both.
    as_float32 = float(np.float32(0.1))
    assert overlap.rows_of([0.1]).hashes[0] == overlap.rows_of([as_float32]).hashes[0]


def test_labels_that_are_not_finite_are_read_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        values = overlap._as_integers(np.array([np.nan, np.inf, 1e300, 0.5, -3.0]))
    assert values[4] == -3 and len(set(values.tolist())) == 4  # 1e300 is float32's inf, as the loss reads it


def test_overlap_pairs_each_evaluation_row_with_its_training_row() -> None:
    training = fed([[1, 2, 3, 4, 5, 6, 7, 8, 9], [2, 3], [4, 4, 4, 4, 4, 4, 4, 4]])
    evaluation = fed([[9, 9], [2, 3], [], [4, 4, 4, 4, 4, 4, 4, 4], [1, 2, 3, 4, 5, 6, 7, 8]])
    result = overlap.between(training, evaluation)
    assert result.leaked == [(1, 1), (3, 2)]
    assert result.conflicting == []
    assert (result.rows, result.short, result.long) == (4, 1, 1)


def test_the_same_input_under_another_label_conflicts_and_does_not_leak() -> None:
    training = fed([LONG, LONG[1:], LONG[2:]], label=[0, 1, 2])
    evaluation = fed([LONG, LONG[1:], LONG[3:]], label=[0, 2, 1])
    result = overlap.between(training, evaluation)
    assert result.leaked == [(0, 0)]
    assert result.conflicting == [(1, 1)]


def test_an_input_trained_under_two_labels_leaks_under_either() -> None:
    training = fed([LONG, LONG, LONG[1:]], label=[0, 1, 1])
    evaluation = fed([LONG, LONG, LONG], label=[1, 0, 2])
    result = overlap.between(training, evaluation)
    assert [row for row, _ in result.leaked] == [0, 1]
    assert [row for row, _ in result.conflicting] == [2]


def test_per_token_and_float_targets_are_part_of_the_row() -> None:
    training = fed([LONG, LONG[1:]], labels=[[0] * 20, [1] * 19], score=[0.25, 0.5])
    evaluation = fed([LONG, LONG[1:]], labels=[[0] * 20, [1] * 18 + [2]], score=[0.25, 0.5])
    result = overlap.between(training, evaluation)
    assert result.leaked == [(0, 0)]
    assert result.conflicting == [(1, 1)]


def test_other_columns_are_compared_on_the_rows_found() -> None:
    """The same question and answer over another image is another row."""
    training = fed([LONG, LONG[1:]], others={"image": ["a.png", "b.png"]}, label=[0, 1])
    evaluation = fed([LONG, LONG[1:]], others={"image": ["c.png", "b.png"]}, label=[0, 1])
    assert overlap.between(training, evaluation).leaked == [(1, 1)]


def test_short_rows_are_told_by_their_tokens_not_their_padding() -> None:
    padded = [5, 6, 7, 0, 0, 0, 0, 0, 0, 0]
    masks = {"attention_mask": [[1, 1, 1] + [0] * 7, [1] * 10]}
    training = fed([padded, LONG[:10]], others=masks)
    evaluation = fed([padded, LONG[:10]], others=masks)
    result = overlap.between(training, evaluation)
    assert (len(result.leaked), result.short) == (2, 1)


def test_the_example_of_per_token_labels_starts_where_they_differ() -> None:
    training = fed([LONG], labels=[[-100, 0, 1, 2, 3, 0, 1, 2, -100]])
    evaluation = fed([LONG], labels=[[-100, 0, 1, 3, 3, 0, 1, 2, -100]])
    said = overlap._example("evaluation", evaluation, training, None, 0, 0)
    assert (
        said
        == "evaluation row 0 = training row 0 (labels from token 3: [3, 3, 0, 1, 2, -100] against [2, 3, 0, 1, 2, -100])"
    )
    assert overlap._example("evaluation", training, training, None, 0, 0) == "evaluation row 0 = training row 0"
    scored = fed([LONG], score=[0.5])
    assert overlap._example("evaluation", scored, fed([LONG], score=[1.5]), None, 0, 0).endswith(
        "(score 0.5 against 1.5)"
    )


def test_overlap_over_many_rows_finds_exactly_the_copied_ones() -> None:
    generator = np.random.default_rng(0)
    training = [list(generator.integers(0, 50, generator.integers(1, 40))) for _ in range(5000)]
    evaluation = [list(generator.integers(0, 50, generator.integers(1, 40))) for _ in range(500)]
    copied = [3, 77, 499]
    for row in copied:
        evaluation[row] = training[row * 7]
    result = overlap.between(fed(training), fed(evaluation))
    assert [row for row, _ in result.leaked if len(evaluation[row]) > 2] == copied


# ---- the verdict ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("leaked", "rows"), [(2, 60), (2, 40), (5, 100), (9, 100)])
def test_natural_repeats_are_a_note_even_where_a_setting_acts(leaked: int, rows: int) -> None:
    for acting in ((), ("load_best_model_at_end",)):
        notes = overlap.judge(found(leaked, rows), evaluated(acting))
        assert len(notes) == 1
        assert notes[0].startswith(f"{leaked} of the {rows} rows of the evaluation dataset ")
        assert notes[0].endswith(": natural repeats, too few to sway its metrics")


def test_a_split_made_from_training_rows_fails_whatever_the_settings() -> None:
    with pytest.raises(diagnosis.Finding) as raised:
        overlap.judge(found(64, 80, short=22), evaluated())
    assert raised.value.cause == (
        "the evaluation dataset was made from training rows: 64 of the 80 rows of the evaluation dataset (80%) are "
        "training rows, input and label alike, as the model is fed them (22 of them short, under 8 tokens), far more "
        "than natural repeats give; the data held copies of its rows when it was split (oversampled, augmented, or "
        "repeated in its source), so its metrics score rows the model has trained on"
    )
    assert raised.value.fix == (
        "de-duplicate the data, then split it, and oversample or augment the training split only: key = lambda row: "
        "(tuple(row['input_ids']), row['label']); first = {}; [first.setdefault(key(row), index) for index, row in "
        "enumerate(data)]; data = data.select(sorted(first.values()))"
    )
    assert raised.value.details[0] == "e.g. evaluation row 0 = training row 0"
    with pytest.raises(diagnosis.Finding) as raised:
        overlap.judge(found(64, 80, short=22), evaluated(("load_best_model_at_end",)))
    assert raised.value.cause.endswith("score rows the model has trained on, and load_best_model_at_end acts on them")


def test_short_repeated_rows_do_not_count_towards_a_split_made_from_training() -> None:
    notes = overlap.judge(found(30, 100, short=25), evaluated(("load_best_model_at_end",)))
    assert notes[0].startswith("30 of the 100 rows of the evaluation dataset (30%) are training rows, input and label ")
    assert notes[0].endswith(
        ": natural repeats, short rows that any corpus repeats, too few long ones to sway its metrics"
    )


def test_repeats_that_sway_a_metric_fail_only_where_a_setting_acts_on_it() -> None:
    notes = overlap.judge(found(15, 100), evaluated())
    assert notes == [
        "evaluation: 15 of the 100 rows of the evaluation dataset (15%) are training rows, input and label alike, as "
        "the model is fed them, e.g. evaluation row 0 = training row 0; evaluation "
        "row 1 = training row 1; evaluation row 2 = training row 2: no setting picks a checkpoint by its metrics, "
        "which they inflate"
    ]
    with pytest.raises(diagnosis.Finding) as raised:
        overlap.judge(found(15, 100), evaluated(("EarlyStoppingCallback",)))
    assert raised.value.cause.startswith("EarlyStoppingCallback acts on metrics of training rows: 15 of the 100 rows")


@pytest.mark.parametrize(("leaked", "rows"), [(3, 13), (3, 12), (4, 12)])
def test_a_small_split_that_natural_repeats_could_fill_by_chance_is_no_split_made_from_training(
    leaked: int, rows: int
) -> None:
    """A corpus that repeats 10% of its rows puts 3 of 13 evaluation rows (23%) in training one time in seven."""
    notes = overlap.judge(found(leaked, rows), evaluated())
    assert notes[0].startswith(f"evaluation: {leaked} of the {rows} rows of the evaluation dataset")
    assert notes[0].endswith("no setting picks a checkpoint by its metrics, which they inflate")
    with pytest.raises(diagnosis.Finding, match=r"^load_best_model_at_end acts on metrics of training rows"):
        overlap.judge(found(leaked, rows), evaluated(("load_best_model_at_end",)))  # the metric is still swayed


def test_a_small_split_of_training_rows_fails_where_chance_cannot_give_as_many() -> None:
    with pytest.raises(
        diagnosis.Finding, match=r"^the evaluation dataset was made from training rows: 8 of the 9 rows"
    ):
        overlap.judge(found(8, 9), evaluated())


def test_the_chance_of_natural_repeats_is_the_binomial_tail() -> None:
    assert overlap.chance(0, 10) == 1.0
    assert overlap.chance(1, 1, rate=0.1) == pytest.approx(0.1)
    assert overlap.chance(2, 2, rate=0.1) == pytest.approx(0.01)
    assert overlap.chance(1, 2, rate=0.1) == pytest.approx(1 - 0.9**2)
    assert overlap.chance(3, 13) == pytest.approx(0.1339, abs=1e-4)
    assert overlap.chance(2000, 10_000) < 1e-100  # a million-row split is summed without overflow


def test_a_few_rows_of_a_small_split_are_a_note_whatever_their_share() -> None:
    notes = overlap.judge(found(2, 5), evaluated(("load_best_model_at_end",)))
    assert notes[0].endswith(": natural repeats, too few to sway its metrics")


@pytest.mark.parametrize(
    ("result", "given", "what"),
    [
        (found(0, 0), True, "the evaluation dataset is the training dataset"),
        (found(1000, 1000), False, "the evaluation dataset is the training dataset"),
        (
            found(50, 50),
            False,
            "every one of the 50 rows of the evaluation dataset is a training row (the training split or a "
            "selection of it)",
        ),
    ],
    ids=["same-object", "same-rows", "selection"],
)
def test_the_training_split_evaluated_fails_only_where_a_setting_acts(
    result: overlap.Overlap, given: bool, what: str
) -> None:
    notes = overlap.judge(result, evaluated(), given)
    assert notes == [
        f"evaluation: {what}: its metrics measure how well the model fits its training rows, not rows it has not seen"
    ]
    with pytest.raises(diagnosis.Finding) as raised:
        overlap.judge(result, evaluated(("load_best_model_at_end", "EarlyStoppingCallback")), given)
    assert raised.value.cause.startswith(
        f"{what}, and load_best_model_at_end, EarlyStoppingCallback act on its metrics, which measure how well the "
        "model fits the rows it trains on: overfitting looks like progress there"
    )
    assert raised.value.fix.startswith(
        "evaluate on rows held out of training: split the data before training, e.g. parts = data.train_test_split("
    )


def test_conflicting_labels_are_a_note_the_summary_shows_when_many() -> None:
    few = overlap.judge(found(0, 100, conflicting=3), evaluated(("load_best_model_at_end",)))
    assert few == [
        "3 of the 100 rows of the evaluation dataset (3%) have the input of a training row under other label (e.g. "
        "evaluation row 0 = training row 0; evaluation row 1 = training row 1; evaluation row 2 = training row 2): "
        "not rows the model trained on, since it learns other targets for those inputs than it is scored against"
    ]
    many = overlap.judge(found(0, 50, conflicting=43), evaluated(("load_best_model_at_end",)))
    assert len(many) == 1 and many[0].startswith("evaluation: 43 of the 50 rows of the evaluation dataset (86%) have ")


def test_inputs_labelled_several_times_are_a_note_even_where_many_agree() -> None:
    """Raters who agree repeat a training row with its label; those who disagree give the same input other labels."""
    notes = overlap.judge(found(33, 50, conflicting=15), evaluated(("load_best_model_at_end",)))
    assert len(notes) == 1
    assert notes[0].startswith(
        "evaluation: 48 of the 50 rows of the evaluation dataset (96%) have the input of a training row, 33 with its "
        "label and 15 under others (e.g. evaluation row 0 = training row 0; "
    )
    assert notes[0].endswith(
        "): the data labels its inputs several times (several raters or annotators) and was split by row, so its "
        "metrics score inputs the model has trained on; to score unseen inputs, split by input (every row of an "
        "input on the same side)"
    )
    with pytest.raises(diagnosis.Finding, match="made from training rows"):
        overlap.judge(found(33, 50, conflicting=5), evaluated())  # copies, and a few labels that differ


def test_conflicting_labels_stay_beside_a_finding() -> None:
    with pytest.raises(diagnosis.Finding) as raised:
        overlap.judge(found(40, 80, conflicting=10), evaluated())
    assert raised.value.details[-1].startswith("also: evaluation: 10 of the 80 rows of the evaluation dataset (12%)")


def test_columns_are_read_from_arrow_as_numbers_or_lists_of_them() -> None:
    import pyarrow as pa

    assert [overlap._kind(kind) for kind in (pa.list_(pa.int32()), pa.list_(pa.float32()), pa.int64(), pa.bool_())] == [
        "integers",
        "numbers",
        "number",
        "number",
    ]
    assert overlap._kind(pa.string()) is None and overlap._kind(pa.list_(pa.list_(pa.int64()))) is None
    ids = overlap._column(pa.array([[1, 2], [3], [1, 2]]).slice(1), listed=True)
    assert ids is not None and ids.row(0).tolist() == [3] and ids.row(1).tolist() == [1, 2]
    scores = overlap._column(pa.array([0.5, 2.0], pa.float32()), listed=False)
    assert scores is not None and not scores.listed and scores.hashes[1] == overlap.rows_of([2]).hashes[0]
    assert overlap._column(pa.array([1, None]), listed=False) is None
    assert overlap._column(pa.array([[1, None]]), listed=True) is None
