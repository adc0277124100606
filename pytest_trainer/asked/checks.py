"""Checks of what the model is trained on against what it will be asked, each reading the one `Asked` view.

Each raises a `Finding` (training runs, and learns the wrong thing) naming the rows, the numbers and a fix that
follows from the cause. A shape this module does not understand is left alone: no finding.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from pytest_trainer import diagnosis
from pytest_trainer.asked.view import ANSWER_FIELDS, Asked, Row
from pytest_trainer.catalogue import TEMPLATE, checks

#: A systematic defect (a template, a tokenizer setting) shows on this share of the rows it can show on, or more.
MOST = 0.5
#: How the chat templates of the models that use a field render it, for the fix.
FIELD_TEMPLATES = {
    "reasoning_content": "Qwen3's writes it between <think> and </think>",
    "reasoning": "a reasoning model's template writes it before the answer, between its thinking tags",
    "thinking": "a reasoning model's template writes it before the answer, between its thinking tags",
    "tool_calls": "a tool-calling template writes each call, as Qwen2.5's does between <tool_call> and </tool_call>",
}
#: Truncation is a finding when it cuts the end off this share of the sampled answers, or more (a few long outliers
#: cut is a trade-off, not a defect): below it, a note.
CUT_SHARE = 0.25


@checks("targets", reads=TEMPLATE)
def check_doubled_bos(asked: Asked) -> None:
    """A chat template that writes the BOS token, rendered to text and tokenized again, starts each row with two."""
    bos = asked.bos
    if bos is None or not asked.rows:
        return
    doubled = [row for row in asked.rows if len(row) > 1 and row.ids[0] == bos and row.ids[1] == bos]
    if len(doubled) < MOST * len(asked.rows):
        return
    token = asked.text(bos)
    raise diagnosis.Finding(
        f"{len(doubled)} of {len(asked.rows)} sampled rows begin with {token!r} twice: the chat template writes it and "
        "the tokenizer adds another when the rendered text is tokenized again, while inference "
        "(apply_chat_template) gives the model one",
        "tokenize the rendered text with add_special_tokens=False, or let apply_chat_template tokenize "
        "(tokenize=True); TRL's SFTTrainer does this on a messages column",
        [f"row as trained ([[...]] marks the supervised tokens): {asked.marked(doubled[0])}"],
    )


@checks("targets", reads=TEMPLATE)
def check_prompt_as_asked(asked: Asked) -> None:
    """Each conversation's trained row begins with the very tokens inference will prompt the model with."""
    compared: list[tuple[Row, list[int], int]] = []
    for row in asked.rows:
        if _cut(asked, row) or _doubled(asked, row):
            continue  # a row cut by truncation may have lost its start; a doubled BOS has its own finding
        prompt = asked.prompt_for(row)
        if not prompt:
            continue
        prompt = asked.collapsed(prompt)  # a processor's image placeholders: as many at inference as in training
        ids = asked.collapsed([int(token) for token in row.ids])[: len(prompt)]
        same = next((index for index, (a, b) in enumerate(zip(ids, prompt, strict=False)) if a != b), len(ids))
        compared.append((row, prompt, same))
    differ = [(row, prompt, same) for row, prompt, same in compared if same < len(prompt)]
    if not compared or len(differ) < MOST * len(compared):
        return
    row, prompt, same = differ[0]
    start = max(0, same - 8)
    trained = asked.collapsed([int(token) for token in row.ids])
    counted = " (each run of image placeholders counted once)" if asked.expanded else ""
    raise diagnosis.Finding(
        f"{len(differ)} of {len(compared)} sampled conversations are trained on a prompt that differs from the one "
        f"inference gives the model (apply_chat_template(messages[:-1], add_generation_prompt=True)): they part at "
        f"token {same}{counted}, trained {asked.text(trained[start : same + 8])!r} against asked "
        f"{asked.text(prompt[start : same + 8])!r}",
        "build the training rows with the tokenizer's own chat template (apply_chat_template on the messages, or "
        "TRL's SFTTrainer on the messages column), or save the template you train with as tokenizer.chat_template",
        [f"row as trained: {asked.marked(row)}", f"row as asked:   {asked.text(prompt)!r}"],
    )


@checks("targets", reads=TEMPLATE)
def check_answer_ends(asked: Asked, notes: list[str]) -> tuple[int, int]:
    """Every answer the model is trained on ends with a token generation stops at, and is not cut by truncation.

    Returns (answers, answers that end on a stop token) for the report. Plain texts (no prompt left out, no stored
    conversation) are `check_eos_of_texts`'s.
    """
    answers = asked.answers
    if not answers or not asked.stops:
        return 0, 0
    endings = [(row, _ending(asked, row)) for row in answers]
    kinds = Counter(ending for _, ending in endings)
    stopped = kinds["stops"]
    cut = [row for row, ending in endings if ending == "cut"]
    if cut:
        _cut_answers(asked, answers, cut, notes)
    _cut_prompts(asked, answers, notes)
    whole = [(row, ending) for row, ending in endings if ending != "cut"]
    kind, count = next(((kind, count) for kind, count in kinds.most_common() if kind not in ("stops", "cut")), ("", 0))
    if not whole or count < MOST * len(whole):
        return len(answers), stopped
    row = next(row for row, ending in whole if ending == kind)
    stops = ", ".join(repr(asked.text(token)) for token in asked.stops)
    where = next(iter(asked.stops.values()))
    shown = [f"row as trained ([[...]] marks the supervised tokens): {asked.marked(row)}"]
    end = _end(asked, row)
    last = asked.text(row.ids[end - 1])
    if kind == "unlabelled":
        token = asked.text(row.ids[end])
        cause = (
            f"{count} of {len(whole)} sampled answers are followed by {token!r} but it carries no label: the "
            "model never learns to end its answer and generation runs on"
        )
        if row.masked_by == "assistant_masks" or (asked.generation_markers and row.masked_by != "completion_mask"):
            fix = (
                f"move {token!r} inside the chat template's {{% generation %}}...{{% endgeneration %}} block, so "
                "the assistant mask covers the end of each turn"
            )
        elif row.masked_by == "completion_mask":
            fix = f"end each completion with {token!r} (in the completion, not in the next prompt)"
        elif asked.pad is not None and int(row.ids[end]) == asked.pad:
            fix = (
                "give the tokenizer a pad token of its own (an unused reserved token; resize the embeddings if it "
                "is new): the collator masks every pad id, and here the pad token is the end token"
            )
        else:
            fix = f"keep the label of {token!r} after each answer (only prompt tokens get -100)"
        raise diagnosis.Finding(cause, fix, shown)
    if kind == "other_stop":
        cause = (
            f"{count} of {len(whole)} sampled answers end with {last!r}, but generation stops at {stops} "
            f"({where}): the model learns to write {last!r} and generation runs past it"
        )
        eos = asked.text(asked.eos) if asked.eos is not None else None
        fix = (
            f"make generation stop at {last!r}: model.generation_config.eos_token_id = "
            f"[{', '.join(str(token) for token in asked.stops)}, {int(row.ids[end - 1])}] before saving "
            f"(SFTConfig(eos_token={last!r}) does it)"
        )
        if eos is not None and eos != last and asked.eos not in asked.stops:
            fix += f", and set tokenizer.eos_token = {last!r}"
        raise diagnosis.Finding(cause, fix, shown)
    eos = asked.text(asked.eos) if asked.eos is not None else "the end-of-sequence token"
    raise diagnosis.Finding(
        f"{count} of {len(whole)} sampled answers end on {last!r} with no token generation stops at ({stops}) "
        "trained after them: the model never learns to stop",
        f"end each answer with {eos!r} (add it to the completion text, or use a chat template that closes the "
        "assistant's turn with it); TRL's SFTTrainer adds it to text data itself",
        shown,
    )


@checks("targets", reads=TEMPLATE)
def check_eos_of_texts(asked: Asked) -> tuple[int, int]:
    """In plain language modelling, the end-of-sequence tokens the rows hold are trained: a collator that masks every
    pad id, with pad = eos, teaches the model never to stop. Returns (eos tokens, eos tokens trained)."""
    eos = asked.eos
    answers = {id(row) for row in asked.answers}
    texts = [row for row in asked.rows if id(row) not in answers]
    if eos is None or not texts:
        return 0, 0
    total = trained = 0
    for row in texts:
        at_eos = row.ids == eos
        at_eos[:1] = False
        total += int(at_eos.sum())
        trained += int((at_eos & row.trained).sum())
    if not total or trained or not any(row.trained.any() for row in texts):
        return total, trained
    row = next(row for row in texts if (row.ids[1:] == eos).any())
    token = asked.text(eos)
    if asked.pad == eos:
        cause = (
            f"no end-of-sequence token is supervised (0 of {total} {token!r} tokens in {len(texts)} sampled "
            "rows carry a label): the tokenizer pads with the eos token and the collator masks every pad id, so "
            "the model never learns to stop"
        )
        fix = (
            "give the tokenizer a pad token of its own (tokenizer.pad_token = '<|pad|>' or an unused reserved "
            "token; resize the embeddings if it is new), or keep the label of the final eos token"
        )
    else:
        cause = (
            f"no end-of-sequence token is supervised (0 of {total} {token!r} tokens in {len(texts)} sampled "
            "rows carry a label): the model never learns to stop"
        )
        fix = f"keep the label of each text's final {token!r} (only padding gets -100)"
    raise diagnosis.Finding(cause, fix, [f"row as trained: {asked.marked(row)}"])


@checks("targets", reads=TEMPLATE)
def check_answers_trained(asked: Asked) -> None:
    """What the stored conversation holds reaches the row: each turn's content, and what the answer says besides its
    content (its reasoning, its tool calls) among the trained tokens."""
    lost: Counter[str] = Counter()
    held: Counter[str] = Counter()
    missing_chars = total_chars = 0
    example: Row | None = None
    for row in asked.rows:
        found = asked.conversation(row)
        if found is None or _cut(asked, row) or not row.trained.any():
            continue
        prompt, answer = found
        trained = _squashed(asked.text(row.ids[row.trained]))
        whole = _squashed(asked.text(row.ids))
        content = _squashed(" ".join(_parts(answer.get("content"), "content")))
        if content and content not in trained:
            continue  # the content itself is not found as trained: this row is not understood
        total_chars += len(content)
        wanted = [
            (f"{message.get('role')} turns", _parts(message.get("content"), "content"), whole) for message in prompt
        ]
        # Tool calls of every assistant turn reach the row (a tool's answer follows each but the last); reasoning only
        # for the answer trained on (templates such as Qwen3's leave earlier turns' reasoning out by design).
        calls = [
            part
            for message in prompt
            if message.get("role") == "assistant"
            for part in _parts(message.get("tool_calls"), "tool_calls")
        ]
        wanted += [
            (
                name,
                _parts(answer.get(name), name) + (calls if name == "tool_calls" else []),
                whole if name == "tool_calls" else trained,
            )
            for name in ANSWER_FIELDS
        ]
        for name, texts, within in wanted:
            parts = [part for part in (_squashed(text) for text in texts) if part]
            if not parts:
                continue
            held[name] += 1
            size = sum(len(part) for part in parts)
            total_chars += size
            if not all(part in within for part in parts) or (
                name in ANSWER_FIELDS and asked.drops(row, name, last_only=name != "tool_calls")
            ):
                lost[name] += 1
                missing_chars += size
                example = example or row
    dropped = [name for name in held if lost[name] >= MOST * held[name]]
    if not dropped or example is None:
        return
    named = " and ".join(f"{name} ({lost[name]} of {held[name]} rows)" for name in dropped)
    fields = [name for name in dropped if name in ANSWER_FIELDS]
    turns = [name for name in dropped if name not in ANSWER_FIELDS]
    fixes = []
    if fields:
        shown = "; ".join(FIELD_TEMPLATES.get(name, name) for name in fields)
        fixes.append(
            f"use a chat template that renders {' and '.join(fields)} ({shown}), or move them into the "
            "message's content"
        )
    if turns:
        fixes.append(
            f"use a chat template that renders every message ({' and '.join(turns)} are left out), as the "
            "model's own template does"
        )
    where = "are never trained" if fields and not turns else "never reach the model"
    raise diagnosis.Finding(
        f"the stored conversations' {named} {where}: the chat template does not render them, so "
        f"{missing_chars / max(total_chars, 1):.0%} of the sampled conversations' text is lost",
        "; and ".join(fixes),
        [f"row as trained: {asked.marked(example)}"],
    )


def _cut_answers(asked: Asked, answers: list[Row], cut: list[Row], notes: list[str]) -> None:
    """Answers cut by truncation: a note, and a finding where they are many."""
    wanted = [length for row in cut if (length := _whole_length(asked, row)) is not None]
    setting = asked.length_setting
    keeps = f"; {setting}={max(wanted)} keeps every sampled row whole" if wanted else ""
    line = (
        f"{len(cut)} of {len(answers)} sampled answers are cut by {setting}={asked.max_length} before their end{keeps}"
    )
    if len(cut) < CUT_SHARE * len(answers):
        notes.append(line)
        return
    lost = [length - len(row) for row in cut if (length := _whole_length(asked, row)) is not None]
    loses = f" (they lose {min(lost)} to {max(lost)} tokens)" if lost else ""
    raise diagnosis.Finding(
        f"{line}{loses}: the model is trained on answers that stop mid-way, with no end token, and learns to break "
        "off instead of finishing",
        (f"raise {setting} to {max(wanted)}" if wanted else f"raise {setting}")
        + " (or shorten the longest rows in the data, or truncate the prompt rather than the answer)",
        [f"row as trained: {asked.marked(cut[0])}"],
    )


def _cut_prompts(asked: Asked, answers: list[Row], notes: list[str]) -> None:
    """Rows truncated from the left (truncation_mode="keep_end"): the answer stays whole, its question loses its
    start, and the row no longer begins as every other one does (with the template's first token)."""
    whole = [row for row in answers if not _cut(asked, row)]
    if not whole:
        return
    first, count = Counter(int(row.ids[0]) for row in whole).most_common(1)[0]
    if count < MOST * len(whole) + 1:
        return  # the rows begin with no one token: a start lost cannot be told
    cut = [row for row in answers if _cut(asked, row) and int(row.ids[0]) != first]
    if not cut:
        return
    setting = asked.length_setting
    line = (
        f"{len(cut)} of {len(answers)} sampled rows are cut by {setting}={asked.max_length} at their start: they "
        f"lose the beginning of their prompt (they do not begin with {asked.text(first)!r} as the others do)"
    )
    if len(cut) < CUT_SHARE * len(answers):
        notes.append(line)
        return
    raise diagnosis.Finding(
        f"{line}, so the model learns to answer questions it is only shown the end of",
        f"raise {setting} (or truncate from the end, truncation_mode='keep_start', and shorten the longest prompts)",
        [f"row as trained: {asked.marked(cut[0])}"],
    )


def _ending(asked: Asked, row: Row) -> str:
    """How a row's trained answer ends: "stops", "cut" (truncation), "unlabelled" (a stop token follows it but is not
    trained), "other_stop" (a special token generation does not stop at) or "open" (no end token)."""
    end = _end(asked, row)
    last = int(row.ids[end - 1])
    if last in asked.stops:
        return "stops"
    if _cut(asked, row) and row.answer_end == len(row):
        return "cut"
    after = int(row.ids[end]) if end < len(row) else None
    ends = {*asked.stops, asked.end_of_turn, asked.eos} - {None}
    if after is not None and after in ends:
        return "unlabelled"
    if last == asked.end_of_turn or (last == asked.eos and asked.eos is not None):
        return "other_stop"
    return "open"


def _end(asked: Asked, row: Row) -> int:
    """The position after the answer's last trained token that is not white space (a template's newline after the
    end of turn is trained with it in a full-sequence loss)."""
    end = row.answer_end
    assert end is not None
    while end > 1 and row.trained[end - 2] and not asked.text(row.ids[end - 1]).strip():
        end -= 1
    return end


def _cut(asked: Asked, row: Row) -> bool:
    return asked.max_length is not None and len(row) >= asked.max_length


def _doubled(asked: Asked, row: Row) -> bool:
    return asked.bos is not None and len(row) > 1 and row.ids[0] == asked.bos and row.ids[1] == asked.bos


def _whole_length(asked: Asked, row: Row) -> int | None:
    """The length of a cut row's stored conversation rendered whole, or None when it is not known."""
    found = asked.conversation(row)
    stored = row.stored or {}
    prompt, completion = stored.get("prompt"), stored.get("completion")
    try:
        if found is not None and asked.template is not None:
            made = asked.tokenizer.apply_chat_template(
                [*found[0], found[1]], tokenize=True, **asked.template_arguments(row)
            )
        elif isinstance(prompt, str) and isinstance(completion, str) and asked.tokenizer is not None:
            made = asked.tokenizer(prompt + completion)
        else:
            return None
    except Exception:  # a template or tokenizer that cannot render it: the length is not known
        return None
    ids = made.get("input_ids") if isinstance(made, Mapping) else made
    if not isinstance(ids, list):
        return None
    if found is None and asked.eos is not None and (not ids or ids[-1] != asked.eos):
        ids = [*ids, asked.eos]  # a text answer is trained with the end token after it
    return len(ids) if len(ids) > len(row) else None


def _parts(value: Any, name: str) -> list[str]:
    """A message field as the texts to find among the trained tokens: a string, the text parts of a list of
    contents, or each tool call's function name."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        function = value.get("function", value)
        if name == "tool_calls" and isinstance(function, Mapping):
            return [str(function["name"])] if function.get("name") else []
        return [value["text"]] if isinstance(value.get("text"), str) else []
    if isinstance(value, list):
        return [part for item in value for part in _parts(item, name)]
    return []


def _squashed(text: str) -> str:
    return "".join(text.split())
