"""One process of the `distributed` item: `python -m pytest_trainer.distributed.rank JOB`, started by torchrun.

Each rank is a fresh interpreter, as torchrun starts it for a real run, so whatever differs between two fresh
interpreters (unseeded randomness, set order under hash randomization) differs here too. A rank runs the script up
to `trainer.train()` in the same sandbox as the pytest process, then writes what it saw to its own folder, one JSON
file updated as it goes, so that a rank that hangs or dies still leaves what it had done:
- `data`: each split's length and a digest of its rows, the label maps, the steps an epoch of its dataloader takes;
- `rows`: per micro-batch, a digest of every row `compute_loss` received;
- `weights`: a digest of every parameter after the Trainer's own `train()` took `steps` optimizer steps (through its
  DDP wrapper and its checkpoint save);
- `written`: the files the rank opened for writing under the output folder while it trained and saved;
- `evaluations`: rows the evaluation split holds and predictions `compute_metrics` received, and the metrics;
- `loss`: the loss of the pytest process's fixed batch at the trained weights, to compare with the checkpoint's;
- `sharding`: where the script asks for FSDP, what a `fully_shard` round trip of the state dict changed;
- `error`: the exception that stopped the rank, pickled, with its traceback, and `progress`: where it was.
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import pickle
import re
import signal
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pytest_trainer import diagnosis, families, training
from pytest_trainer.commands import Command
from pytest_trainer.distributed import sharding
from pytest_trainer.script_runner import SCRIPT_SEED, Sandbox, load_trainer

#: Rows of a split whose digest is compared between ranks (spread over the split), and rows counted of a stream.
DIGEST_ROWS = 512
#: Rows of each split a rank records value by value, so that the first row two ranks built differently can be shown.
SHOWN_ROWS = 8
#: Values of a row's column recorded at most.
SHOWN_VALUES = 48
COUNT_ROWS = 100_000
#: What a failure inside the Trainer's training loop names.
TRAINING = "the Trainer's training loop under torch.distributed (its DDP-wrapped model, dataloader and optimizer)"


class Record:
    """The rank's findings, rewritten whole after each change so the pytest process can read them at any time."""

    def __init__(self, folder: Path, rank: int) -> None:
        self.path = folder / f"rank-{rank}.json"
        self.facts: dict[str, Any] = {"rank": rank, "pid": os.getpid(), "progress": "starting", "rows": []}
        self.save()

    def __setitem__(self, key: str, value: Any) -> None:
        self.facts[key] = value
        self.save()

    def save(self) -> None:
        part = self.path.with_suffix(".part")
        part.write_text(json.dumps(self.facts, default=str))
        part.replace(self.path)


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    rank = int(os.environ.get("RANK", "0"))
    folder = Path(job["folder"])
    record = Record(folder, rank)
    stack = open(folder / f"stack-{rank}.txt", "w")  # noqa: SIM115 - open until the process ends
    faulthandler.register(signal.SIGUSR1, file=stack, all_threads=False)
    try:
        run(job, record, rank)
    except BaseException as error:
        record["error"] = _described(error)
        return 1
    record["progress"] = "done"
    return 0


def run(job: dict[str, Any], record: Record, rank: int) -> None:
    record["progress"] = "running the script up to trainer.train()"
    sandbox = Sandbox(
        Path(job["output_dir"]),
        job["sample"],
        job["batch_size"],
        seed=SCRIPT_SEED + rank,
        model=job.get("model", "auto"),
    )  # rank 0 as the pytest process; the others each their own
    loaded = load_trainer(Command.from_json(job["command"]), job["factory"], sandbox)
    trainer = loaded.trainer
    record["progress"] = "reading the data the script built"
    record["data"] = data_facts(trainer)
    written = train(trainer, job["steps"], record, Path(job["output_dir"]))
    record["written"] = written
    record["engine"] = {
        "world_size": trainer.args.world_size,
        "backend": _backend(),
        "wrapper": type(trainer.model_wrapped).__name__,
        "find_unused_parameters": getattr(trainer.model_wrapped, "find_unused_parameters", None),
    }
    record["weights"] = weight_digests(trainer.model)
    record["progress"] = "evaluating"
    record["evaluations"] = evaluate(trainer)
    record["progress"] = "taking the loss of the fixed batch"
    record["loss"] = batch_loss(trainer, Path(job["batch"]))
    if job.get("fsdp_layers") is not None:
        record["progress"] = "sharding the model with fully_shard"
        record["sharding"] = sharding.round_trip(trainer.model, job["fsdp_layers"], Path(job["folder"]) / "sharded")


def data_facts(trainer: Any) -> dict[str, Any]:
    """What the script built, in values two processes can compare."""
    splits = {"train": trainer.train_dataset}
    evaluation = trainer.eval_dataset
    if isinstance(evaluation, dict):
        splits.update({f"eval[{name}]": split for name, split in evaluation.items()})
    elif evaluation is not None:
        splits["eval"] = evaluation
    config: dict[str, Any] = getattr(getattr(trainer.model, "config", None), "to_dict", dict)()
    facts: dict[str, Any] = {
        "splits": {name: split_facts(split) for name, split in splits.items() if split is not None},
        "labels": {key: str(config.get(key)) for key in ("id2label", "label2id", "num_labels") if key in config},
        "tokenizer": tokenizer_facts(getattr(trainer, "processing_class", None)),
    }
    with diagnosis.pipeline_part("the Trainer's train dataloader"):
        try:
            facts["batches_per_epoch"] = len(trainer.get_train_dataloader())
        except TypeError:  # a stream has no length
            facts["batches_per_epoch"] = None
    return facts


def split_facts(split: Any) -> dict[str, Any]:
    with diagnosis.pipeline_part("reading the dataset's rows"):
        stored = split.with_format(None) if hasattr(split, "with_format") else split
        try:
            length: int | None = len(stored)
        except TypeError:
            length = None
        if length is None:
            rows = [row for _, row in zip(range(DIGEST_ROWS), iter(stored), strict=False)]
        else:
            step = max(1, length // DIGEST_ROWS)
            rows = [stored[index] for index in range(0, length, step)][:DIGEST_ROWS]
    return {
        "rows": length,
        "digest": digest(rows),
        "first": _shown(rows[0]) if rows else "",
        "digests": [digest(row) for row in rows],
        "shown": [_values(row) for row in rows[:SHOWN_ROWS]],
    }


def tokenizer_facts(processing: Any) -> dict[str, Any] | None:
    """The tokenizer's vocabulary, as a size and a digest of its (token, id) pairs; None without a tokenizer."""
    tokenizer = getattr(processing, "tokenizer", processing)
    vocabulary = getattr(tokenizer, "get_vocab", None)
    if not callable(vocabulary):
        return None
    pairs = sorted(vocabulary().items())
    return {"size": len(pairs), "digest": digest("\n".join(f"{token}\t{index}" for token, index in pairs))}


def train(trainer: Any, steps: int, record: Record, output_dir: Path) -> list[str]:
    """The Trainer's own train() for `steps` optimizer steps, ending with its checkpoint save; the files it wrote."""
    from transformers import Trainer

    args = trainer.args
    args.max_steps = steps
    args.save_strategy = type(args.save_strategy)("steps")
    args.save_steps = steps
    args.eval_strategy = type(args.eval_strategy)("no")
    args.load_best_model_at_end = False
    args.save_total_limit = None
    args.logging_steps = 1
    original = trainer.compute_loss
    micro = iter(range(1_000_000))

    def compute_loss(model: Any, inputs: Any, *rest: Any, **named: Any) -> Any:
        index = next(micro)
        record["progress"] = f"training step {trainer.state.global_step + 1} (micro-batch {index + 1})"
        record.facts["rows"].append(row_digests(inputs))
        record.save()
        return original(model, inputs, *rest, **named)

    trainer.compute_loss = compute_loss
    written: set[str] = set()
    root = str(output_dir)

    def audit(event: str, details: tuple[Any, ...]) -> None:
        if event != "open" or not written_to(details) or not isinstance(details[0], (str, os.PathLike)):
            return
        path = os.path.abspath(os.fspath(details[0]))
        if path.startswith(root) and "/logs/" not in path:
            written.add(os.path.relpath(path, root))

    watching = [True]
    sys.addaudithook(lambda event, details: audit(event, details) if watching[0] else None)
    try:
        with diagnosis.pipeline_part(TRAINING), unused_named(trainer):
            Trainer.train(trainer)
    finally:
        watching[0] = False
        trainer.compute_loss = original
    return sorted(written)


def written_to(details: tuple[Any, ...]) -> bool:
    """Whether an `open` audit event opens for writing (builtins.open gives a mode, os.open its flags)."""
    mode, flags = (*details, None, None)[1:3]
    if isinstance(mode, str):
        return any(letter in mode for letter in "wax+")
    return isinstance(flags, int) and bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))


@contextmanager
def unused_named(trainer: Any) -> Iterator[None]:
    """Put the names of the parameters DDP says got no gradient (it gives their indices) on its error."""
    try:
        yield
    except RuntimeError as error:
        found = re.search(r"did not receive grad for rank \d+: ([\d ]+)", str(error))
        wrapped = getattr(trainer.model_wrapped, "module", trainer.model)
        if found:
            names = [name for name, parameter in wrapped.named_parameters() if parameter.requires_grad]
            unused = [names[int(index)] for index in found.group(1).split() if int(index) < len(names)]
            error.unused_parameters = unused  # type: ignore[attr-defined]
        raise


def row_digests(inputs: Any) -> list[str]:
    """A digest of each row of a batch: its tensors along the batch axis, the padding left out."""
    import torch

    tensors = {name: value for name, value in dict(inputs).items() if torch.is_tensor(value) and value.dim() > 0}
    if not tensors:
        return []
    size = next(iter(tensors.values())).shape[0]
    mask = tensors.get("attention_mask")
    found = []
    for row in range(size):
        hasher = hashlib.blake2b(digest_size=8)
        for name in sorted(tensors):
            value = tensors[name]
            if value.shape[0] != size:
                continue
            part = value[row]
            if (
                mask is not None
                and name != "attention_mask"
                and mask.shape[0] == size
                and part.shape == mask[row].shape
            ):
                part = part[mask[row].bool()]
            hasher.update(name.encode())
            hasher.update(part.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        found.append(hasher.hexdigest())
    return found


def weight_digests(model: Any) -> dict[str, str]:
    import torch

    return {
        name: hashlib.blake2b(
            parameter.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes(), digest_size=8
        ).hexdigest()
        for name, parameter in model.named_parameters()
    }


def evaluate(trainer: Any) -> list[dict[str, Any]]:
    """One evaluation of each eval split through the Trainer's own evaluate(), and what compute_metrics received."""
    if trainer.eval_dataset is None:
        return []
    splits = trainer.eval_dataset if isinstance(trainer.eval_dataset, dict) else {"": trainer.eval_dataset}
    metric = trainer.compute_metrics
    found: list[dict[str, Any]] = []
    for name, split in splits.items():
        received: list[int] = []
        trainer.compute_metrics = _counting(metric, received) if metric is not None else None
        prefix = f"eval_{name}" if name else "eval"
        try:
            with diagnosis.pipeline_part("the Trainer's evaluation under torch.distributed"):
                metrics = trainer.evaluate(eval_dataset=split, metric_key_prefix=prefix)
        finally:
            trainer.compute_metrics = metric
        found.append(
            {
                "split": name,
                "prefix": prefix,
                "rows": count_rows(split),
                "received": received[0] if received else None,
                "metrics": {key: float(value) for key, value in metrics.items() if isinstance(value, (int, float))},
            }
        )
    return found


def _counting(metric: Any, received: list[int]) -> Any:
    """`metric`, noting how many predictions each call receives."""

    def compute_metrics(prediction: Any, *rest: Any, **named: Any) -> Any:
        received.append(_predicted_rows(prediction))
        return metric(prediction, *rest, **named)

    return compute_metrics


def count_rows(split: Any) -> int | None:
    try:
        return len(split)
    except TypeError:
        count = 0
        for count, _ in enumerate(iter(split), start=1):
            if count >= COUNT_ROWS:
                return None
        return count


def _predicted_rows(prediction: Any) -> int:
    for part in (prediction.label_ids, prediction.predictions):
        while isinstance(part, (tuple, list)) and part:
            part = part[0]
        if hasattr(part, "shape") and len(part.shape) > 0:
            return int(part.shape[0])
    return -1


def batch_loss(trainer: Any, path: Path) -> float | None:
    """The loss of the pytest process's fixed batch at this rank's trained weights, in eval mode."""
    import torch

    if not path.is_file():
        return None
    batch = torch.load(path, weights_only=False)
    family = families.family_of(trainer)
    with diagnosis.pipeline_part("the model's forward at the trained weights"):
        loss, _ = training.eval_loss(lambda model, inputs: family.loss(trainer, model, inputs), trainer.model, batch)
    return float(loss)


def digest(value: Any) -> str:
    """A digest of rows that is the same in every process for the same content (no object addresses, no order of
    hashing): dicts by sorted keys, images and arrays by their bytes."""
    hasher = hashlib.blake2b(digest_size=8)
    _feed(hasher, value)
    return hasher.hexdigest()


def _feed(hasher: Any, value: Any) -> None:
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            hasher.update(f"{key}=".encode())
            _feed(hasher, value[key])
    elif isinstance(value, (list, tuple)):
        hasher.update(b"[")
        for item in value:
            _feed(hasher, item)
        hasher.update(b"]")
    elif isinstance(value, (str, int, float, bool, bytes)) or value is None:
        hasher.update(repr(value).encode())
    elif hasattr(value, "tobytes"):  # numpy arrays, PIL images
        hasher.update(value.tobytes())
    elif hasattr(value, "detach"):  # tensors
        _feed(hasher, value.detach().cpu().numpy())
    else:
        hasher.update(type(value).__name__.encode())


def _values(row: Any) -> dict[str, Any]:
    """A row's columns as JSON can hold them: numbers and lists of numbers (cut to SHOWN_VALUES), others as text."""
    if not isinstance(row, dict):
        return {"row": _shown(row)}
    values: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, (int, float, bool, str)) or value is None:
            values[str(key)] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(item, (int, float)) for item in value):
            values[str(key)] = list(value[:SHOWN_VALUES])
        else:
            values[str(key)] = _shown(value)
    return values


def _shown(row: Any, width: int = 120) -> str:
    text = repr(row)
    return text if len(text) <= width else text[: width - 3] + "..."


def _backend() -> str | None:
    import torch.distributed as dist

    return dist.get_backend() if dist.is_available() and dist.is_initialized() else None


def _described(error: BaseException) -> dict[str, Any]:
    """The exception as the pytest process needs it: pickled when it can be, and its text and traceback."""
    try:
        pickled = pickle.dumps(error).hex()
        pickle.loads(bytes.fromhex(pickled))
    except Exception:
        pickled = None
    return {
        "type": type(error).__name__,
        "message": str(error),
        "part": diagnosis.part_of(error),
        "user": diagnosis.owned_by_pipeline(error) or isinstance(error, diagnosis.TrainerError),
        "rendered": error.render() if isinstance(error, diagnosis.TrainerError) else None,
        "pickled": pickled,
        "traceback": "".join(traceback.format_exception(error)),
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
