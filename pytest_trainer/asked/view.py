"""The sampled training rows as the model is trained on them, beside what inference will ask and where it stops.

Each `Row` is one sequence as collated by the Trainer's own collator, padding left out: its tokens, which are
trained (a label other than -100), which the data marks as prompt, and, when the row is one stored sample whole,
that stored sample (its conversation). `Asked` adds what inference reads from the saved files: the tokenizer's
chat template (the prompt `apply_chat_template(messages[:-1], add_generation_prompt=True)` gives), the tokens
generation stops at (`generation_config.eos_token_id`, else the tokenizer's eos), the token the template ends an
assistant turn with, and the length the pipeline truncates to.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_trainer.tasks import IGNORE_INDEX

if TYPE_CHECKING:
    import numpy as np

#: Batch keys that mark the completion (or the assistant's turns) under a completion-only loss.
COMPLETION_MASKS = ("completion_mask", "assistant_masks")
#: Fields of an assistant message that hold what it says besides its content.
ANSWER_FIELDS = ("reasoning_content", "reasoning", "thinking", "tool_calls")
#: Rows cut off at one same longest length that show a truncation no setting names (a framework's own).
TRUNCATED_ROWS = 2
#: The setting a framework truncates with, by the package its trainer comes from.
FRAMEWORK_LENGTHS = {"llamafactory": "cutoff_len", "axolotl": "sequence_len"}
#: Texts of a probe conversation, to find what the template writes after an assistant turn.
PROBE = ("Probe question?", "Probe answer.")


@dataclass
class Row:
    """One trained sequence, padding left out."""

    ids: np.ndarray
    labels: np.ndarray
    #: Positions a completion-only loss must not train, where the batch or the dataset says so (None: unknown).
    prompt: np.ndarray | None = None
    #: The sample as stored, when this row is that one sample whole (not packed with others); else None.
    stored: Mapping[str, Any] | None = None
    #: Whether the row came from a batch that packs samples into one sequence.
    packed: bool = False
    #: What marks the prompt: a batch key ("assistant_masks", "completion_mask"), "labels" (-100 in the dataset).
    masked_by: str | None = None
    #: Whether the row is one sample's sequence: an unpacked row, or a packed one's run between position_ids restarts
    #: (a packed row with no restart is a chunk of a stream of samples, whose ends are no sample's ends).
    delimited: bool = True
    #: Whether the row is a run between position_ids restarts of a packed sequence.
    segment: bool = False

    def __post_init__(self) -> None:
        self.trained = self.labels != IGNORE_INDEX
        self.trained[:1] = False  # a causal LM predicts from the previous token: position 0 is never a target

    def __len__(self) -> int:
        return int(self.ids.size)

    @property
    def answer_end(self) -> int | None:
        """The position after the last trained token, or None when nothing is trained."""
        import numpy as np

        found = np.flatnonzero(self.trained)
        return int(found[-1]) + 1 if found.size else None

    @property
    def has_prompt(self) -> bool:
        """Whether some untrained tokens come before the trained ones (a prompt the loss leaves out)."""
        import numpy as np

        found = np.flatnonzero(self.trained)
        return bool(found.size) and int(found[0]) > 1


def rows_of(
    batch: Mapping[str, np.ndarray],
    samples: Sequence[Mapping[str, Any]],
    stored: Sequence[Mapping[str, Any] | None],
    pad: int | None = None,
) -> list[Row]:
    """The sequences of a collated batch: its rows, or in a packed batch the runs where position_ids restart at 0 (a
    run of `pad` tokens alone, with no label, is the padding after the last one, not a sequence)."""
    import numpy as np

    ids, labels = batch["input_ids"], batch["labels"]
    if ids.ndim != 2 or labels.shape != ids.shape:
        return []
    mask = batch.get("attention_mask")
    real = mask.astype(bool) if mask is not None and mask.shape == ids.shape else np.ones_like(ids, dtype=bool)
    key = next((key for key in COMPLETION_MASKS if key in batch and batch[key].shape == ids.shape), None)
    completion = None if key is None else batch[key]
    positions = batch.get("position_ids")
    packed = len(samples) > ids.shape[0]
    rows = []
    for index in range(ids.shape[0]):
        prompt = None if completion is None else ~completion[index].astype(bool)
        masked_by = key
        if prompt is None and len(samples) == ids.shape[0]:
            prompt = _masked_by_dataset(samples[index], ids[index], real[index])
            masked_by = None if prompt is None else "labels"
        starts = [0]
        if positions is not None and positions.shape == ids.shape and packed:
            starts = [int(start) for start in np.flatnonzero(positions[index] == 0)] or [0]
        for start, end in zip(starts, [*starts[1:], ids.shape[1]], strict=True):
            cut = slice(start, end)
            if (
                len(starts) > 1
                and pad is not None
                and (ids[index, cut] == pad).all()
                and (labels[index, cut] == IGNORE_INDEX).all()
            ):
                continue
            keep = real[index, cut]
            whole = stored[index] if not packed and len(stored) == ids.shape[0] else None
            rows.append(
                Row(
                    ids[index, cut][keep],
                    labels[index, cut][keep],
                    None if prompt is None else prompt[cut][keep],
                    whole,
                    packed,
                    masked_by,
                    delimited=not packed or len(starts) > 1,
                    segment=len(starts) > 1,
                )
            )
    return rows


def _masked_by_dataset(sample: Mapping[str, Any], ids: np.ndarray, real: np.ndarray) -> np.ndarray | None:
    """Positions whose label the dataset itself sets to -100 (a prompt), aligned with the collated row."""
    import numpy as np

    given_ids, given_labels = sample.get("input_ids"), sample.get("labels")
    if given_ids is None or given_labels is None:
        return None
    given_ids, given_labels = np.asarray(given_ids).reshape(-1), np.asarray(given_labels).reshape(-1)
    if given_ids.shape != given_labels.shape or not (given_labels == IGNORE_INDEX).any():
        return None
    offset = int(np.argmax(real)) if real.any() else 0  # left padding puts the sample after the pads
    if offset + given_ids.size > ids.size or not (ids[offset : offset + given_ids.size] == given_ids).all():
        return None  # the collator changed the tokens (truncated, packed): no alignment to compare
    masked = np.zeros(ids.shape, dtype=bool)
    masked[offset : offset + given_ids.size] = given_labels == IGNORE_INDEX
    return masked


class Asked:
    """The trained rows beside what inference asks: the chat template's prompt, the stop tokens, the truncation.

    Built from a Trainer by `of`; the view itself holds facts (the rows, the special token ids, the stop tokens, the
    truncation setting) and the tokenizer that renders the chat template, so the checks that read no template are
    tested on rows built by hand (tests/unit/test_asked.py)."""

    def __init__(
        self,
        rows: list[Row],
        tokenizer: Any = None,
        *,
        bos: int | None = None,
        eos: int | None = None,
        pad: int | None = None,
        stops: Mapping[int, str] | None = None,
        packs_samples: bool = False,
        truncates_at: int | None = None,
        length_setting: str = "max_length",
        expanded: frozenset[int] = frozenset(),
    ) -> None:
        self.rows = rows
        #: The placeholder tokens a multimodal processor repeats, one for each feature of an image (or a video, an
        #: audio clip), where the tokenizer's template writes one.
        self.expanded = expanded
        #: The tokenizer (a multimodal processor holds it), or None.
        self.tokenizer: Any = tokenizer
        #: The tokenizer's special token ids.
        self.bos, self.eos, self.pad = bos, eos, pad
        #: The tokens generation stops at, each with the setting that says so (None: the tokenizer's eos).
        self.stops: dict[int, str] = (
            dict(stops) if stops is not None else ({self.eos: "tokenizer.eos_token"} if self.eos is not None else {})
        )
        #: Whether the trainer packs samples into its dataset's rows (TRL's `packing`).
        self.packs_samples = packs_samples
        #: The length a setting truncates rows to (the collator's or the arguments' max_length), or None.
        self.truncates_at = truncates_at
        #: The setting that truncates the rows, as the user writes it (the framework's own name for it).
        self.length_setting = length_setting

    @classmethod
    def of(cls, trainer: Any, model: Any, rows: list[Row]) -> Asked:
        """The view of `rows` as `trainer` trains `model` on them."""
        processor = getattr(trainer, "processing_class", None)
        tokenizer = getattr(processor, "tokenizer", processor) if processor is not None else None
        truncates_at = next(
            (
                value
                for owner in (trainer.data_collator, trainer.args)
                if isinstance(value := getattr(owner, "max_length", None), int) and value > 0
            ),
            None,
        )
        return cls(
            rows,
            tokenizer,
            bos=_int(getattr(tokenizer, "bos_token_id", None)),
            eos=_int(getattr(tokenizer, "eos_token_id", None)),
            pad=_int(getattr(tokenizer, "pad_token_id", None)),
            stops=_model_stops(model),
            packs_samples=bool(getattr(trainer.args, "packing", False)),
            truncates_at=truncates_at,
            length_setting=FRAMEWORK_LENGTHS.get(type(trainer).__module__.split(".")[0], "max_length"),
            expanded=_placeholders(processor, tokenizer),
        )

    @functools.cached_property
    def answers(self) -> list[Row]:
        """The rows that answer a prompt: some tokens before the trained ones are left out of the loss, or the row is
        a stored conversation; and the row is one sample's, not a chunk of samples packed together with no position_ids
        restart between them (TRL's "wrapped" packing). The other rows are texts (plain language modelling, or
        chunks)."""
        return [
            row
            for row in self.rows
            if row.delimited
            and not (self.packs_samples and not row.segment)
            and row.answer_end is not None
            and (row.has_prompt or self.conversation(row) is not None)
        ]

    @functools.cached_property
    def generation_markers(self) -> bool:
        """Whether the chat template marks the assistant's tokens with {% generation %} (an assistant-only loss)."""
        return self.template is not None and "generation" in self.template and "endgeneration" in self.template

    @functools.cached_property
    def max_length(self) -> int | None:
        """The length rows are truncated to: as the collator or the trainer's arguments say, else as the rows show it
        (a framework that truncates while it tokenizes: several answers cut off at one same longest length)."""
        if self.truncates_at is not None:
            return self.truncates_at
        whole = [row for row in self.answers if not row.packed]
        longest = max((len(row) for row in whole), default=0)
        open_ended = [
            row
            for row in whole
            if len(row) == longest and row.answer_end == len(row) and int(row.ids[-1]) not in self.stops
        ]
        return longest if len(open_ended) >= TRUNCATED_ROWS else None

    @functools.cached_property
    def template(self) -> str | None:
        """The chat template inference renders prompts with (the tokenizer's, saved with it), or None."""
        template = getattr(self.tokenizer, "chat_template", None)
        return template if isinstance(template, str) and template else None

    @functools.cached_property
    def end_of_turn(self) -> int | None:
        """The special token the chat template writes right after an assistant's answer, or None."""
        if self.template is None:
            return None
        question, answer = PROBE
        try:
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": question}, {"role": "assistant", "content": answer}], tokenize=False
            )
            after = str(text).split(answer, 1)[1]
            ids = self.tokenizer(after, add_special_tokens=False)["input_ids"]
        except Exception:  # a template that wants other roles or fields: no end of turn is known
            return None
        special = set(getattr(self.tokenizer, "all_special_ids", None) or []) | set(
            getattr(self.tokenizer, "added_tokens_decoder", None) or {}
        )
        first = next((int(token) for token in ids if not self.text(token).isspace()), None)
        return first if first in special else None

    def conversation(self, row: Row) -> tuple[list[Mapping[str, Any]], Mapping[str, Any]] | None:
        """(the prompt's messages, the answer message) of a row stored as a conversation that ends with the
        assistant's answer (`messages`, or conversational `prompt` and `completion`), else None."""
        stored = row.stored
        if stored is None:
            return None
        messages: Any = stored.get("messages")
        if _conversation(messages) and messages[-1].get("role") == "assistant" and len(messages) > 1:
            return list(messages[:-1]), messages[-1]
        prompt: Any = stored.get("prompt")
        completion: Any = stored.get("completion")
        if _conversation(prompt) and _conversation(completion) and len(completion) == 1:
            return list(prompt), completion[0]
        return None

    def collapsed(self, ids: list[int]) -> list[int]:
        """`ids` with each run of one placeholder token a processor expands taken as one token, as the template
        writes it."""
        kept: list[int] = []
        for token in ids:
            if not (kept and token == kept[-1] and token in self.expanded):
                kept.append(token)
        return kept

    def prompt_for(self, row: Row) -> list[int] | None:
        """The token ids inference gives the model for this row's answer: the chat template's prompt with the
        generation header, as `apply_chat_template(messages[:-1], add_generation_prompt=True)` makes it."""
        found = self.conversation(row)
        if found is None or self.template is None:
            return None
        try:
            made = self.tokenizer.apply_chat_template(
                found[0], add_generation_prompt=True, tokenize=True, **self.template_arguments(row)
            )
        except Exception:  # a template that cannot render the prompt alone: nothing to compare
            return None
        ids = made.get("input_ids") if isinstance(made, Mapping) else made
        while isinstance(ids, list) and ids and isinstance(ids[0], list):
            ids = ids[0]
        return [int(token) for token in ids] if isinstance(ids, list) else None

    def template_arguments(self, row: Row) -> dict[str, Any]:
        """What the row's own columns give the chat template, as TRL passes them: its tools (a list, or JSON text)
        and its chat_template_kwargs (enable_thinking, say)."""
        stored = row.stored or {}
        tools: Any = stored.get("tools")
        if isinstance(tools, str):
            try:
                tools = json.loads(tools)
            except ValueError:
                tools = None
        given = stored.get("chat_template_kwargs")
        extra = {key: value for key, value in given.items() if value is not None} if isinstance(given, Mapping) else {}
        return {**({"tools": tools} if tools else {}), **extra}

    def drops(self, row: Row, field: str, last_only: bool) -> bool:
        """Whether the chat template renders the row's conversation the same without the assistant messages' `field`
        (only the answer's, with `last_only`): what the template drops never reaches the model."""
        found = self.conversation(row)
        if found is None or self.template is None:
            return False
        messages = [*found[0], found[1]]
        bare = [
            (
                {key: value for key, value in message.items() if key != field}
                if message.get("role") == "assistant" and (not last_only or index == len(messages) - 1)
                else message
            )
            for index, message in enumerate(messages)
        ]
        try:
            rendered, without = (
                self.tokenizer.apply_chat_template(conversation, tokenize=False, **self.template_arguments(row))
                for conversation in (messages, bare)
            )
        except Exception:  # a template that cannot render one of them: nothing is known
            return False
        return bool(rendered == without)

    def text(self, ids: Any) -> str:
        """The text of token ids (one or several), special tokens kept."""
        if self.tokenizer is None:
            return str(ids)
        listed = [int(ids)] if isinstance(ids, int) or getattr(ids, "ndim", 1) == 0 else [int(i) for i in ids]
        return str(self.tokenizer.decode(listed, skip_special_tokens=False))

    def marked(self, row: Row, limit: int = 400) -> str:
        """The row as text, with [[...]] around the trained tokens."""
        parts, start = [], 0
        for end in range(1, len(row) + 1):
            if end == len(row) or row.trained[end] != row.trained[start]:
                text = self.text(row.ids[start:end])
                parts.append(f"[[{text}]]" if row.trained[start] else text)
                start = end
        shown = " ".join(parts)
        return repr(shown if len(shown) <= limit else shown[:limit] + "...")


def _model_stops(model: Any) -> dict[int, str] | None:
    """The tokens generation stops at, each with the setting that says so: the model's generation config, else its
    config (None: neither says, and `generate` falls back to the tokenizer's eos)."""
    for owner, name in (
        (getattr(model, "generation_config", None), "generation_config.eos_token_id"),
        (getattr(model, "config", None), "config.eos_token_id"),
    ):
        value = getattr(owner, "eos_token_id", None)
        listed = value if isinstance(value, (list, tuple)) else [value]
        found = [token for item in listed if (token := _int(item)) is not None]
        if found:
            return dict.fromkeys(found, name)
    return None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _conversation(value: Any) -> bool:
    return (
        isinstance(value, list) and bool(value) and all(isinstance(item, Mapping) and "role" in item for item in value)
    )


def _placeholders(processor: Any, tokenizer: Any) -> frozenset[int]:
    """The ids of the placeholder tokens a multimodal processor expands (its image, video and audio tokens)."""
    if processor is None or processor is tokenizer:
        return frozenset()
    found = set()
    for kind in ("image", "video", "audio"):
        token_id = getattr(processor, f"{kind}_token_id", None)
        token = getattr(processor, f"{kind}_token", None)
        if not isinstance(token_id, int) and isinstance(token, str):
            try:
                token_id = tokenizer.convert_tokens_to_ids(token)
            except Exception:  # a tokenizer of another shape: that kind is not collapsed
                token_id = None
        if isinstance(token_id, int) and token_id != getattr(tokenizer, "unk_token_id", None):
            found.add(token_id)
    return frozenset(found)
