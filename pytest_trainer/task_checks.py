"""Checks of the fed data that belong to one task, each registered under the labels it applies to.

The `dataset` and `eval` stages run, for each split, the checks of the pipeline's task: class names in the dataset's
order, token labels aligned with the tokens, seq2seq targets padded with -100, answer spans inside their sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_trainer import diagnosis, embeddings, model_facts, tables, tasks
from pytest_trainer.catalogue import MODEL, SPLIT, checks, message
from pytest_trainer.tasks import IGNORE_INDEX

if TYPE_CHECKING:
    from pytest_trainer.fed_data import FedSplit
    from pytest_trainer.pipeline import Pipeline


@checks("dataset", "eval", reads=SPLIT)
def check_target_padding(pipeline: Pipeline, split: FedSplit) -> None:
    """Seq2seq targets padded with the pad id, not -100, train the model to write padding."""
    table = split.table
    column = pipeline.label_column(table)
    if column is None:
        return
    if tables.depth(table.schema.field(column).type) != 1:
        return
    values, row_of = tables.flatten(table, column)
    counts, _ = tables.lengths(table, column)
    shared, pad = target_ends(pipeline)
    found = padded_targets(values, pad, shared, np.cumsum(counts))
    if found is not None:
        index, count = found
        where = f"row {split.row(row_of(index))} of the {split.description} dataset"
        if shared:
            where += ", after its end token,"
        raise pad_in_targets(values[index], count, where)


@checks("dataset", "eval", reads=SPLIT)
def check_answer_positions(pipeline: Pipeline, split: FedSplit) -> None:
    """Answer spans inside their sequence: the QA loss silently ignores a position past the end."""
    table, sequence = split.table, pipeline.task.sequence
    names = ("start_positions", "end_positions")
    if sequence is None or sequence not in table.column_names or not all(name in table.column_names for name in names):
        return
    lengths = tables.row_lengths(table, sequence)
    starts, _ = tables.flatten(table, names[0])
    ends, _ = tables.flatten(table, names[1])
    if starts.shape != lengths.shape or ends.shape != lengths.shape:
        return
    outside = np.flatnonzero((starts >= lengths) | (ends >= lengths) | (starts < 0) | (ends < 0))
    reversed_span = np.flatnonzero(starts > ends)
    if outside.size:
        row = int(outside[0])
        named = split.row(row)
        raise diagnosis.Finding(
            f"row {named} of the {split.description} dataset has an answer span {int(starts[row])}..{int(ends[row])} "
            f"outside its {int(lengths[row])} tokens ({outside.size} rows in all): the loss ignores such positions, "
            "so those answers are never learned",
            "compute start_positions and end_positions on the tokenized sequence (offset_mapping), and point "
            "answers cut off by truncation at the [CLS] position 0, as the question-answering example does",
        )
    if reversed_span.size:
        row = int(reversed_span[0])
        named = split.row(row)
        raise diagnosis.Finding(
            f"row {named} of the {split.description} dataset has an answer that ends ({int(ends[row])}) before it "
            f"starts ({int(starts[row])}) ({reversed_span.size} rows in all): a span of tokens start..end "
            "inclusive that selects nothing, so those rows train no answer",
            "find the end as the last token whose offset_mapping ends at or after the answer's last character "
            "(answer_start + len(text)), scanning back from the context's end, and the start as the first token whose "
            "offset starts at or before answer_start; a one-token answer has start == end, and a start one past "
            "the end, as here, comes of a search loop that steps once too far: keep the `- 1` of "
            "start_positions.append(idx - 1) and the `+ 1` of end_positions.append(idx + 1) after their loops"
            if int(starts[row]) - int(ends[row]) == 1
            else "find the end as the last token whose offset_mapping ends at or after the answer's last character "
            "(answer_start + len(text)), and the start as the first token whose offset starts at or before "
            "answer_start, both among the context's tokens",
        )
    check_answer_places(pipeline, split, starts, ends)


#: Rows from which every answer at position 0 (the "no answer" convention) says the answers were never found.
MIN_QA_ROWS = 8
#: Share of the answered rows whose span lies in the question, or reads otherwise than the stored answer text, from
#: which the spans were computed wrongly (a correct pipeline has none: a few are allowed for odd tokenizations).
MISPLACED = 0.1
MIN_MISPLACED = 2
#: Answered rows read as Python values (their token ids, segments and answer texts).
QA_ROWS = 512
#: Columns that may still hold the answer text (SQuAD's `answers`, with its `text` list).
ANSWER_COLUMNS = ("answers", "answer", "answer_text")


@checks("dataset", "eval", reads=SPLIT)
def check_answer_places(pipeline: Pipeline, split: FedSplit, starts: np.ndarray, ends: np.ndarray) -> None:
    """Answer spans point at the answer: not every one at position 0 (the "no answer" convention), not into the
    question (token_type_ids 0), and, where the answer text is still in the data, at tokens that read as it."""
    table, description = split.table, split.description
    answered = np.flatnonzero((starts != 0) | (ends != 0))
    if starts.size >= MIN_QA_ROWS and answered.size == 0:
        raise diagnosis.Finding(
            f"every one of the {starts.size} {description} answers is at position 0, the 'no answer' convention "
            "([CLS]): the answers were never found in the tokenized context, so the model learns to answer nothing",
            "find each answer's tokens from its character offsets: the context tokens (sequence_ids(i) == 1) whose "
            "offset_mapping covers answers['answer_start'] .. + len(text); position 0 only where truncation cut it",
        )
    if not answered.size:
        return
    tokenizer = getattr(pipeline.trainer, "processing_class", None)
    read = [int(row) for row in answered[:QA_ROWS]]  # the rows read as Python values: the first answered ones

    def values(name: str) -> dict[int, Any]:
        return dict(zip(read, table.column(name).take(read).to_pylist(), strict=True))

    ids = values(pipeline.task.sequence) if pipeline.task.sequence else None

    def decoded(row: int) -> str | None:
        try:
            return str(tokenizer.decode(ids[row][int(starts[row]) : int(ends[row]) + 1]))  # type: ignore[index,union-attr]
        except Exception:  # a processor without a decode, or one that cannot read these ids
            return None

    def shown(row: int) -> str:
        text = decoded(row) if tokenizer is not None and ids is not None else None
        return f" ({text!r})" if text is not None else ""

    def misplaced(rows: list[int], where: str, fix: str) -> None:
        if len(rows) >= max(MIN_MISPLACED, MISPLACED * len(read)):
            row = rows[0]
            raise diagnosis.Finding(
                f"the answer spans of {len(rows)} of the {len(read)} answered rows read (of the {description} dataset) "
                f"{where}: row {split.row(row)} points at {int(starts[row])}..{int(ends[row])}{shown(row)}",
                fix,
            )

    readable = tokenizer is not None and ids is not None
    stored_rows = _stored_rows(pipeline, split, read, ids, tokenizer) if readable and ids is not None else {}
    types = values("token_type_ids") if "token_type_ids" in table.column_names else None
    sep = getattr(tokenizer, "sep_token_id", None)
    pairs = {row: _segments(ids[row], types[row] if types else None, sep) for row in read} if ids else {}
    found = {row: pair for row, pair in pairs.items() if pair is not None}
    if found:
        # The question is the sequence that reads as the stored question; without one, the shorter sequence of the
        # pairs (the context may come first, as the script pairs them) where it is clearly shorter.
        question = _question_side(found, stored_rows, ids, tokenizer) if stored_rows and ids is not None else None
        if question is None and not stored_rows:
            first = float(np.mean([len(pair[0]) for pair in found.values()]))
            second = float(np.mean([len(pair[1]) for pair in found.values()]))
            question = 0 if first * QUESTION_SHORTER <= second else 1 if second * QUESTION_SHORTER <= first else None
        if question is not None:
            in_question = [row for row, pair in found.items() if int(starts[row]) in pair[question]]
            told = "the one that reads as the stored question" if stored_rows else "the shorter"
            misplaced(
                in_question,
                f"lie in the question (the {('first', 'second')[question]} sequence of each pair, {told}), not "
                "in the context",
                "find the answer among the context's tokens (where the encoding's sequence_ids(i) is the context's), "
                "with offset_mapping",
            )
    if not readable:
        return
    stored = getattr(split.given, "column_names", None) or []
    column = next((name for name in ANSWER_COLUMNS if name in table.column_names or name in stored), None)
    if column is not None and column in table.column_names:
        texts = {row: _answer_text(value) for row, value in values(column).items()}
    elif column is not None and not split.transformed:  # dropped by the Trainer as no input: read where it is stored
        stored_answers = split.given.select([split.row(row) for row in read])[column]
        texts = {row: _answer_text(value) for row, value in zip(read, stored_answers, strict=True)}
    else:  # dropped by the script's map(): read in the dataset it mapped, where its rows are these
        column = next((name for name in ANSWER_COLUMNS for values_ in stored_rows.values() if name in values_), None)
        if column is None:
            return
        texts = {row: _answer_text(values_.get(column)) for row, values_ in stored_rows.items()}
    spans = {row: decoded(row) for row in read if texts.get(row)}
    other = [row for row, span in spans.items() if span is not None and _plain(span) != _plain(texts[row])]
    misplaced(
        other,
        f"read otherwise than their answer text in {column!r} (the first one's is {texts[other[0]]!r})"
        if other
        else "",
        "compute start_positions and end_positions from the answer's character offsets against the context's "
        "offset_mapping (the token where the answer starts, the token where it ends), not from word or character "
        "counts",
    )


def _stored_rows(
    pipeline: Pipeline, split: FedSplit, read: list[int], ids: dict[int, Any], tokenizer: Any
) -> dict[int, dict[str, Any]]:
    """The stored question (and answers) of each row `read`: from the split as stored, or from the dataset the script's
    map() made it from and dropped them (kept by the script runner: `Pipeline.sources`). Only rows whose stored
    question reads in their tokens are taken as the same rows; {} where not half of them do."""
    count = len(split.given) if hasattr(split.given, "__len__") else -1
    candidates = [] if split.transformed else [split.given]
    candidates += [source for source in pipeline.sources if source is not split.given and len(source) == count]
    for source in candidates:
        names = getattr(source, "column_names", None) or []
        if "question" not in names:
            continue
        columns = ["question", *[name for name in ANSWER_COLUMNS if name in names][:1]]
        try:  # a dataset the plugin only looks into: what it cannot read is no failure of the pipeline
            rows = source.select([split.row(row) for row in read]).select_columns(columns).to_list()
        except Exception:
            continue
        verified: dict[int, dict[str, Any]] = {}
        for row, stored in zip(read, rows, strict=True):
            try:
                fed = _plain(str(tokenizer.decode(ids[row])))
            except Exception:  # a tokenizer that cannot read these ids back: nothing is compared
                return {}
            question = _plain(str(stored["question"] or ""))
            if question and question in fed:
                verified[row] = stored
        if verified and len(verified) >= len(read) / 2:
            return verified
    return {}


def _question_side(
    found: dict[int, tuple[range, range]], stored: dict[int, dict[str, Any]], ids: dict[int, Any], tokenizer: Any
) -> int | None:
    """Which sequence of the pairs (0 or 1) reads as the stored question, in most rows that have one; None where
    none does."""
    votes = [0, 0]
    for row, values_ in stored.items():
        pair = found.get(row)
        if pair is None:
            continue
        question = _plain(str(values_.get("question") or ""))
        for side in (0, 1):
            try:
                text = _plain(
                    str(tokenizer.decode([ids[row][index] for index in pair[side]], skip_special_tokens=True))
                )
            except Exception:
                return None
            if text and (text == question or (len(text) >= len(question) / 2 and text in question)):
                votes[side] += 1
    if votes[0] == votes[1]:
        return None
    return 0 if votes[0] > votes[1] else 1


#: Without a stored question to read, the question is told from the context as the sequence of each pair this many
#: times shorter on average (a SQuAD question is about a tenth of its context; questions as long are left alone).
QUESTION_SHORTER = 2


def _segments(ids: list[int], types: list[int] | None, sep: int | None) -> tuple[range, range] | None:
    """The positions of the first and second sequence of a question-context pair: by token_type_ids, else between
    the separator tokens ([CLS] q [SEP] c [SEP], <s> q </s></s> c </s>); None where the row is no pair."""
    if types is not None and len(types) == len(ids) and 1 in types:
        second = [index for index, kind in enumerate(types) if kind == 1]
        return range(1, second[0]), range(second[0], second[-1] + 1)
    if sep is None:
        return None
    seps = [index for index, token in enumerate(ids) if token == sep]
    if len(seps) < 2:
        return None
    start = seps[0] + 1
    while start < len(ids) and ids[start] == sep:
        start += 1
    end = next((index for index in seps if index >= start), len(ids))
    return range(1, seps[0]), range(start, end)


def _answer_text(value: Any) -> str:
    """The first answer text of a SQuAD-style `answers` value, or a plain answer string."""
    if isinstance(value, dict):
        value = value.get("text")
    if isinstance(value, list):
        value = value[0] if value else ""
    return value if isinstance(value, str) else ""


def _plain(text: str) -> str:
    return "".join(character for character in text.lower() if character.isalnum())


def target_ends(pipeline: Pipeline) -> tuple[bool, int | None]:
    """(whether the pad id is also a real end of a target, the pad id) as the tokenizer or else the model says.

    A processor (feature extractor + tokenizer, as for Whisper) holds its tokenizer in `.tokenizer`; without a
    pad id there, the model's config (or its generation config) has one, beside its end-of-sequence id.
    """
    given = getattr(pipeline.trainer, "processing_class", None)
    tokenizer = getattr(given, "tokenizer", None) or given
    config = getattr(pipeline.model, "config", None)
    generation = getattr(pipeline.model, "generation_config", None)
    sources = (tokenizer, config, generation)
    pad = next((found for source in sources if isinstance(found := getattr(source, "pad_token_id", None), int)), None)
    ends: set[int] = set()
    for source in sources:
        for name in ("eos_token_id", "bos_token_id"):
            found = getattr(source, name, None)
            ends.update(
                item for item in (found if isinstance(found, (list, tuple)) else [found]) if isinstance(item, int)
            )
    return pad in ends, pad


def padded_targets(
    values: np.ndarray, pad: int | None, shared: bool, ends: np.ndarray | None = None
) -> tuple[int, int] | None:
    """(first index, count) of the target positions that hold the pad id `pad` as padding, or None.

    Where the pad id is no real target, every position holding it is padding. Where it is also the end
    (or start) token (`shared`), as with Whisper's `<|endoftext|>`, one supervised end token per row is correct and
    padding is the run after it: only a pad id right after another one counts. Rows are those of a 2-D
    `values`, or end at the cumulative lengths `ends` of a flat one; a flat one without `ends` is taken
    as one sequence (`target_ends` gives `shared` and `pad` as the pipeline's tokenizer and model say).
    """
    if pad is None or values.dtype.kind not in "iu":
        return None
    flat = values.reshape(-1)
    hits = flat == pad
    if shared:
        hits[1:] &= hits[:-1].copy()
        hits[:1] = False
        if values.ndim > 1 and values.shape[-1]:
            hits.reshape(-1, values.shape[-1])[:, 0] = False  # a run does not go on from one row to the next
        elif ends is not None and ends.size > 1:
            starts = ends[:-1][ends[:-1] < flat.size]
            hits[starts] = False
    found = np.flatnonzero(hits)
    return (int(found[0]), int(found.size)) if found.size else None


@checks("dataset", "eval", reads=SPLIT)
def check_token_labels(pipeline: Pipeline, split: FedSplit) -> None:
    """In token classification, one label per token, and -100 on [CLS], [SEP] and padding."""
    table, description = split.table, split.description
    column = pipeline.label_column(table)
    model_input = pipeline.task.sequence
    if column is None or model_input is None or model_input not in table.column_names:
        return
    token_counts, _ = tables.lengths(table, model_input)
    label_counts, _ = tables.lengths(table, column)
    if token_counts.shape == label_counts.shape and (token_counts != label_counts).any():
        row = int(np.argmax(token_counts != label_counts))
        named = split.row(row)
        raise diagnosis.PipelineFailure(
            f"row {named} of the {description} dataset has {label_counts[row]} labels for {token_counts[row]} tokens: "
            "token-classification labels must be aligned with the tokens, not with the words",
            "align the labels with the tokens: use encoding.word_ids() to give each token its word's label "
            "(or -100), as in the token-classification example",
        )
    tokenizer = getattr(pipeline.trainer, "processing_class", None)
    special = getattr(tokenizer, "all_special_ids", None)
    if tokenizer is None or not special:
        return
    ids, row_of = tables.flatten(table, model_input)
    labels, _ = tables.flatten(table, column)
    if ids.shape != labels.shape:
        return
    wrong = np.flatnonzero(np.isin(ids, special) & (labels != IGNORE_INDEX))

    def special_labels() -> None:
        if wrong.size:
            index = int(wrong[0])
            token = tokenizer.convert_ids_to_tokens(int(ids[index]))
            named = split.row(row_of(index))
            raise diagnosis.Finding(
                f"positions of {token} carry label {labels[index]} (row {named} of the {description} dataset, "
                f"{wrong.size} special-token positions in all)",
                f"set the labels of special tokens to -100 so the loss ignores them (word_ids() is None for {token})",
            )

    # Both are told: labels shifted by a position put one on [CLS] and others off their words' first tokens.
    stored = _stored_word_ids(pipeline, split, tokenizer, table, model_input)
    diagnosis.findings_last(
        [special_labels, lambda: check_word_starts(split, tokenizer, table, model_input, column, stored)]
    )


#: Rows whose words are read back (the tokenizer runs on each).
WORD_ROWS = 64
#: Words of several tokens whose first token is unlabeled while a later one is labeled, from which labels are said
#: to sit off their words: a share of such words, and a count.
OFF_WORDS = 0.5
MIN_OFF_WORDS = 5
#: Rows read back whose words' labels were written into token positions in turn (as many labels as words, some on a
#: word's later tokens, the last words without one), from which the labels are said to be placed so: a share of the
#: rows with a word of several tokens (only they can show it: in the others, token i is word i), and a count.
BY_POSITION = 0.5
MIN_BY_POSITION = 3


def _stored_word_ids(
    pipeline: Pipeline, split: FedSplit, tokenizer: Any, table: Any, model_input: str
) -> dict[int, list[int | None]]:
    """Each of the first WORD_ROWS rows' word_ids, from the words it was made from: a column of lists of words, in
    the split as stored or in the dataset the script's map() made it from, that the tokenizer turns (words given as
    split, truncated to the row's length) into exactly the row's ids. {} where no column does for half the rows."""
    rows = min(table.num_rows, WORD_ROWS)
    if not rows or not getattr(tokenizer, "is_fast", False):
        return {}
    fed = table.column(model_input).slice(0, rows).to_pylist()
    count = len(split.given) if hasattr(split.given, "__len__") else -1
    candidates = [] if split.transformed else [split.given]
    candidates += [source for source in pipeline.sources if source is not split.given and len(source) == count]
    for source in candidates:
        features = getattr(source, "features", None) or {}
        listed = [
            name
            for name, feature in features.items()
            if type(feature).__name__ in ("Sequence", "List", "LargeList")
            and getattr(getattr(feature, "feature", None), "dtype", None) in ("string", "large_string")
        ]
        for name in listed:
            try:  # a dataset the plugin only looks into: what it cannot read is no failure of the pipeline
                stored = source.select([split.row(row) for row in range(rows)])[name]
            except Exception:
                continue
            found: dict[int, list[int | None]] = {}
            for row, (ids, words) in enumerate(zip(fed, stored, strict=True)):
                if not ids or not words:
                    continue
                try:
                    encoded = tokenizer(words, is_split_into_words=True, truncation=True, max_length=len(ids))
                except Exception:  # a tokenizer that cannot take words given as split
                    break
                if encoded["input_ids"] == ids:
                    found[row] = encoded.word_ids()
            if found and len(found) >= rows / 2:
                return found
    return {}


@checks("dataset", "eval", reads=SPLIT)
def check_word_starts(
    split: FedSplit,
    tokenizer: Any,
    table: Any,
    model_input: str,
    column: str,
    stored: dict[int, list[int | None]] | None = None,
) -> None:
    """Word labels sit on a word's first token (or on every token of it), as word_ids() gives them: a word of several
    tokens whose first is -100 while a later one is labeled got its label by a position, shifted.

    The words are the stored ones where they are at hand (`stored`: each row's word_ids from its stored words, as the
    script tokenized them); else they are read back from the token ids: the row is decoded and tokenized again, and
    where that gives the same ids (most rows of a WordPiece or SentencePiece tokenizer), word_ids() tells each token's
    word."""
    if not getattr(tokenizer, "is_fast", False):
        return
    rows = min(table.num_rows, WORD_ROWS)
    ids_column = table.column(model_input).slice(0, rows).to_pylist()
    labels_column = table.column(column).slice(0, rows).to_pylist()
    several = off = read = split_words = by_position = 0
    example: tuple[int, list[str], list[int]] | None = None
    by_position_example: tuple[int, list[str], list[int]] | None = None
    for row, (ids, labels) in enumerate(zip(ids_column, labels_column, strict=True)):
        if not ids or labels is None or len(ids) != len(labels):
            continue
        real = [index for index, token in enumerate(ids) if token not in tokenizer.all_special_ids]
        words: dict[int, list[int]] = {}
        if stored and row in stored:
            for position, word in enumerate(stored[row]):
                if word is not None:
                    words.setdefault(word, []).append(position)
        else:
            try:
                again = tokenizer(tokenizer.decode(ids, skip_special_tokens=True), add_special_tokens=False)
            except Exception:  # a tokenizer that cannot read its own output back: the words stay unknown
                continue
            if again["input_ids"] != [ids[index] for index in real]:
                continue  # the round trip changed the tokens: the words cannot be read back
            for position, word in zip(real, again.word_ids(), strict=True):
                if word is not None:
                    words.setdefault(word, []).append(position)
        read += 1
        split_words += any(len(positions) > 1 for positions in words.values())
        labeled = {index for index in real if labels[index] != IGNORE_INDEX}
        unlabeled = [word for word, positions in words.items() if not labeled & set(positions)]
        inside = any(index in labeled for positions in words.values() for index in positions[1:])
        if len(labeled) == len(words) and unlabeled and inside:
            by_position += 1  # one label per word, but on the first tokens in turn: words at the end get none
            if by_position_example is None:
                tokens = tokenizer.convert_ids_to_tokens([ids[index] for index in real])
                by_position_example = (row, tokens, [labels[index] for index in real])
        for positions in words.values():
            if len(positions) < 2:
                continue
            several += 1
            if labels[positions[0]] == IGNORE_INDEX and any(labels[index] != IGNORE_INDEX for index in positions[1:]):
                off += 1
                if example is None:
                    tokens = tokenizer.convert_ids_to_tokens([ids[index] for index in positions])
                    example = (row, tokens, [labels[index] for index in positions])
    if by_position_example is not None and by_position >= max(MIN_BY_POSITION, BY_POSITION * split_words):
        row, tokens, given = by_position_example
        shown = ", ".join(f"{token!r}: {label}" for token, label in zip(tokens, given, strict=True))
        raise diagnosis.Finding(
            f"in {by_position} of the {split_words} rows read back with a word of several tokens (of the first {rows} "
            f"of the {split.description} dataset), each word's label sits on the row's tokens in turn, not on its "
            "words' tokens: as many labels as words, some on later tokens of a word while the last words get none (row "
            f"{split.row(row)}: {shown})",
            "give each token its word's label through the encoding's word_ids() (labels[word_id] at a word's first "
            "token, -100 elsewhere), not the word labels written into token positions",
        )
    if example is None or off < max(MIN_OFF_WORDS, OFF_WORDS * several):
        return
    row, tokens, given = example
    shown = ", ".join(f"{token!r}: {label}" for token, label in zip(tokens, given, strict=True))
    raise diagnosis.Finding(
        f"in {off} of the {several} words of several tokens (of the first {rows} rows of the {split.description} "
        f"dataset), the word's first token is -100 while a later one carries a label (row {split.row(row)}: {shown}): "
        "the labels sit on later tokens of their words (the word-start test inverted, or labels placed by a "
        "shifted position)",
        "give each token its word's label through the encoding's word_ids(): the first token of a word gets the word's "
        "label (the others -100, or the same label), special tokens -100, as in the token-classification example",
    )


@checks("dataset", "eval", reads=MODEL)
def check_label_names(pipeline: Pipeline, split: FedSplit) -> None:
    """The model's id2label names the dataset's classes (its ClassLabel's names) in the dataset's order: the same
    names in another order put the wrong name on every prediction of the trained model."""
    column = pipeline.label_column(split.table)
    if split.transformed:  # the names describe the stored ids, which a transform may map to others
        return
    feature = (getattr(split.given, "features", None) or {}).get(column) if column else None
    names = list(getattr(getattr(feature, "feature", feature), "names", None) or [])  # ClassLabel, or a list of them
    config = getattr(model_facts.base_model(pipeline.model), "config", None)
    given = getattr(config, "id2label", None) or {}
    try:
        ordered = [str(given[index]) for index in range(len(names))]
    except (KeyError, TypeError):
        return
    if len(given) != len(names) or not names:
        return
    if sorted(map(_name, ordered)) != sorted(map(_name, names)) or list(map(_name, ordered)) == list(map(_name, names)):
        return  # names of their own (or the defaults, LABEL_0...), or the same order: nothing to compare
    index = next(
        index for index, (mine, theirs) in enumerate(zip(ordered, names, strict=True)) if _name(mine) != _name(theirs)
    )
    raise diagnosis.Finding(
        f"the model's id2label names the classes in another order than the {split.description} dataset's "
        f"{column!r} ClassLabel: class {index} is {names[index]!r} in the data but id2label[{index}] = "
        f"{ordered[index]!r}, so every prediction of the trained model carries the wrong name",
        f"build both maps from the dataset's names: names = dataset.features[{column!r}].names; "
        "id2label = dict(enumerate(names)); label2id = {name: index for index, name in enumerate(names)}",
    )


def _name(label: str) -> str:
    """A class name as compared: its case, spaces and separators left out."""
    return "".join(character for character in label.lower() if character.isalnum())


@checks("dataset", "eval", reads=SPLIT)
def check_embedding_columns(pipeline: Pipeline, split: FedSplit) -> None:
    """A sentence-transformers split feeds the text columns and the labels its loss takes."""
    embeddings.check_split(pipeline.trainer, split)


FOR_TASK: dict[str, tuple[Callable[[Pipeline, FedSplit], None], ...]] = {
    tasks.CLASS: (check_label_names,),
    tasks.TOKEN_CLASS: (check_token_labels, check_label_names),
    tasks.DECODER_TARGETS: (check_target_padding,),
    tasks.POSITIONS: (check_answer_positions,),
    tasks.EMBEDDING: (check_embedding_columns,),
}


@message
def pad_in_targets(pad: int, count: int, where: str, collator: str | None = None) -> diagnosis.Finding:
    """`collator`: the name of the script's own collator where it padded them."""
    fix = (
        f"in {collator}, set the labels' padded positions to -100 by the mask the tokenizer's pad() returns for "
        'them (padded = tokenizer.pad(label_features, return_tensors="pt"); labels = '
        'padded["input_ids"].masked_fill(padded["attention_mask"].ne(1), -100)), not by the pad id, which may be '
        "the end token the model must learn"
        if collator
        else "set padded label positions to -100: tokenize targets without padding='max_length' and let "
        "DataCollatorForSeq2Seq pad them (label_pad_token_id=-100), or replace the pad id by -100 in the labels"
    )
    return diagnosis.Finding(
        f"the labels hold the pad id {pad} ({where} and {count} positions in all) instead of -100: the loss "
        "trains the model to write padding after every target",
        fix,
    )
