"""What the model is trained on against what it will be asked (`pytest_trainer.asked`), on rows built by hand.

Pinned: `rows_of` reads a collated batch into its sequences (padding left out, the prompt a completion mask or the
dataset marks, packed rows cut where position_ids restart, a padding tail no sequence); which rows answer a prompt, and
the length they are cut at; the checks of the `targets` stage that read no chat template, each failing on a broken set
of rows and silent on the correct one: answers that do not end on a stop token or that truncation cuts (at their end or at their start), end-of-sequence tokens
of plain texts never trained, preference pairs the same once truncated. The checks that render the chat template
(the prompt as asked, turns and reasoning the template drops) run on real tokenizers in tests/e2e/test_asked.py; the
targets stage's own checks are in tests/unit/test_targets.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from subjects import BOS, END_OF_TURN, EOS, PAD, answer, asked, batch, row, text_row

from pytest_trainer import diagnosis
from pytest_trainer.asked import checks, pairs
from pytest_trainer.asked.view import Asked, Row, rows_of
from pytest_trainer.tasks import IGNORE_INDEX as X

# ---- rows_of: a collated batch read into its sequences ---------------------------------------------------------


def test_rows_leave_padding_out_and_never_train_the_first_position() -> None:
    found = rows_of(
        batch(input_ids=[[5, 6, 7, PAD], [8, 9, PAD, PAD]], labels=[[5, 6, 7, X], [8, 9, X, X]],
              attention_mask=[[1, 1, 1, 0], [1, 1, 0, 0]]),
        [{}, {}],
        [{"text": "a"}, {"text": "b"}],
    )  # fmt: skip
    assert [found_row.ids.tolist() for found_row in found] == [[5, 6, 7], [8, 9]]
    assert found[0].trained.tolist() == [False, True, True]
    assert found[1].stored == {"text": "b"}
    assert not found[0].packed and found[0].delimited


def test_a_completion_mask_marks_the_prompt() -> None:
    found = rows_of(
        batch(input_ids=[[5, 6, 7, 8]], labels=[[5, 6, 7, 8]], completion_mask=[[0, 0, 1, 1]]), [{}], [None]
    )
    assert found[0].prompt is not None
    assert found[0].prompt.tolist() == [True, True, False, False]
    assert found[0].masked_by == "completion_mask"


def test_labels_the_dataset_sets_to_ignore_mark_the_prompt_after_left_padding() -> None:
    sample = {"input_ids": [5, 6, 7], "labels": [X, X, 7]}
    found = rows_of(
        batch(input_ids=[[PAD, 5, 6, 7]], labels=[[X, 5, 6, 7]], attention_mask=[[0, 1, 1, 1]]), [sample], [None]
    )
    assert found[0].masked_by == "labels"
    assert found[0].prompt is not None
    assert found[0].prompt.tolist() == [True, True, False]


def test_a_collator_that_changed_the_tokens_gives_no_prompt_from_the_dataset() -> None:
    sample = {"input_ids": [5, 6, 7, 8, 9], "labels": [X, X, 7, 8, 9]}  # truncated by the collator below
    found = rows_of(batch(input_ids=[[5, 6, 7]], labels=[[5, 6, 7]]), [sample], [None])
    assert found[0].prompt is None and found[0].masked_by is None


def test_packed_rows_are_cut_where_position_ids_restart() -> None:
    found = rows_of(
        batch(input_ids=[[5, 6, 7, 8, 9]], labels=[[5, 6, 7, 8, 9]], position_ids=[[0, 1, 2, 0, 1]]),
        [{}, {}],
        [],
    )
    assert [found_row.ids.tolist() for found_row in found] == [[5, 6, 7], [8, 9]]
    assert all(found_row.packed and found_row.segment and found_row.delimited for found_row in found)
    assert all(found_row.stored is None for found_row in found)  # a packed row is no one stored sample


def test_a_packed_row_without_restarts_is_a_chunk_of_a_stream() -> None:
    found = rows_of(batch(input_ids=[[5, 6, 7, 8]], labels=[[5, 6, 7, 8]]), [{}, {}], [])
    assert len(found) == 1 and found[0].packed and not found[0].delimited and not found[0].segment


def test_a_packed_rows_padding_tail_is_not_a_sequence() -> None:
    """axolotl's multipack pads each packed row to its length and restarts position_ids on the padding too: the
    padding after the last sequence has no label, and no supervised token is missing from it (recorded shape)."""
    packed = batch(
        input_ids=[[5, 6, 7, 8, 9, 10, PAD, PAD]],
        labels=[[X, 6, 7, X, 9, 10, X, X]],
        position_ids=[[0, 1, 2, 0, 1, 2, 0, 1]],
    )
    found = rows_of(packed, [{}, {}], [], PAD)
    assert [found_row.ids.tolist() for found_row in found] == [[5, 6, 7], [8, 9, 10]]
    assert all(found_row.trained.any() for found_row in found)
    # Without the pad id, the tail is a third sequence, and nothing in it is trained.
    assert len(rows_of(packed, [{}, {}], [])) == 3


def test_a_batch_whose_labels_do_not_match_its_ids_gives_no_rows() -> None:
    assert rows_of(batch(input_ids=[[5, 6, 7]], labels=[[5, 6]]), [{}], []) == []
    assert rows_of({"input_ids": np.array([5, 6]), "labels": np.array([5, 6])}, [{}], []) == []


# ---- the view: answers, stop tokens, truncation -----------------------------------------------------------------


def test_a_row_knows_where_its_answer_ends_and_whether_a_prompt_comes_first() -> None:
    found = answer([5, 6, 7], [8, 9], end=(PAD,), trained_end=False)
    assert found.answer_end == 5 and found.has_prompt
    assert not text_row([5, 6, 7]).has_prompt
    assert row([5, 6], [X, X]).answer_end is None


def test_the_view_stops_at_the_tokenizer_eos_unless_it_is_given_the_model_s_stops() -> None:
    """`Asked.of` reads the model's stops (generation_config, config) end to end; the view falls back as generate does."""
    assert asked([]).stops == {EOS: "tokenizer.eos_token"}
    own = asked([], stops={END_OF_TURN: "generation_config.eos_token_id"})
    assert own.stops == {END_OF_TURN: "generation_config.eos_token_id"}
    assert Asked([]).stops == {}


def test_answers_are_the_rows_with_a_prompt_and_texts_are_not() -> None:
    qa, plain = answer([5, 6, 7], [8, 9]), text_row([5, 6, 7, EOS])
    assert asked([qa, plain]).answers == [qa]


def test_trl_packing_makes_chunks_whose_ends_are_no_answers_ends() -> None:
    chunk = answer([5, 6, 7], [8, 9])
    segment = answer([5, 6, 7], [8, 9])
    segment.segment = True
    assert asked([chunk, segment], packs_samples=True).answers == [segment]
    assert asked([chunk, segment]).answers == [chunk, segment]


def test_the_length_rows_are_cut_at_is_the_setting_else_what_the_rows_show() -> None:
    cut = [answer([5, 6, 7], [8, 9, 10], end=()), answer([5, 6], [8, 9, 10, 11], end=())]
    assert asked(cut, truncates_at=64).max_length == 64
    assert asked(cut).max_length == 6  # two answers cut off open at one same longest length
    assert asked(cut[:1]).max_length is None  # one is no pattern
    assert asked([answer([5, 6], [8, 9]), answer([5, 6, 7], [8])]).max_length is None  # they end on eos


# ---- targets: a doubled BOS ------------------------------------------------------------------------------------


def test_rows_that_begin_with_two_bos_tokens_fail() -> None:
    doubled = [answer([BOS, BOS, 5], [6]), answer([BOS, BOS, 7], [8])]
    with pytest.raises(diagnosis.Finding, match=r"2 of 2 sampled rows begin with '1' twice"):
        checks.check_doubled_bos(asked(doubled))


def test_rows_that_begin_with_one_bos_pass_and_a_few_doubled_are_no_defect() -> None:
    checks.check_doubled_bos(asked([answer([BOS, 5], [6]), answer([BOS, 7], [8])]))
    checks.check_doubled_bos(asked([answer([BOS, BOS, 5], [6]), *[answer([BOS, 7], [8])] * 3]))
    checks.check_doubled_bos(asked([answer([BOS, BOS, 5], [6])], bos=None))  # no BOS token: nothing to tell


# ---- targets: how the answers end ------------------------------------------------------------------------------


def test_answers_that_end_on_a_trained_stop_token_pass_and_are_counted() -> None:
    notes: list[str] = []
    assert checks.check_answer_ends(asked([answer([5, 6], [7, 8]), answer([5, 6], [9])]), notes) == (2, 2)
    assert notes == []


def test_an_end_token_that_follows_the_answers_untrained_as_padding_names_a_pad_token_of_its_own() -> None:
    rows = [answer([5, 6], [7, 8], trained_end=False), answer([5, 6], [9], trained_end=False)]
    with pytest.raises(diagnosis.Finding, match=r"2 of 2 sampled answers are followed by '2' but it carries no label"):
        checks.check_answer_ends(asked(rows, pad=EOS), [])
    with pytest.raises(diagnosis.Finding) as found:
        checks.check_answer_ends(asked(rows, pad=EOS), [])
    assert "pad token of its own" in found.value.fix


def test_an_untrained_end_token_is_fixed_where_the_rows_mask_it() -> None:
    def rows(masked_by: str | None) -> list[Row]:
        made = [answer([5, 6], [7, 8], trained_end=False), answer([5, 6], [9], trained_end=False)]
        for made_row in made:
            made_row.masked_by = masked_by
        return made

    fixes = {}
    for masked_by in ("completion_mask", "assistant_masks", None):
        with pytest.raises(diagnosis.Finding) as found:
            checks.check_answer_ends(asked(rows(masked_by)), [])
        fixes[masked_by] = found.value.fix
    assert fixes["completion_mask"].startswith("end each completion with '2'")
    assert "{% generation %}" in fixes["assistant_masks"]
    assert fixes[None].startswith("keep the label of '2'")


def test_answers_with_no_end_token_never_learn_to_stop() -> None:
    rows = [answer([5, 6], [7, 8], end=()), answer([5, 6], [9, 10], end=(PAD,), trained_end=False)]
    with pytest.raises(diagnosis.Finding, match=r"2 of 2 sampled answers end on .* the model never learns to stop"):
        checks.check_answer_ends(asked(rows, truncates_at=64), [])


def test_answers_that_end_on_an_end_token_generation_does_not_stop_at_name_the_generation_config() -> None:
    rows = [answer([5, 6], [7, 8], end=(EOS,)), answer([5, 6], [9], end=(EOS,))]
    stops = {END_OF_TURN: "generation_config.eos_token_id"}
    with pytest.raises(diagnosis.Finding, match=r"2 of 2 sampled answers end with '2', but generation stops at '3'"):
        checks.check_answer_ends(asked(rows, stops=stops), [])
    with pytest.raises(diagnosis.Finding) as found:
        checks.check_answer_ends(asked(rows, stops=stops), [])
    assert "generation_config.eos_token_id = [3, 2]" in found.value.fix


def test_a_few_answers_without_an_end_are_no_defect() -> None:
    rows = [answer([5, 6], [7, 8], end=()), *[answer([5, 6], [9])] * 3]
    assert checks.check_answer_ends(asked(rows, truncates_at=64), []) == (4, 3)


def test_answers_cut_by_truncation_name_the_setting_and_a_few_are_a_note() -> None:
    many = [answer([5, 6], [7, 8, 9], end=()), answer([5, 6], [7, 8, 10], end=()), answer([5, 6], [9])]
    with pytest.raises(diagnosis.Finding, match=r"2 of 3 sampled answers are cut by cutoff_len=5 before their end"):
        checks.check_answer_ends(asked(many, truncates_at=5, length_setting="cutoff_len"), [])
    notes: list[str] = []
    few = [many[0], *[answer([5, 6], [9])] * 4]
    assert checks.check_answer_ends(asked(few, truncates_at=5), notes) == (5, 4)
    assert notes == ["1 of 5 sampled answers are cut by max_length=5 before their end"]


def test_rows_cut_at_their_start_lose_the_question() -> None:
    """truncation_mode="keep_end": the answer is whole, the row no longer begins with the first token of the others."""
    whole = [answer([BOS, 5, 6], [7]), answer([BOS, 5, 8], [9]), answer([BOS, 6, 7], [8])]
    cut = [answer([6, 5, 6, 6], [7]), answer([5, 6, 6, 5], [9])]  # 6 tokens: cut at max_length=6
    with pytest.raises(diagnosis.Finding, match=r"2 of 5 sampled rows are cut by max_length=6 at their start"):
        checks.check_answer_ends(asked([*whole, *cut], truncates_at=6), [])
    checks.check_answer_ends(asked([*whole, *cut], truncates_at=64), [])


# ---- targets: end-of-sequence tokens of plain texts ------------------------------------------------------------


def texts(eos_trained: bool) -> list[Row]:
    return [
        text_row([5, 6, 7, EOS, PAD], [True, True, True, eos_trained, False]),
        text_row([8, 9, EOS], [True, True, eos_trained]),
    ]


def test_end_tokens_of_texts_never_trained_fail_and_name_the_pad_token_when_it_is_the_eos() -> None:
    with pytest.raises(diagnosis.Finding, match=r"0 of 2 '2' tokens in 2 sampled rows") as found:
        checks.check_eos_of_texts(asked(texts(eos_trained=False), pad=EOS))
    assert "pad token of its own" in found.value.fix
    with pytest.raises(diagnosis.Finding) as found:
        checks.check_eos_of_texts(asked(texts(eos_trained=False)))
    assert found.value.fix.startswith("keep the label of each text's final '2'")


def test_end_tokens_of_texts_trained_pass_and_are_counted() -> None:
    assert checks.check_eos_of_texts(asked(texts(eos_trained=True))) == (2, 2)
    assert checks.check_eos_of_texts(asked([text_row([5, 6, 7])])) == (0, 0)  # texts without an end token


# ---- targets: preference pairs ---------------------------------------------------------------------------------


def test_pairs_are_read_from_stacked_rows_and_from_keys_side_by_side() -> None:
    """TRL 1.x stacks every chosen row above every rejected row with a completion_mask; older TRL and reward
    trainers put chosen and rejected side by side (recorded shapes)."""
    ids = np.array([[5, 6, 7, 0], [5, 8, 9, 9], [5, 6, 7, 0], [5, 8, 9, 4]])
    completion = np.array([[0, 1, 1, 0], [0, 1, 1, 1], [0, 1, 1, 0], [0, 1, 1, 1]])
    stacked = pairs.answers({"input_ids": ids, "completion_mask": completion}, 2)
    assert stacked == [([6, 7], [6, 7]), ([8, 9, 9], [8, 9, 4])]
    side = pairs.answers(
        {
            "input_ids_chosen": ids[:2],
            "input_ids_rejected": ids[2:],
            "attention_mask_chosen": np.ones_like(ids[:2]),
            "attention_mask_rejected": np.ones_like(ids[2:]),
        },
        2,
    )
    assert side == [([5, 6, 7, 0], [5, 6, 7, 0]), ([5, 8, 9, 9], [5, 8, 9, 4])]
    assert pairs.answers({"input_ids": ids}, 3) == []  # rows that are not two per sample: no pairs to read


def stored_pair(chosen: list[int], rejected: list[int]) -> dict[str, list[int]]:
    return {"prompt_ids": [5], "chosen_ids": chosen, "rejected_ids": rejected}


def test_pairs_cut_before_they_differ_fail_naming_the_length_that_keeps_them_apart() -> None:
    found = [([6, 7], [6, 7], stored_pair([6, 7, 1], [6, 7, 2])), ([8, 9], [8, 4], stored_pair([8, 9], [8, 4]))]
    with pytest.raises(
        diagnosis.Finding,
        match=r"1 of 2 sampled preference pairs have the same chosen and rejected tokens "
        r"once cut at max_length=3: they first differ at token 3 to 3",
    ) as failed:
        pairs.check_pairs_differ(found, 3, str, [])
    assert failed.value.fix.startswith("raise max_length to at least 4")


def test_pairs_the_same_as_stored_are_named_as_such() -> None:
    found = [([6, 7], [6, 7], stored_pair([6, 7], [6, 7]))] * 2
    with pytest.raises(diagnosis.Finding, match=r"2 of 2 .* as stored") as failed:
        pairs.check_pairs_differ(found, 3, str, [])
    assert failed.value.fix.startswith("drop the pairs")


def test_pairs_that_differ_pass_and_a_few_the_same_are_a_note() -> None:
    notes: list[str] = []
    differ = ([8, 9], [8, 4], stored_pair([8, 9], [8, 4]))
    pairs.check_pairs_differ([differ], 3, str, notes)
    assert notes == ["1 of 1 sampled preference pairs differ once truncated"]
    notes.clear()
    pairs.check_pairs_differ([([6], [6], stored_pair([6], [6])), *[differ] * 4], 3, str, notes)
    assert notes[-1] == "1 of 5 sampled preference pairs have the same chosen and rejected tokens as stored"
