"""What the ranks of a `distributed` job recorded (`processes.Ranks`), judged: each defect with its cause and fix.

Read in the order a reader needs them: ranks that built different data come first (they explain most hangs and
mismatches), then the error that stopped a rank, a rank that hung or died, and, for a job that finished, the
findings that spoil a run without stopping it: the same rows on every rank, weights that drift apart, an evaluation
that counts rows twice, a file written by several ranks, a checkpoint that does not reload to the trained weights,
and a state dict that does not survive sharding.
"""

from __future__ import annotations

import math
import pickle
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_trainer import diagnosis, frames
from pytest_trainer.catalogue import PROCESSES, checks
from pytest_trainer.explanations import pipeline_rows

if TYPE_CHECKING:
    from pytest_trainer.distributed.processes import Job, Ranks
    from pytest_trainer.pipeline import Pipeline

#: Relative difference allowed between the metrics of the distributed evaluation and a one-process one, and between
#: the trained loss and the reloaded checkpoint's (batches are padded and summed in another order).
TOLERANCE = 1e-3
#: Metrics the Trainer adds itself: timings and the epoch differ between any two runs.
TRAINER_METRICS = ("_runtime", "_samples_per_second", "_steps_per_second", "epoch", "_loss")
#: What usually makes a rank wait forever, said where one did.
HANG_CAUSES = (
    "ranks that take a different number of steps (data of different lengths per rank), a forward that "
    "uses other parameters on other ranks while find_unused_parameters is off, or code that only some "
    "ranks run (under `if rank == 0:`) calling evaluate(), save or a barrier"
)


#: What a rank raises when another one is gone: a consequence, never the cause.
PEER_LOST = re.compile(r"Connection (reset|closed) by peer|Broken pipe|communicator was aborted|Socket Timeout")


def stopped(pipeline: Pipeline, ranks: Ranks, job: Job) -> None:
    """Raise the reason the job did not finish: different data, an error, a hang or a death (in that order)."""
    __tracebackhide__ = True
    failure = why_stopped(ranks, job.processes, lambda error: pipeline_rows.explain(error, pipeline))
    if failure is not None:
        raise failure


@checks("distributed", reads=PROCESSES)
def why_stopped(
    ranks: Ranks,
    processes: int,
    explain: Callable[[BaseException], diagnosis.PipelineFailure | None] | None = None,
) -> diagnosis.TrainerError | None:
    """The reason a job of `processes` ranks did not finish, from what they recorded: different data, an error, a
    hang or a death (in that order); None where it finished. `explain` names the cause of a rank's exception from
    the pipeline's facts (None where it cannot)."""
    data = different_data(ranks)
    errors = ranks.errors()
    own = [(rank, error) for rank, error in errors if not PEER_LOST.search(error["message"])]
    if own:
        failure = _error(explain, *own[0], [rank for rank, _ in errors if rank != own[0][0]])
        return _with(failure, data)
    if ranks.timed_out:
        return _with(_hang(ranks, processes), data)
    unfinished = [record for record in ranks.records if record.get("progress") != "done" and not record.get("error")]
    if unfinished or ranks.returncode:
        record = died_first(unfinished, ranks.exits) if unfinished else ranks.records[0]
        failure = diagnosis.PipelineFailure(
            f"rank {record['rank']} of {processes} died while {record.get('progress', 'starting')} "
            f"(torchrun exited with {ranks.returncode})",
            "a process killed from outside is most often out of memory: give each rank less (a smaller "
            "per_device_train_batch_size) or fewer processes (--trainer-processes)",
            ["torchrun's last lines:", *(f"  | {line}" for line in ranks.output)],
        )
        return _with(failure, data)
    if data is not None:
        return data
    alone = [record["rank"] for record in ranks.records if (record.get("engine") or {}).get("world_size") != processes]
    if alone:
        engine = ranks.records[alone[0]].get("engine") or {}
        return diagnosis.PipelineFailure(
            f"the Trainer of rank {alone[0]} saw world_size={engine.get('world_size')}, not {processes}: each "
            "process trained alone, so nothing of several processes was exercised",
            "let the TrainingArguments read the process group torch.distributed.run sets up (do not set "
            "local_rank or use_cpu against it); on the CPU this needs ACCELERATE_USE_CPU=true, which pytest-trainer "
            "sets",
        )
    return None


def died_first(unfinished: list[dict[str, Any]], exits: dict[int, int]) -> dict[str, Any]:
    """Of the ranks that stopped without recording an error, the record of the one that died first.

    Once a rank dies, torchrun stops the others with SIGTERM, and a rank stopped that way before it noticed its peer
    was gone (busy elsewhere than in a collective, as on a loaded machine) records no error either: so the ranks
    torchrun stopped itself are not the cause (`exits`: how torchrun says each rank ended, -15 for its SIGTERM), and
    of the others the one torchrun observed failing first is."""
    stopped = {rank for rank, code in exits.items() if code == -signal.SIGTERM}
    dead = [record for record in unfinished if record["rank"] not in stopped] or unfinished
    order = list(exits)
    return min(dead, key=lambda record: order.index(record["rank"]) if record["rank"] in order else len(order))


@checks("distributed", reads=PROCESSES)
def different_data(ranks: Ranks) -> diagnosis.PipelineFailure | None:
    """The ranks built different rows, tokenizers, label maps or epochs; None when they agree (or too few recorded
    it). The first row that differs is shown value by value where both ranks recorded it."""
    built = [(record["rank"], record["data"]) for record in ranks.records if record.get("data")]
    if len(built) < 2:
        return None
    (first, reference), differing = built[0], []
    tokenizers = None
    for rank, data in built[1:]:
        mine, theirs = reference.get("tokenizer"), data.get("tokenizer")
        if mine and theirs and mine["digest"] != theirs["digest"] and tokenizers is None:
            tokenizers = (
                f"the tokenizer: rank {first} has a vocabulary of {mine['size']} tokens, rank {rank} one of "
                f"{theirs['size']}, with other ids"
            )
            differing.append(tokenizers)
        for name, split in reference["splits"].items():
            other = data["splits"].get(name)
            if other is None or other["rows"] != split["rows"] or other["digest"] != split["digest"]:
                shown = other or {"rows": "none", "first": ""}
                row = first_difference((first, split), (rank, other or {}))
                firsts = ("", "") if row else (f", first {split['first']}", f", first {shown['first']}")
                differing.append(
                    f"the {name} split: rank {first} built {split['rows']} rows{firsts[0]}; "
                    f"rank {rank} built {shown['rows']} rows{firsts[1]}"
                )
                differing += row
        for key, value in reference["labels"].items():
            if data["labels"].get(key) != value:
                differing.append(
                    f"the model's {key}: rank {first} has {value}, rank {rank} has {data['labels'].get(key)}"
                )
        if data.get("batches_per_epoch") != reference.get("batches_per_epoch"):
            differing.append(
                f"an epoch: rank {first} takes {reference.get('batches_per_epoch')} batches, rank {rank} "
                f"{data.get('batches_per_epoch')}, so a rank waits for the others at a step they never "
                "take"
            )
    if not differing:
        return None
    if tokenizers is not None:
        return diagnosis.PipelineFailure(
            f"the {len(built)} processes built different tokenizers from the same script ({tokenizers}): a "
            "tokenizer or vocabulary built at start-up (trained with the tokenizers library, or a vocabulary made "
            "from a set of words) comes out different in each process, and so does every row tokenized with it",
            "build the tokenizer once, save it (tokenizer.save_pretrained('tokenizer')) and load it in the script "
            "(AutoTokenizer.from_pretrained('tokenizer')); where it must be built at start-up, build it from sorted "
            "words (sorted(set(words))) so every process gets the same ids",
            differing,
        )
    return diagnosis.PipelineFailure(
        f"the {len(built)} processes built different data from the same script ({differing[0].split(':')[0]}): each "
        "rank runs the script in a fresh interpreter, and something in it differs between two: randomness drawn "
        "before the Trainer seeds it (a split or shuffle made before Trainer(...) is built: each process of a "
        "torchrun job starts from its own random state), the order of a set of strings, which changes with "
        "each interpreter's hash seed, or a tokenizer or vocabulary built at start-up",
        "make the data the same in every process: seed shuffles and splits (dataset.shuffle(seed=42), "
        "train_test_split(seed=42)), call set_seed(...) before building it, and sort a set before making a label "
        "map or a vocabulary from it (sorted(set(labels)))",
        differing,
    )


def first_difference(one: tuple[int, dict[str, Any]], other: tuple[int, dict[str, Any]]) -> list[str]:
    """The first row of a split that two ranks built differently, column by column where both recorded its values
    (for a list, from the first position where they differ); nothing where they did not record them."""
    (rank, split), (peer, theirs) = one, other
    pairs = list(zip(split.get("digests") or [], theirs.get("digests") or [], strict=False))
    index = next((index for index, (mine, their) in enumerate(pairs) if mine != their), None)
    if index is None:
        return []
    shown, seen = split.get("shown") or [], theirs.get("shown") or []
    if index >= min(len(shown), len(seen)):
        return []
    lines = [f"  the first row that differs, row {index} of the rows read:"]
    for column, value in shown[index].items():
        their = seen[index].get(column)
        if value == their:
            continue
        if isinstance(value, list) and isinstance(their, list):
            paired = enumerate(zip(value, their, strict=False))
            start = next((at for at, (a, b) in paired if a != b), min(len(value), len(their)))
            lines.append(
                f"    {column} from position {start}: rank {rank} {value[start : start + 12]}, rank {peer} "
                f"{their[start : start + 12]}"
            )
        else:
            lines.append(f"    {column}: rank {rank} {value!r}, rank {peer} {their!r}")
    return lines


def findings(pipeline: Pipeline, ranks: Ranks, job: Job) -> list[str]:
    """Check a finished job; raise its findings together; return the notes of what passed."""
    __tracebackhide__ = True
    records = ranks.records
    notes: list[str] = []
    checks: list[Callable[[], object]] = [
        lambda: same_rows(records),
        lambda: same_weights(records),
        lambda: notes.extend(evaluation(pipeline, records)),
        lambda: written_once(records),
        lambda: notes.extend(reloaded(pipeline, records, job)),
        lambda: notes.extend(sharded(records)),
    ]
    diagnosis.findings_last(checks)
    return notes


@checks("distributed", reads=PROCESSES)
def same_rows(records: list[dict[str, Any]]) -> None:
    """Fail when every rank trained on rank 0's rows at every micro-batch: the data is not split between them."""
    steps = [record.get("rows") or [] for record in records]
    if len(steps) < 2 or not steps[0] or any(len(rows) != len(steps[0]) for rows in steps):
        return
    if any(sorted(rows) != sorted(steps[0][index]) for other in steps[1:] for index, rows in enumerate(other)):
        return
    distinct = {row for rows in steps[0] for row in rows}
    if len(distinct) <= 1:
        return  # one row, repeated: there is nothing to split
    raise diagnosis.Finding(
        f"every one of the {len(records)} ranks trained on the same rows at each of the {len(steps[0])} micro-batches: "
        "the training data is not split between the processes, so a run on N GPUs trains N times on each batch and "
        "takes N times as long for no more data",
        "let the Trainer build the dataloader (a get_train_dataloader or _get_train_sampler of your own must shard "
        "with a DistributedSampler, or accelerator.prepare the dataloader); for a stream already split per process, "
        "use datasets.distributed.split_dataset_by_node",
    )


@checks("distributed", reads=PROCESSES)
def same_weights(records: list[dict[str, Any]]) -> None:
    """After the same steps every rank holds rank 0's weights: nothing changes a parameter outside the averaged step."""
    reference = records[0].get("weights") or {}
    differing: dict[str, list[int]] = {}
    for record in records[1:]:
        for name, value in (record.get("weights") or {}).items():
            if reference.get(name) != value:
                differing.setdefault(name, []).append(record["rank"])
    if not differing:
        return
    names = sorted(differing)
    raise diagnosis.Finding(
        f"after the same steps the ranks hold different weights: {len(names)} parameters differ from rank 0's "
        f"({', '.join(names[:6])}{' ...' if len(names) > 6 else ''}): DDP averages gradients, so a parameter that "
        "drifts apart is changed outside the optimizer step (in the forward, a callback or a hook) from data of "
        "each rank's own, and the checkpoint keeps only rank 0's",
        "update such a value from the averaged gradients only (make it a trained parameter), or register it as a "
        "buffer and average it across ranks yourself (torch.distributed.all_reduce) before using it",
    )


@checks("distributed", reads=PROCESSES)
def evaluation(pipeline: Pipeline, records: list[dict[str, Any]]) -> list[str]:
    """Each evaluation split's rows reach compute_metrics once: as many predictions as rows, none counted twice."""
    notes: list[str] = []
    for found in records[0].get("evaluations") or []:
        rows, received = found.get("rows"), found.get("received")
        split = f"the eval split {found['split']!r}" if found["split"] else "the eval split"
        if received is None or rows is None:
            continue
        if received != rows:
            args = pipeline.trainer.args
            dispatch = getattr(getattr(args, "accelerator_config", None), "dispatch_batches", None)
            raise diagnosis.Finding(
                f"compute_metrics received {received} predictions for the {rows} rows of {split}: with several "
                "processes, rows are counted twice (or dropped) where the evaluation cannot tell the padding the "
                "ranks added to even out their batches, so the metric is computed on other rows than the split's",
                "give evaluation a map-style dataset (Dataset, not IterableDataset)"
                + (
                    ", or leave accelerator_config's dispatch_batches at its default for a stream"
                    if dispatch is False
                    else ", or an eval set whose size is a multiple of processes x per_device_eval_batch_size"
                ),
            )
        notes.append(f"distributed evaluation: compute_metrics received {received} predictions for {rows} rows")
    return notes


@checks("distributed", reads=PROCESSES)
def written_once(records: list[dict[str, Any]]) -> None:
    """Each file of the output folder is written by one rank: the processes do not race on a file."""
    writers: dict[str, list[int]] = {}
    for record in records:
        for path in record.get("written") or []:
            writers.setdefault(path, []).append(record["rank"])
    shared = {path: ranks for path, ranks in writers.items() if len(ranks) > 1}
    if not shared:
        return
    shown = [f"{path} (ranks {', '.join(map(str, ranks))})" for path, ranks in sorted(shared.items())]
    raise diagnosis.Finding(
        f"{len(shared)} files of the output folder were written by several ranks at once, e.g. {shown[0]}: the "
        "processes race on the same file, which can leave it cut short or mixed",
        "write from the main process only: `if trainer.is_world_process_zero():` (in a callback, "
        "`if state.is_world_process_zero:`), or use trainer.save_model(), which saves on the main process",
        shown[1:6],
    )


@checks("distributed", reads=PROCESSES)
def reloaded(pipeline: Pipeline, records: list[dict[str, Any]], job: Job) -> list[str]:
    """Load the checkpoint into this process's Trainer: the fixed batch's loss must be the trained one, and a
    one-process evaluation must give the metrics of the distributed one."""
    trained = records[0].get("loss")
    checkpoint = _checkpoint(job.output_dir, job.steps)
    if checkpoint is None:
        raise diagnosis.Finding(
            f"the Trainer's train() saved no checkpoint-{job.steps} under several processes",
            "let the Trainer save on its main process (a save or _save of your own must call super())",
        )
    trainer, notes = pipeline.trainer, [f"checkpoint saved once: {checkpoint.name}"]
    model = pipeline.model_on("cpu")
    with pipeline.weights_kept(model):
        with diagnosis.pipeline_part("reloading the checkpoint the distributed run saved"):
            trainer._load_from_checkpoint(str(checkpoint))
        if trained is not None:
            loss = float(pipeline.eval_loss(model, pipeline.batches.first_on("cpu"))[0])
            if not _close(loss, trained):
                raise diagnosis.Finding(
                    f"the checkpoint {checkpoint.name} does not reload to the trained weights: the fixed batch's loss "
                    f"is {trained:.6g} at the end of the distributed run and {loss:.6g} once the checkpoint is loaded",
                    "save the model the Trainer trained (trainer.save_model, or the unwrapped model's "
                    "save_pretrained on the main process), and keep every trained parameter in its state dict",
                )
            notes.append(f"checkpoint reloads to the trained loss ({trained:.4g})")
        for found in records[0].get("evaluations") or []:
            notes.extend(_one_process(pipeline, found))
    return notes


def _one_process(pipeline: Pipeline, found: dict[str, Any]) -> list[str]:
    metrics = {key: value for key, value in found["metrics"].items() if not key.endswith(TRAINER_METRICS)}
    if not metrics or found.get("received") != found.get("rows"):
        return []
    trainer = pipeline.trainer
    splits = trainer.eval_dataset if isinstance(trainer.eval_dataset, dict) else {"": trainer.eval_dataset}
    with diagnosis.pipeline_part("the Trainer's evaluation in one process"):
        alone = trainer.evaluate(eval_dataset=splits[found["split"]], metric_key_prefix=found["prefix"])
    moved = {
        key: (value, alone.get(key))
        for key, value in metrics.items()
        if not isinstance(alone.get(key), (int, float)) or not _close(float(alone[key]), value)
    }
    if moved:
        shown = ", ".join(
            f"{key} {value:.6g} with several processes, {one} in one" for key, (value, one) in moved.items()
        )
        raise diagnosis.Finding(
            f"the metrics of the distributed evaluation differ from a one-process evaluation of the same weights: "
            f"{shown}",
            "compute the metric from what compute_metrics receives only (the gathered predictions and labels), not "
            "from state kept in each process, and give evaluation a map-style dataset",
        )
    return [f"distributed evaluation gives the one-process metrics ({', '.join(sorted(metrics))})"]


@checks("distributed", reads=PROCESSES)
def sharded(records: list[dict[str, Any]]) -> list[str]:
    """The model's state dict survives FSDP: a sharded save reloads whole, and the full state dict is the model's."""
    found = records[0].get("sharding")
    if not found:
        return []
    wrong = [
        f"{len(found[key])} {what}: {', '.join(found[key][:5])}"
        for key, what in (
            ("reload_differs", "tensors differ after a sharded save and a full reload"),
            ("full_missing", "tensors of the model are missing from FSDP's full state dict"),
            ("full_extra", "tensors of FSDP's full state dict are not the model's"),
            ("full_differs", "tensors of FSDP's full state dict differ from the model's"),
        )
        if found.get(key)
    ]
    if wrong:
        raise diagnosis.Finding(
            f"the model's state dict does not survive FSDP (fully_shard over {', '.join(found['layers'])}): "
            + "; ".join(wrong),
            "keep every tensor the model saves a parameter or a persistent buffer of the module that uses it, and tie "
            "weights through the model's own tie_weights()",
        )
    return [
        f"FSDP: the state dict round-trips through fully_shard on gloo ({found['sharded_units']} units of "
        f"{', '.join(found['layers'])}, sharded save, full reload)"
    ]


def _error(
    explain: Callable[[BaseException], diagnosis.PipelineFailure | None] | None,
    rank: int,
    error: dict[str, Any],
    others: list[int],
) -> diagnosis.TrainerError:
    also = f" (ranks {', '.join(map(str, others))} stopped too)" if others else ""
    original = _unpickled(error)
    if not error.get("user"):
        return _internal(diagnosis.InternalError("distributed", original or RuntimeError(error["message"])), error)
    if error.get("rendered") and original is None:
        cause, _, rest = error["rendered"].partition("\n  fix: ")
        fix, *details = rest.split("\n")
        return diagnosis.PipelineFailure(f"rank {rank}: {cause}{also}", fix, details)
    explained = explain(original) if original is not None and explain is not None else None
    if explained is None:
        part = error.get("part") or "the script under torch.distributed"
        explained = diagnosis.raised_by(original or RuntimeError(error["message"]), part)
    failure = diagnosis.PipelineFailure(
        f"rank {rank}: {explained.cause}{also}", explained.fix, [*explained.details, *_traceback(error)]
    )
    failure.unexplained = explained.unexplained
    return failure


def _internal(internal: diagnosis.InternalError, error: dict[str, Any]) -> diagnosis.InternalError:
    internal.details = tuple(_traceback(error, lines=40))
    internal.args = (internal.render(),)
    return internal


def _traceback(error: dict[str, Any], lines: int = 12) -> list[str]:
    text = [line for line in error.get("traceback", "").splitlines() if line.strip()]
    return ["the rank's traceback (last lines):", *(f"  | {line}" for line in text[-lines:])]


def _unpickled(error: dict[str, Any]) -> BaseException | None:
    if not error.get("pickled"):
        return None
    try:
        found = pickle.loads(bytes.fromhex(error["pickled"]))
    except Exception:
        return None
    return found if isinstance(found, BaseException) else None


def _hang(ranks: Ranks, processes: int) -> diagnosis.PipelineFailure:
    """Name the rank that hung: the one stopped in the user's own code, else the one that got least far."""
    records = ranks.records
    where = {record["rank"]: record.get("progress", "not started") for record in records}
    dumped = {rank: _frames(ranks.stacks.get(rank, "")) for rank in where}
    mine = {rank: users_frames(ranks.stacks.get(rank, "")) for rank in where}
    behind = min(records, key=lambda record: len(record.get("rows") or []))["rank"]
    rank = next((rank for rank in where if mine[rank]), behind)
    details = [f"rank {other}: {progress}" for other, progress in where.items()]
    if mine[rank]:
        details += [f"rank {rank} waits at:", *(f"  {frame}" for frame in mine[rank][:4])]
    for other in where:
        if other != rank and dumped[other]:
            details.append(f"rank {other} waits in {dumped[other][0][1]}")
    return diagnosis.PipelineFailure(
        f"rank {rank} of {processes} hung while {where.get(rank)}: the job did not finish within "
        f"{ranks.seconds:.0f} s; in a real run the other ranks wait for it until the process group times out "
        "(30 minutes by default)",
        f"look for what makes the ranks disagree: {HANG_CAUSES}",
        details,
    )


def _frames(stack: str) -> list[tuple[str, str]]:
    """The frames of a faulthandler dump, innermost first: (path, `path:line in function`)."""
    return [
        (path, f"{path}:{line} in {name}")
        for path, line, name in re.findall(r'File "([^"]+)", line (\d+) in (\S+)', stack)
        if not path.startswith("<")
    ]


def users_frames(stack: str) -> list[str]:
    """The frames of a dump that run the user's code (the script or a file of theirs), innermost first."""
    return [shown for path, shown in _frames(stack) if frames.is_users(path)]


def _with(failure: diagnosis.TrainerError, data: diagnosis.PipelineFailure | None) -> diagnosis.TrainerError:
    """The different data first: it is what makes most ranks raise, hang or die."""
    if data is None or isinstance(failure, diagnosis.InternalError):
        return failure
    details = [*data.details, f"then: {failure.cause}", *(f"  {line}" for line in failure.details[:6])]
    return diagnosis.PipelineFailure(data.cause, data.fix, details)


def _checkpoint(output: Path, steps: int) -> Path | None:
    found = output / f"checkpoint-{steps}"
    return found if found.is_dir() else None


def _close(value: float, reference: float) -> bool:
    return math.isclose(value, reference, rel_tol=TOLERANCE, abs_tol=1e-6)
