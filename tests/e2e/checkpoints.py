"""Real checkpoints without their weights, for the twin tests: the public config and tokenizer config files kept in
tests/fixtures/checkpoints (sources in SOURCES.md), with a small tokenizer that keeps the checkpoint's special tokens
at their own ids, laid out as a folder or as the Hugging Face cache holds a hub id."""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints"
#: The text the small tokenizer is trained on: the words of the chat scripts.
CORPUS = (
    "the quick brown fox jumps over the lazy dog . what is the capital of france ? paris is . "
    "please answer in one word . hello world , how are you today ? i am fine , thank you . "
    "summarize the text below in a short sentence . translate to french : good morning . "
)


def tokenizer_json(fixture: Path) -> str:
    """A byte-level BPE tokenizer trained on CORPUS, with every added token of the checkpoint's tokenizer config at
    the id the checkpoint gives it (so its config's bos, eos and pad ids name the same tokens), and the trained tokens
    at the ids left free."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(
        [CORPUS] * 4, trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    )
    made = json.loads(core.to_str())
    config = json.loads((fixture / "tokenizer_config.json").read_text())
    added = {int(index): entry for index, entry in config.get("added_tokens_decoder", {}).items()}
    # The trained tokens take the ids the checkpoint's own tokens leave free (Mistral's and Gemma's start at 0): two
    # tokens of one id do not survive save_pretrained and from_pretrained.
    free = (index for index in itertools.count() if index not in added)
    vocab = {token: next(free) for token, _ in sorted(made["model"]["vocab"].items(), key=lambda item: item[1])}
    vocab.update({entry["content"]: index for index, entry in added.items()})
    made["model"]["vocab"] = vocab
    made["added_tokens"] = [
        {
            "id": index,
            "content": entry["content"],
            "single_word": entry.get("single_word", False),
            "lstrip": entry.get("lstrip", False),
            "rstrip": entry.get("rstrip", False),
            "normalized": entry.get("normalized", False),
            "special": entry.get("special", True),
        }
        for index, entry in sorted(added.items())
    ]
    return json.dumps(made)


def folder(root: Path, name: str) -> Path:
    """The checkpoint `org--name` as a folder of its config and tokenizer files (no weights)."""
    return _files(FIXTURES / name, root / name)


def _files(fixture: Path, target: Path) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    for file in fixture.iterdir():
        shutil.copy(file, target / file.name)
    (target / "tokenizer.json").write_text(tokenizer_json(fixture))
    return target


def cache(home: Path, name: str) -> str:
    """The checkpoint laid out in the Hugging Face cache under HF_HOME=`home`, as a download of its config and
    tokenizer files leaves it; returns its hub id."""
    hub_id = name.replace("--", "/", 1)
    commit = hashlib.sha1(hub_id.encode()).hexdigest()
    repo = home / "hub" / f"models--{name}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    _files(FIXTURES / name, repo / "snapshots" / commit)
    return hub_id
