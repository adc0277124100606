"""The `memory` stage and its forecast: the peak of a steady training step found on fake tensors, and what fails.

The forecast (`pytest_trainer.memory_forecast.training_step`) is compared with the peak of the same step taken for real on
this machine's CPU and measured independently of the plugin, with torch's profiler: one real step first, so the
Trainer's AdamW holds its state as in every step of a run but the first, then the second step profiled with
`profile_memory=True`. Measured peak = the bytes of the model's parameters and buffers and of the optimizer state
(distinct storages, there before the step and after it) + the running maximum of the cumulative sum of every
profiler event's `self_cpu_memory_usage`, events ordered by the time they end. The step is the Trainer's own:
`loss = trainer.compute_loss(model, batch)`, `loss.backward()`, `optimizer.step()`, `optimizer.zero_grad(set_to_none=
True)`, with the optimizer the Trainer builds. Measured so (torch 2.13, transformers 5.23, peft 0.21, CPU, batch 8 x
128): BERT 22.2 MiB, Llama with LoRA on q_proj/v_proj 18.7 MiB, T5 47.6 MiB; the Trainer's own `training_step` frees
the model's outputs (the logits) before backward, and so does this step.

The stage is then run by pytester on real scripts: the tiny BERT of conftest (the longest row of the data, not the
first batch, sets the forecast's sequence length), a budget no step fits in, and a tiny causal LM with a large
vocabulary whose evaluation gathers the logits of every row for compute_metrics.
"""

from __future__ import annotations

import json
import math
import textwrap
import types
from collections.abc import Callable
from typing import Any

import peft  # noqa: F401
import pytest
import torch
import transformers
from peft import LoraConfig, get_peft_model
from pipeline_runs import GOOD_SCRIPT, TINY, failures, outcomes, run_script, write
from torch.profiler import ProfilerActivity, profile
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    LlamaConfig,
    LlamaForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
    Trainer,
    TrainingArguments,
)

from pytest_trainer import memory_forecast, training
from pytest_trainer.pipeline import Pipeline

# The libraries above are imported here, before pytester's in-process runs, for the reason conftest gives.

GIB = 2**30
#: The batch of the direct forecasts: 8 rows of 128 tokens, vocabularies of 1000.
ROWS, LENGTH, VOCAB = 8, 128, 1000
#: How far the forecast may be from the measured peak.
TOLERANCE = 0.15
#: The stages the memory stage needs, and it.
STAGES = "--trainer-stages=dataset,collate,forward,backward,step,memory"


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    """One intra-op thread: two xdist workers on two cores, each with two torch threads, ran these 5-10x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------------------------
# 1. The forecast against the measured peak of the same step, on three tiny real models.


def _tokens(rows: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(5, VOCAB, (rows, length), generator=torch.Generator().manual_seed(seed))


def encoder() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=LENGTH,
        num_labels=3,
    )
    batch = {
        "input_ids": _tokens(ROWS, LENGTH, 0),
        "attention_mask": torch.ones(ROWS, LENGTH, dtype=torch.long),
        "labels": torch.arange(ROWS) % 3,
    }
    return BertForSequenceClassification(config), batch


def causal_lm_with_lora() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=LENGTH,
    )
    model = get_peft_model(
        LlamaForCausalLM(config),
        LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    tokens = _tokens(ROWS, LENGTH, 1)
    return model, {"input_ids": tokens, "attention_mask": torch.ones_like(tokens), "labels": tokens.clone()}


def seq2seq() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    config = T5Config(
        vocab_size=VOCAB,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    batch = {
        "input_ids": _tokens(ROWS, LENGTH, 2),
        "attention_mask": torch.ones(ROWS, LENGTH, dtype=torch.long),
        "labels": _tokens(ROWS, LENGTH // 2, 3),
    }
    return T5ForConditionalGeneration(config), batch


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, dict[str, torch.Tensor]]]] = {
    "bert": encoder,
    "llama-lora": causal_lm_with_lora,
    "t5": seq2seq,
}


class ValueReadingTrainer(Trainer):
    """A Trainer whose loss reads a tensor's value (`.item()`), as custom losses that log or guard do."""

    def compute_loss(
        self, model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        if not math.isfinite(loss.item()):
            raise FloatingPointError("the loss is not finite")
        return (loss, outputs) if return_outputs else loss


def pipeline_of(model: torch.nn.Module, tmp_path: Any, trainer_class: type[Trainer] = Trainer) -> Pipeline:
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    return Pipeline(trainer_class(model=model, args=args), "direct")


def _storage_bytes(tensors: Any) -> int:
    return sum({id(t.untyped_storage()): t.untyped_storage().nbytes() for t in tensors}.values())


def measured_peak(pipeline: Pipeline, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, int]:
    """The peak bytes of the second real training step of `model` on `batch`, measured with torch's profiler."""
    trainer = pipeline.trainer
    with training.trainer_optimizer(pipeline.trainer, model) as (optimizer, _):
        model.train()

        def step() -> None:
            loss = trainer.compute_loss(model, dict(batch))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        step()  # AdamW's state comes to be
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
        running = transient = 0
        for event in sorted(prof.events(), key=lambda event: event.time_range.end):
            running += event.self_cpu_memory_usage
            transient = max(transient, running)
        weights = _storage_bytes([*model.parameters(), *model.buffers()])
        state = _storage_bytes(
            value for values in optimizer.state.values() for value in values.values() if torch.is_tensor(value)
        )
    assert state > 0, "the optimizer holds no state after a step: the measurement would leave it out"
    return {
        "weights and buffers": weights,
        "optimizer state": state,
        "step": transient,
        "peak": weights + state + transient,
    }


def compare(name: str, forecast: memory_forecast.Forecast, measured: dict[str, int], how: str = "") -> float:
    ratio = forecast.peak / measured["peak"]
    print(
        f"\n{name}: forecast {forecast.describe()} from {how or forecast.how}; "
        f"measured {measured['peak'] / 2**20:.2f} MiB ({measured}); forecast/measured {ratio:.3f}"
    )
    return ratio


#: transformers 4 builds attention masks by reading the mask's values, which fake tensors lack: the real step is taken.
TRANSFORMERS_4 = int(transformers.__version__.split(".")[0]) < 5


@pytest.mark.parametrize("name", list(MODELS))
def test_forecast_on_fake_tensors_is_within_15_percent_of_the_measured_step(name: str, tmp_path: Any) -> None:
    model, batch = MODELS[name]()
    pipeline = pipeline_of(model, tmp_path)
    forecast = memory_forecast.training_step(pipeline, model, batch)
    if not TRANSFORMERS_4 or name == "t5":  # transformers 4's BERT and Llama read their masks' values
        assert forecast.how == "fake tensors (nothing allocated)", forecast.how
    measured = measured_peak(pipeline, model, batch)
    ratio = compare(name, forecast, measured)
    assert 1 - TOLERANCE <= ratio <= 1 + TOLERANCE, (
        f"{name}: forecast {forecast.describe()} vs measured {measured} (ratio {ratio:.3f})"
    )


@pytest.mark.parametrize("name", list(MODELS))
def test_forecast_of_a_real_tracked_step_is_within_15_percent_of_the_measured_step(name: str, tmp_path: Any) -> None:
    # The fallback, for pipelines that fake tensors cannot run: the step taken for real, its tensors counted.
    model, batch = MODELS[name]()
    pipeline = pipeline_of(model, tmp_path)
    with pipeline.weights_kept(model):
        forecast = memory_forecast._training_step(pipeline, model, batch, None, fake=False)
    measured = measured_peak(pipeline, model, batch)
    ratio = compare(name, forecast, measured, how="_training_step(fake=False)")
    assert 1 - TOLERANCE <= ratio <= 1 + TOLERANCE, (
        f"{name}: forecast {forecast.describe()} vs measured {measured} (ratio {ratio:.3f})"
    )


def test_loss_reading_a_value_falls_back_to_a_real_step_within_15_percent(tmp_path: Any) -> None:
    model, batch = encoder()
    pipeline = pipeline_of(model, tmp_path, ValueReadingTrainer)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    forecast = memory_forecast.training_step(pipeline, model, batch)
    assert forecast.how.startswith("a real step tracked on this machine"), forecast.how
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items()), (
        "the real step of the fallback left its updates in the model's weights"
    )
    measured = measured_peak(pipeline, model, batch)
    ratio = compare("bert with a loss that reads .item()", forecast, measured)
    assert 1 - TOLERANCE <= ratio <= 1 + TOLERANCE, (forecast.describe(), measured, ratio)


# ---------------------------------------------------------------------------------------------------------------
# 2-3. The stage on the tiny BERT: the longest row sets the length; a budget no step fits in fails.

#: GOOD_SCRIPT's data made of short rows (at most 5 words) and one long row, far from the first rows.
LONG_ROW_DATA = """
def long_row_data():
    from datasets import Dataset

    texts = tiny.sentences(48, seed=3, shortest=2, longest=5)
    texts[37] = " ".join(tiny.WORDS[:20])
    return Dataset.from_dict({"text": texts, "label": [i % 3 for i in range(48)]})
"""
LONG_ROW_SCRIPT = GOOD_SCRIPT.replace("tiny.text_dataset()", "long_row_data()").replace(
    "    tok = tiny.tokenizer()\n", "    tok = tiny.tokenizer()\n" + textwrap.indent(LONG_ROW_DATA, "    ") + "\n"
)


def run_memory(project: pytest.Pytester, source: str, *options: str) -> tuple[pytest.RunResult, dict[str, Any]]:
    """Run the stages up to memory on `source` as train.py; the run and the report's memory item."""
    write(project, "train.py", source)
    result = run_script(project, STAGES, "--trainer-report=report.json", *options)
    items = json.loads((project.path / "report.json").read_text())["items"]
    found = [item for item in items if item["stage"] == "memory" and item["script"] == "train.py"]
    assert len(found) == 1, (items, result.stdout.str()[-6000:])
    return result, found[0]


def check_memory_passes(result: pytest.RunResult, item: dict[str, Any]) -> None:
    assert failures(result) == [], result.stdout.str()[-6000:]
    assert outcomes(result).get("memory[cpu]") == "PASSED", (outcomes(result), result.stdout.str()[-6000:])
    assert item["outcome"] == "passed" and item["diagnosis"] == "", item


def check_memory_fails(result: pytest.RunResult, item: dict[str, Any]) -> str:
    """memory[cpu] alone failed, as a pipeline failure with a fix; its diagnosis and fix in one text."""
    assert failures(result) == ["memory[cpu]"], (outcomes(result), result.stdout.str()[-6000:])
    assert item["outcome"] == "failed" and item["fix"], item
    assert "INTERNALERROR" not in result.stdout.str()
    return f"{item['diagnosis']}\nfix: {item['fix']}"


def long_row_lengths(tmp_path: Any) -> tuple[int, int]:
    """(longest tokenized row of LONG_ROW_SCRIPT's data, length of the plugin's fixed first batch), found here."""
    namespace: dict[str, Any] = {}
    exec(TINY, namespace)
    tiny = types.SimpleNamespace(**namespace)
    script: dict[str, Any] = {"tiny": tiny}
    exec(LONG_ROW_DATA, script)
    tok = tiny.tokenizer()
    data = tiny.tokenized(script["long_row_data"](), tok)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, report_to=[], use_cpu=True)
    trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=data, processing_class=tok)
    first_batch = Pipeline(trainer, "direct").batches.first()
    return max(len(ids) for ids in data["input_ids"]), int(first_batch["input_ids"].shape[-1])


def test_without_a_budget_the_default_suite_skips_memory_with_the_reason(project: pytest.Pytester) -> None:
    """No GPU and no --trainer-gpu-memory: the forecast has nothing to be held to, so the default suite skips it
    (saying how to give it a budget) instead of paying for a step on fake tensors that cannot fail. A budget, or
    naming the stage (the other tests of this file), runs it."""
    write(project, "train.py", GOOD_SCRIPT)
    result = project.runpytest("--trainer-module=train.py", "--trainer-devices=cpu", "-v", "-rs")
    assert failures(result) == [], result.stdout.str()[-6000:]
    if torch.cuda.is_available():  # the GPU present is the budget
        assert outcomes(result).get("memory[cpu]") == "PASSED", result.stdout.str()[-6000:]
    else:
        assert outcomes(result).get("memory[cpu]") == "SKIPPED", result.stdout.str()[-6000:]
        result.stdout.fnmatch_lines(
            [
                "*memory*no GPU memory to forecast against: give the GiB of the GPU you train on "
                "with --trainer-gpu-memory=GIB*"
            ]
        )
    budgeted = run_script(project, "--trainer-gpu-memory=80")
    assert failures(budgeted) == [] and outcomes(budgeted).get("memory[cpu]") == "PASSED", budgeted.stdout.str()[-6000:]


def test_memory_stage_on_the_tiny_bert_reports_the_step_at_the_longest_row(
    project: pytest.Pytester, tmp_path: Any
) -> None:
    assert LONG_ROW_SCRIPT.count("long_row_data()") == 2
    longest, first_batch = long_row_lengths(tmp_path)
    assert longest > first_batch + 10, (longest, first_batch)  # the first batch alone would not find it
    result, item = run_memory(project, LONG_ROW_SCRIPT)
    check_memory_passes(result, item)
    figures = item["figures"]
    assert figures["train_step_gib"] > 0, figures
    assert figures["sequence_length"] == longest, (figures, longest, first_batch)
    parts = sum(value for key, value in figures.items() if key not in ("train_step_gib", "sequence_length"))
    assert parts == pytest.approx(figures["train_step_gib"]), figures
    assert "eval_peak_gib" not in figures, figures  # no compute_metrics, nothing gathered
    assert any(
        f"per_device_train_batch_size=8 and the longest sequence of the data ({longest} tokens)" in note
        for note in item["notes"]
    ), item["notes"]
    # With a budget the step fits in, the terminal says the figure held to it, once.
    result, item = run_memory(project, LONG_ROW_SCRIPT, "--trainer-gpu-memory=80")
    check_memory_passes(result, item)
    said = [line for line in result.outlines if line.startswith("memory[cpu]: one training step at")]
    assert len(said) == 1, result.stdout.str()[-6000:]
    assert f"({longest} tokens): about " in said[0] and ", within the 80 GiB of GPU memory, from " in said[0]


def test_budget_no_step_fits_in_fails_naming_the_batch_size_and_the_fix(project: pytest.Pytester) -> None:
    result, item = run_memory(project, LONG_ROW_SCRIPT, "--trainer-gpu-memory=0.000001")
    text = check_memory_fails(result, item)
    assert "one training step needs about" in text and "per_device_train_batch_size=8" in text, text
    assert "gradient_accumulation_steps" in text and "gradient_checkpointing" in text, text
    result.stdout.fnmatch_lines(
        [
            "memory[[]cpu[]] failed: one training step needs about *per_device_train_batch_size=8*",
            "*fix: *gradient_accumulation_steps*gradient_checkpointing*",
        ]
    )


@pytest.mark.parametrize(
    ("asked", "engine", "whole_weights"),
    [
        ('deepspeed={"zero_optimization": {"stage": 3}}', "DeepSpeed's ZeRO stage 3", False),
        ('deepspeed={"zero_optimization": {"stage": 2}}', "DeepSpeed's ZeRO stage 2", True),
        ('fsdp="full_shard", fsdp_config={"transformer_layer_cls_to_wrap": ["BertLayer"]}', "FSDP", False),
    ],
)
def test_a_sharded_step_beyond_the_budget_is_not_forecast_per_gpu_and_says_why(
    project: pytest.Pytester, asked: str, engine: str, whole_weights: bool
) -> None:
    # One GPU holding everything exceeds the budget; each of the script's processes holds a shard of the weights,
    # gradients and optimizer state, but its activations whole.
    script = LONG_ROW_SCRIPT.replace('report_to="none")', f'report_to="none", {asked})')
    assert asked in script
    result, item = run_memory(project, script)
    check_memory_passes(result, item)
    assert any(f"{engine} shards it over the processes, so each holds less" in note for note in item["notes"]), item
    figures = item["figures"]
    # A full fine-tune: the gradients are as large as the weights. ZeRO's stage 2 keeps the weights whole.
    held = figures["activations_and_gradients_gib"] - figures["weights_gib"] + figures["buffers_gib"]
    held += figures["weights_gib"] if whole_weights else 0
    peak = figures["train_step_gib"]
    assert 0 < held < peak, figures

    result, item = run_memory(project, script, f"--trainer-gpu-memory={(held + peak) / 2:.9f}")
    assert item["outcome"] == "skipped", item
    assert failures(result) == [], result.stdout.str()[-6000:]
    result.stdout.fnmatch_lines(
        [
            "*memory[[]cpu[]]: one GPU holding the whole training state needs about * at per_device_train_batch_size=8*, "
            f"more than the * of GPU memory (*); the script shards the training state with {engine} over its "
            "processes, and what each of them holds is not forecast (its activations alone take about *)"
        ]
    )
    result, item = run_memory(project, script, f"--trainer-gpu-memory={held / 2:.9f}")
    text = check_memory_fails(result, item)
    assert "on each GPU at per_device_train_batch_size=8 and the longest sequence of the data (" in text, text
    kept = "its activations and its weights, which it keeps whole on each GPU," if whole_weights else "its activations"
    assert f"even with {engine}: {kept} are not sharded" in text, text


@pytest.mark.parametrize("value", ["lots", "-1"])
def test_bad_gpu_memory_is_a_usage_error_naming_the_option(project: pytest.Pytester, value: str) -> None:
    write(project, "train.py", LONG_ROW_SCRIPT)
    result = run_script(project, STAGES, f"--trainer-gpu-memory={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-3000:] + result.stderr.str()[-3000:]
    result.stderr.fnmatch_lines([f"*--trainer-gpu-memory on the command line: '{value}' is not a number of GiB*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_infinite_gpu_memory_is_not_an_internal_error(project: pytest.Pytester) -> None:
    # float("inf") passes the option's check (it is >= 0); the stage then turns it into bytes with int().
    write(project, "train.py", LONG_ROW_SCRIPT)
    result = run_script(project, STAGES, "--trainer-gpu-memory=inf")
    output = result.stdout.str() + result.stderr.str()
    assert "internal error of pytest-trainer" not in output, output[-4000:]
    assert result.ret == pytest.ExitCode.USAGE_ERROR or outcomes(result).get("memory[cpu]") == "PASSED", output[-4000:]


# ---------------------------------------------------------------------------------------------------------------
# 4. Evaluation that gathers the logits of every row for compute_metrics.

#: A tiny Llama with a vocabulary of 6000: each evaluation row's logits are 16 x 6000 floats (375 KiB), and the
#: 400 evaluation rows' 147 MiB, far more than a training step of batch 8 needs.
EVAL_VOCAB, EVAL_LENGTH, EVAL_ROWS = 6000, 16, 400
GATHERING_SCRIPT = f"""
    import random

    import numpy as np
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    rng = random.Random(0)


    def rows(count):
        ids = [[rng.randrange(3, {EVAL_VOCAB}) for _ in range({EVAL_LENGTH})] for _ in range(count)]
        return Dataset.from_dict({{"input_ids": ids, "attention_mask": [[1] * {EVAL_LENGTH}] * count, "labels": ids}})


    def compute_metrics(prediction):
        predicted = prediction.predictions
        if predicted.ndim == 3:
            predicted = predicted.argmax(-1)
        return {{"accuracy": float(np.mean(predicted[:, :-1] == prediction.label_ids[:, 1:]))}}


    model = LlamaForCausalLM(LlamaConfig(vocab_size={EVAL_VOCAB}, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2))
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, per_device_eval_batch_size=8,
                             report_to=[])
    trainer = Trainer(model=model, args=args, train_dataset=rows(64), eval_dataset=rows({EVAL_ROWS}),
                      compute_metrics=compute_metrics)
    trainer.train()
"""
#: The same script, its logits reduced to token ids before the Trainer gathers them.
ARGMAX = (
    "compute_metrics=compute_metrics)",
    "compute_metrics=compute_metrics,\n"
    "                      preprocess_logits_for_metrics=lambda logits, labels: logits.argmax(-1))",
)
REDUCED_SCRIPT = GATHERING_SCRIPT.replace(*ARGMAX)


def test_evaluation_gathering_every_rows_logits_fails_a_budget_the_step_fits_in(project: pytest.Pytester) -> None:
    assert REDUCED_SCRIPT != GATHERING_SCRIPT
    result, item = run_memory(project, GATHERING_SCRIPT, "--trainer-sample=0")
    check_memory_passes(result, item)  # no GPU and no budget: reported only
    figures = item["figures"]
    step, evaluation = figures["train_step_gib"], figures["eval_peak_gib"]
    # Every row's fp32 logits and int64 labels, as the Trainer gathers them (on a GPU, beside the weights).
    per_row = EVAL_LENGTH * (EVAL_VOCAB * 4 + 8)
    assert figures["eval_gathered_gib"] * GIB == pytest.approx(EVAL_ROWS * per_row, rel=0.01), figures
    assert evaluation > 3 * step, figures
    budget = math.sqrt(step * evaluation)

    result, item = run_memory(project, GATHERING_SCRIPT, "--trainer-sample=0", f"--trainer-gpu-memory={budget:.6f}")
    text = check_memory_fails(result, item)
    assert "compute_metrics" in text and f"{EVAL_ROWS} rows" in text, text
    assert "preprocess_logits_for_metrics" in text and "eval_accumulation_steps" in text, text
    result.stdout.fnmatch_lines(
        [
            "memory[[]cpu[]] failed: evaluation keeps the predictions of every row on the GPU "
            f"for compute_metrics: {EVAL_ROWS} rows x *",
            "*fix: *preprocess_logits_for_metrics*",
        ]
    )

    result, item = run_memory(project, REDUCED_SCRIPT, "--trainer-sample=0", f"--trainer-gpu-memory={budget:.6f}")
    check_memory_passes(result, item)
    figures = item["figures"]
    assert figures["train_step_gib"] == pytest.approx(step), figures
    assert figures["eval_peak_gib"] < budget, figures
    # What is gathered now: the token ids the argmax leaves, and the labels, int64 each.
    assert figures["eval_gathered_gib"] * GIB == pytest.approx(EVAL_ROWS * EVAL_LENGTH * 16, rel=0.01), figures

    # A sharded model: what each process holds of it is not forecast, but every process gathers the predictions.
    sharded = GATHERING_SCRIPT.replace("report_to=[])", 'report_to=[], deepspeed={"zero_optimization": {"stage": 3}})')
    assert sharded != GATHERING_SCRIPT
    gathered = EVAL_ROWS * per_row / GIB
    assert step < 0.9 * gathered < gathered < evaluation, figures
    result, item = run_memory(project, sharded, "--trainer-sample=0", f"--trainer-gpu-memory={0.9 * gathered:.6f}")
    assert "evaluation keeps the predictions of every row on the GPU" in check_memory_fails(result, item)
    between = (gathered + evaluation) / 2
    result, item = run_memory(project, sharded, "--trainer-sample=0", f"--trainer-gpu-memory={between:.6f}")
    assert item["outcome"] == "skipped", item
    result.stdout.fnmatch_lines(["*memory[[]cpu[]]: evaluation on one GPU holding the whole model needs about *"])


def test_evaluation_forecast_counts_every_row_of_a_transformed_evaluation_split(project: pytest.Pytester) -> None:
    # The Trainer gathers the predictions of all 400 rows, however many the plugin itself transforms to read the
    # split (--trainer-sample, 256 by default): the count is the dataset's length.
    source = GATHERING_SCRIPT.replace(
        f"eval_dataset=rows({EVAL_ROWS})", f"eval_dataset=rows({EVAL_ROWS}).with_transform(lambda batch: batch)"
    )
    assert source != GATHERING_SCRIPT
    result, item = run_memory(project, source)
    check_memory_passes(result, item)
    per_row = EVAL_LENGTH * (EVAL_VOCAB * 4 + 8)
    assert item["figures"]["eval_gathered_gib"] * GIB == pytest.approx(EVAL_ROWS * per_row, rel=0.01), item["notes"]


def test_sizes_read_in_the_unit_a_person_reads() -> None:
    """A model's buffers are often a few bytes: `0.000488 MiB` read as a rounding error."""
    assert [memory_forecast.size(count) for count in (512, 3584, 45_200_000, 2**20 - 100, 2**31)] == [
        "512 bytes",
        "3.5 KiB",
        "43.1 MiB",
        "1 MiB",
        "2 GiB",
    ]
