"""The judges of a `distributed` job (`judges`), on what the ranks of real two-process jobs recorded.

Each data file is a real job under torch.distributed.run on the CPU (gloo, 2 processes, 3 steps of the Trainer's own
train()), started by `processes.run` as the `distributed` item starts it, with a script of tests/e2e/test_distributed.py
(kept in the file's `script`); tests/unit/record.py regenerates them. No torch here: the judges read plain records.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

# One module a line, so that a module that moves is renamed with one sed.
from pytest_trainer import diagnosis
from pytest_trainer.distributed import judges, processes

DATA = Path(__file__).parent / "data"
#: The plugin's own folder, whose frames are not the user's.
PLUGIN = Path(diagnosis.__file__).resolve().parent


def recorded(name: str) -> dict[str, Any]:
    """A recorded job, the plugin's folder and the standard library's put back where this interpreter has them (its
    stacks' frames are told the user's from theirs by where they are)."""
    text = (DATA / f"{name}.json").read_text(encoding="utf-8")
    for placeholder, folder in (("{pytest_trainer}", PLUGIN), ("{stdlib}", sysconfig.get_paths()["stdlib"])):
        text = text.replace(placeholder, json.dumps(str(folder))[1:-1])
    return json.loads(text)


def ranks_of(name: str) -> processes.Ranks:
    """The `Ranks` of a recorded job, as `processes.run` returned them (torchrun's exits read from its own table)."""
    found = recorded(name)
    return processes.Ranks(
        records=found["records"],
        returncode=found["returncode"],
        timed_out=found["timed_out"],
        seconds=found["seconds"],
        output=found["output"],
        stacks={int(rank): stack for rank, stack in found["stacks"].items()},
        exits=processes.exits(found["failures"]),
    )


def stopped(name: str) -> diagnosis.TrainerError | None:
    return judges.why_stopped(ranks_of(name), 2)


def cause(failure: diagnosis.TrainerError | None) -> str:
    assert failure is not None, "the job's failure was not found"
    return failure.cause


# ---- a job that finished correctly: no judge says anything ------------------------------------------------------


def test_a_correct_job_is_not_stopped_and_no_finding_fires() -> None:
    """rank_good: the GOOD classifier of tests/e2e/test_distributed.py, which passes there (both ranks reach `done`)."""
    ranks = ranks_of("rank_good")
    assert [record["progress"] for record in ranks.records] == ["done", "done"]
    assert judges.why_stopped(ranks, 2) is None
    assert judges.different_data(ranks) is None
    judges.same_rows(ranks.records)
    judges.same_weights(ranks.records)
    judges.written_once(ranks.records)


def test_a_job_whose_ranks_each_trained_alone_is_named() -> None:
    """rank_good judged as a job of 3 processes: its Trainers saw world_size=2, which is not the job's size."""
    assert "the Trainer of rank 0 saw world_size=2, not 3" in cause(judges.why_stopped(ranks_of("rank_good"), 3))


# ---- a rank that died: the one that died first is named ----------------------------------------------------------


def test_a_killed_rank_is_named_when_its_peer_saw_it_go() -> None:
    """rank_killed: test_a_rank_that_dies_is_reported's script (rank 1 SIGKILLs itself in the data collator); rank 0
    recorded gloo's `Connection reset by peer`, a consequence that is never the cause."""
    ranks = ranks_of("rank_killed")
    assert judges.PEER_LOST.search(ranks.records[0]["error"]["message"])
    assert ranks.exits[1] == -9
    assert cause(judges.why_stopped(ranks, 2)).startswith("rank 1 of 2 died while")


def test_a_killed_rank_is_named_when_torchrun_stopped_its_busy_peer_first() -> None:
    """rank_killed_slow_peer: the same script, rank 0 busy for 5 s in the collator as on a loaded machine; torchrun
    saw rank 1 die (SIGKILL) and stopped rank 0 (SIGTERM) before it met rank 1 in a collective. Neither rank recorded
    an error, so the records alone name rank 0 (the e2e flake); torchrun's table of exits tells them apart."""
    ranks = ranks_of("rank_killed_slow_peer")
    assert all(record["progress"] != "done" and not record.get("error") for record in ranks.records)
    assert ranks.exits == {1: -9, 0: -15}  # the first observed failure first
    assert judges.died_first(ranks.records, {})["rank"] == 0, "without torchrun's account the records mislead"
    assert cause(judges.why_stopped(ranks, 2)).startswith("rank 1 of 2 died while")


def test_torchruns_table_of_exits_is_read_from_its_last_lines() -> None:
    """The table torchrun prints as it exits, recorded in rank_killed: rank 1 killed, rank 0 stopped by torchrun."""
    table = recorded("rank_killed")["failures"]
    assert processes.exits(table) == {1: -9, 0: -15}
    assert list(processes.exits(table)) == [1, 0]
    assert processes.exits(recorded("rank_good")["failures"]) == {}


def test_the_rank_torchrun_observed_failing_first_is_named_among_ranks_that_died_alike() -> None:
    """rank_killed_slow_peer's records, with neither exit a SIGTERM of torchrun's: its first observed failure wins."""
    records = recorded("rank_killed_slow_peer")["records"]
    assert judges.died_first(records, {1: -9, 0: -9})["rank"] == 1
    assert judges.died_first(records, {0: -9, 1: -9})["rank"] == 0


def test_a_rank_that_raised_is_named_with_its_own_error_not_its_peers() -> None:
    """rank_raises: rank 1's collator raises ValueError("row without a label"); rank 0 then loses its peer."""
    ranks = ranks_of("rank_raises")
    found = judges.why_stopped(ranks, 2)
    first = cause(found)
    assert first.startswith("rank 1: "), first
    assert "ValueError: row without a label" in first
    assert "rank 0" not in first.split("(")[0]
    assert any("row without a label" in line for line in found.details)  # the rank's own traceback


def test_a_rank_that_raised_is_explained_by_the_pipelines_explanation_where_there_is_one() -> None:
    """rank_raises, with an `explain` that knows the error (as explanations.pipeline_rows.explain does from the pipeline's facts)."""

    def explain(error: BaseException) -> diagnosis.PipelineFailure | None:
        if isinstance(error, ValueError):
            return diagnosis.PipelineFailure("a row has no label", "give every row a label")
        return None

    found = judges.why_stopped(ranks_of("rank_raises"), 2, explain)
    assert cause(found).startswith("rank 1: a row has no label")
    assert found.fix == "give every row a label"


# ---- ranks that built different data ---------------------------------------------------------------------------


def test_ranks_that_built_different_splits_are_named_first() -> None:
    """rank_different_data: UNSEEDED_SPLIT of tests/e2e/test_distributed.py, train_test_split without a seed."""
    ranks = ranks_of("rank_different_data")
    found = judges.different_data(ranks)
    first = cause(found)
    assert first.startswith("the 2 processes built different data from the same script (the train split"), first
    assert any(
        line.startswith("the train split: rank 0 built 30 rows") and "rank 1 built 30 rows" in line
        for line in found.details
    ), found.details
    assert "train_test_split(seed=42)" in found.fix
    assert cause(judges.why_stopped(ranks, 2)) == first  # it comes before anything else the job shows


def test_the_first_row_ranks_built_differently_is_shown_value_by_value() -> None:
    found = judges.different_data(ranks_of("rank_different_data"))
    at = found.details.index("  the first row that differs, row 0 of the rows read:")
    assert found.details[at - 1].startswith("the train split: rank 0 built 30 rows; rank 1 built 30 rows")
    assert re.fullmatch(r"    input_ids from position \d+: rank 0 \[.*\], rank 1 \[.*\]", found.details[at + 2])


def test_ranks_that_built_different_tokenizers_are_named_with_their_cause() -> None:
    """rank_good, its rank 1 recording another vocabulary (as a tokenizer trained at start-up does)."""
    ranks = ranks_of("rank_good")
    ranks.records[1]["data"]["tokenizer"] = {"size": 25, "digest": "another"}
    found = judges.different_data(ranks)
    size = ranks.records[0]["data"]["tokenizer"]["size"]
    assert cause(found).startswith(
        f"the 2 processes built different tokenizers from the same script (the tokenizer: rank 0 has a vocabulary of "
        f"{size} tokens, rank 1 one of 25, with other ids): a tokenizer or vocabulary built at start-up"
    )
    assert "tokenizer.save_pretrained('tokenizer')" in found.fix


def test_ranks_that_built_the_same_data_raise_no_alarm() -> None:
    """rank_good: both ranks digest the same rows, label maps and batches per epoch."""
    assert judges.different_data(ranks_of("rank_good")) is None


def test_different_batches_per_epoch_are_named() -> None:
    """rank_good, its rank 1 recording one batch more per epoch than rank 0 (as a rank with more rows would)."""
    ranks = ranks_of("rank_good")
    ranks.records[1]["data"]["batches_per_epoch"] += 1
    found = judges.different_data(ranks)
    assert any(line.startswith("an epoch: rank 0 takes 2 batches, rank 1 3") for line in found.details)


# ---- a rank that hung ------------------------------------------------------------------------------------------


def test_a_hung_rank_is_named_where_it_waits_in_the_users_code() -> None:
    """rank_hangs: rank 1 waits in a callback's on_step_end for a file rank 0 never writes; the job timed out and
    processes.run asked each rank for its stack (faulthandler) before killing them."""
    ranks = ranks_of("rank_hangs")
    assert ranks.timed_out
    found = judges.why_stopped(ranks, 2)
    first = cause(found)
    assert re.match(r"rank 1 of 2 hung while training step \d", first), first
    text = "\n".join(found.details)
    assert re.search(r"rank 1 waits at:\n\s+\S*train.py:\d+ in on_step_end", text), text
    assert "rank 0 waits at" not in text  # rank 0 waits in the libraries (a collective): not where the user looks


def test_the_users_frames_are_told_from_the_libraries() -> None:
    """rank_hangs' stacks: rank 1's innermost frames include the script; rank 0's are all libraries'."""
    stacks = {int(rank): stack for rank, stack in recorded("rank_hangs")["stacks"].items()}
    mine = {rank: judges.users_frames(stack) for rank, stack in stacks.items()}
    assert mine[1] and all("train.py" in frame for frame in mine[1])
    assert mine[0] == []
    assert judges._frames(stacks[0]), "rank 0's stack was recorded"


# ---- a job that finished with a defect ----------------------------------------------------------------------------


def test_weights_that_drift_apart_are_named() -> None:
    """rank_drifts: a parameter updated in forward from each rank's own batch (Centred of tests/e2e/test_distributed.py)."""
    records = ranks_of("rank_drifts").records
    with pytest.raises(diagnosis.Finding) as found:
        judges.same_weights(records)
    assert "ranks hold different weights: 1 parameters differ from rank 0's (centre)" in found.value.cause


def test_a_file_written_by_every_rank_is_named() -> None:
    """rank_writes_twice: a callback saves the config on every rank."""
    records = ranks_of("rank_writes_twice").records
    with pytest.raises(diagnosis.Finding) as found:
        judges.written_once(records)
    assert "export/config.json (ranks 0, 1)" in found.value.cause


def test_ranks_that_trained_on_the_same_rows_are_named() -> None:
    """rank_same_rows: a get_train_dataloader of the script's own, without a DistributedSampler."""
    records = ranks_of("rank_same_rows").records
    with pytest.raises(diagnosis.Finding) as found:
        judges.same_rows(records)
    assert "every one of the 2 ranks trained on the same rows at each of the 3 micro-batches" in found.value.cause


def test_a_finished_defective_job_is_not_reported_as_stopped() -> None:
    """The jobs that finished with a defect (drift, a file written twice, the same rows): each rank reached `done`."""
    for name in ("rank_drifts", "rank_writes_twice", "rank_same_rows"):
        assert judges.why_stopped(ranks_of(name), 2) is None, name


def test_a_state_dict_that_round_trips_through_fsdp_is_a_note() -> None:
    """rank_fsdp: a tied Llama whose script asks for FSDP; each rank round-tripped its state dict through fully_shard."""
    notes = judges.sharded(ranks_of("rank_fsdp").records)
    assert (
        len(notes) == 1 and "round-trips through fully_shard" in notes[0] and "2 units of LlamaDecoderLayer" in notes[0]
    )
    assert judges.sharded(ranks_of("rank_good").records) == []  # no FSDP asked for: nothing said


def test_a_state_dict_that_does_not_survive_fsdp_is_named() -> None:
    """rank_fsdp, its rank 0 recording a tensor that differs after the sharded save and a full reload."""
    records = ranks_of("rank_fsdp").records
    records[0]["sharding"]["reload_differs"] = ["lm_head.weight"]
    with pytest.raises(diagnosis.Finding) as found:
        judges.sharded(records)
    assert "does not survive FSDP" in found.value.cause and "1 tensors differ" in found.value.cause


# ---- no torch ---------------------------------------------------------------------------------------------------


def test_judging_the_recorded_jobs_imports_no_torch() -> None:
    """The judges' paths the tests take, in a fresh interpreter: an exception unpickled, a hang, a death."""
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import test_rank_judges as t; "
        "[t.stopped(name) for name in ('rank_raises', 'rank_hangs', 'rank_killed_slow_peer', 'rank_different_data')]; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    checked = subprocess.run(
        [sys.executable, "-c", script, str(Path(__file__).parent)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stderr
