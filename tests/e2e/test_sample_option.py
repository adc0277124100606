"""--trainer-sample cuts what load_dataset returns before the script maps it; --trainer-batch-size sets the batch."""

from __future__ import annotations

import json

import pytest
from pipeline_runs import failures, run_script, write

JSON_SCRIPT = """
    import tiny
    from datasets import load_dataset
    from transformers import Trainer, TrainingArguments

    calls = []
    raw = load_dataset("json", data_files={"train": "rows.jsonl"})
    tok = tiny.tokenizer()

    def tokenize(batch):
        calls.append(len(batch["text"]))
        return tok(batch["text"], truncation=True)

    data = raw.map(tokenize, batched=True, remove_columns=["text"])
    print("ROWS MAPPED", sum(calls))
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8)
    trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=data["train"], processing_class=tok)
    trainer.train()
"""


@pytest.fixture
def thousand_rows(project: pytest.Pytester) -> pytest.Pytester:
    rows = [{"text": "the cat sat on the mat " * (1 + i % 5), "label": i % 3} for i in range(1000)]
    (project.path / "rows.jsonl").write_text("\n".join(json.dumps(row) for row in rows))
    write(project, "train.py", JSON_SCRIPT)
    return project


def test_load_dataset_is_cut_before_the_script_maps_it(thousand_rows: pytest.Pytester) -> None:
    result = run_script(thousand_rows, "--trainer-stages=dataset", "-s")
    result.assert_outcomes(passed=2)  # load and dataset
    result.stdout.fnmatch_lines(["*ROWS MAPPED 256*"])


def test_sample_zero_keeps_every_row(thousand_rows: pytest.Pytester) -> None:
    result = run_script(thousand_rows, "--trainer-stages=dataset", "--trainer-sample=0", "-s")
    result.stdout.fnmatch_lines(["*ROWS MAPPED 1000*"])


def test_a_bad_row_beyond_the_sample_is_out_of_reach_but_within_it_is_found(thousand_rows: pytest.Pytester) -> None:
    rows = (thousand_rows.path / "rows.jsonl").read_text().splitlines()
    rows[700] = json.dumps({"text": "the cat", "label": 7})
    (thousand_rows.path / "rows.jsonl").write_text("\n".join(rows))
    assert failures(run_script(thousand_rows, "--trainer-stages=dataset")) == []
    result = run_script(thousand_rows, "--trainer-stages=dataset", "--trainer-sample=1000")
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(["*labels range 0..7 (8 classes) but the model has 3 outputs (row 700 of the *"])


def test_batch_size_option_sets_the_fixed_batch(thousand_rows: pytest.Pytester) -> None:
    thousand_rows.makepyfile(
        test_batch="""
        import pytest

        @pytest.mark.trainer_pipeline(module="train.py", stages=["collate"], devices=["cpu"])
        def test_size(train_batch):
            assert train_batch["input_ids"].shape[0] == 3
    """
    )
    thousand_rows.runpytest("test_batch.py", "--trainer-batch-size=3").assert_outcomes(passed=1)


def test_the_sample_spreads_over_the_split_so_its_last_rows_are_read(thousand_rows: pytest.Pytester) -> None:
    # A file sorted by class: only its last row has class 7, which the first 256 rows would never show.
    rows = (thousand_rows.path / "rows.jsonl").read_text().splitlines()
    rows[999] = json.dumps({"text": "the cat", "label": 7})
    (thousand_rows.path / "rows.jsonl").write_text("\n".join(rows))
    result = run_script(thousand_rows, "--trainer-stages=dataset", "--trainer-report=report.json")
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(["*labels range 0..7 (8 classes) but the model has 3 outputs*"])
    notes = [
        note for item in json.loads((thousand_rows.path / "report.json").read_text())["items"] for note in item["notes"]
    ]
    assert any("256 of 1000 rows, evenly spaced" in note for note in notes), notes
