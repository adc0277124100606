"""`eval` of a Seq2SeqTrainer that generates (`predict_with_generate`): the length it generates against the length of
the references its metrics compare the predictions with."""

from __future__ import annotations

import json
import re

import pytest
from pipeline_runs import failures, run_script, write

#: A tiny T5 that learns to repeat a sentence twice: its targets run to about 40 tokens.
SCRIPT = """
    import tiny
    from datasets import Dataset
    from transformers import (DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments, T5Config,
                              T5ForConditionalGeneration)

    tok = tiny.tokenizer()
    sources = tiny.sentences(48, seed=3, shortest=8, longest=16)
    targets = [s + " " + s if i % 10 < {long_tenths} else " ".join(s.split()[:3]) for i, s in enumerate(sources)]
    raw = Dataset.from_dict({{"source": sources, "target": targets}})

    def preprocess(batch):
        encoded = tok(batch["source"], truncation=True, max_length=64)
        encoded["labels"] = tok(text_target=batch["target"], truncation=True, max_length=64)["input_ids"]
        return encoded

    data = raw.map(preprocess, batched=True, remove_columns=["source", "target"])
    config = T5Config(vocab_size=len(tiny.VOCAB), d_model=16, d_ff=32, d_kv=8, num_layers=1, num_decoder_layers=1,
                      num_heads=2, pad_token_id=tok.pad_token_id, eos_token_id=tok.sep_token_id,
                      decoder_start_token_id=tok.pad_token_id)
    model = T5ForConditionalGeneration(config)

    def generated(prediction):
        return {{"length": float((prediction.predictions != tok.pad_token_id).sum(-1).mean())}}

    args = Seq2SeqTrainingArguments(output_dir="out", per_device_train_batch_size=8, per_device_eval_batch_size=8,
                                    predict_with_generate=True, {setting}report_to="none")
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=data, eval_dataset=data, processing_class=tok,
                             data_collator=DataCollatorForSeq2Seq(tok, model=model), compute_metrics=generated)
    trainer.train()
"""


def eval_item(project: pytest.Pytester, long_tenths: int, setting: str = "") -> tuple[list[str], dict]:
    write(project, "train.py", SCRIPT.format(long_tenths=long_tenths, setting=setting))
    result = run_script(project, "--trainer-stages=eval", "--trainer-report=report.json")
    report = json.loads((project.path / "report.json").read_text())
    return failures(result), next(item for item in report["items"] if item["stage"] == "eval")


def test_the_default_generation_length_cutting_most_references_fails_eval(project: pytest.Pytester) -> None:
    failed, item = eval_item(project, long_tenths=10)
    assert failed == ["eval[cpu]"]
    assert re.match(
        r"4\d of the 48 reference targets of the evaluation dataset are longer than the 19 tokens evaluation generates ",
        item["diagnosis"],
    ), item["diagnosis"]
    assert "max_length=20" in item["diagnosis"]  # the generation config's (transformers 4) or generate()'s (5)
    assert "every such prediction is cut before its end" in item["diagnosis"]
    assert "generation_max_length=" in item["fix"]


def test_a_generation_length_that_covers_the_references_passes(project: pytest.Pytester) -> None:
    failed, item = eval_item(project, long_tenths=10, setting="generation_max_length=64, ")
    assert failed == []
    assert not any("longer than" in note for note in item["notes"])


def test_a_metric_error_keeps_the_finding_of_the_generation_length(project: pytest.Pytester) -> None:
    write(project, "train.py", SCRIPT.format(long_tenths=10, setting="").replace(".sum(-1)", ".sum(-1) / 0 + {}"))
    result = run_script(project, "--trainer-stages=eval")
    result.stdout.fnmatch_lines(
        ["eval[[]cpu[]] failed: compute_metrics raised *", "*also: 4? of the 48 reference targets*"]
    )


def test_a_few_references_cut_are_a_note(project: pytest.Pytester) -> None:
    failed, item = eval_item(project, long_tenths=2)
    assert failed == []
    assert any(
        re.match(r"evaluation: \d of the 48 reference targets of the evaluation dataset are longer than the 19", note)
        for note in item["notes"]
    ), item["notes"]
