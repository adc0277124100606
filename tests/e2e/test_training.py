"""The training run the stages share, the starting weights kept on disk, and the search that checks examples together."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch
from hypothesis import strategies as st
from pipeline_runs import GOOD_SCRIPT, write

from pytest_trainer.property_runs import search
from pytest_trainer.stages.save import first_rows
from pytest_trainer.training import SavedWeights, non_finite

#: The smallest correct script, asking for bf16 as TRL's configs do: the precision item then reports a loss at the
#: starting weights (this machine turns bf16 off, and the item checks it under CPU autocast).
BF16_SCRIPT = GOOD_SCRIPT.replace('report_to="none")', 'report_to="none", bf16=True)')


def _figures(pytester: pytest.Pytester, stages: str, name: str) -> dict[tuple[str, str], dict[str, float]]:
    result = pytester.runpytest(
        "--trainer-module=train.py", "--trainer-devices=cpu", f"--trainer-stages={stages}", f"--trainer-report={name}"
    )
    assert result.ret == 0, result.stdout.str()
    items = json.loads((pytester.path / name).read_text())["items"]
    return {(item["stage"], item["device"]): item.get("figures", {}) for item in items}


def test_the_shared_run_gives_each_item_the_same_figures_whichever_items_run(project: pytest.Pytester) -> None:
    write(project, "train.py", BF16_SCRIPT)
    everything = _figures(project, "forward,backward,step,overfit,save,eval,precision", "all.json")
    alone = {
        stage: _figures(project, stage, f"{stage}.json")[(stage, "cpu")] for stage in ("step", "overfit", "precision")
    }
    for stage, figures in alone.items():
        assert figures, stage
        assert figures == pytest.approx(everything[(stage, "cpu")], rel=1e-6), stage
    # overfit continued the step item's run (its first step is that one), and precision, after overfit and save,
    # found the starting weights back: the loss under autocast is the one it finds when it runs first.
    assert everything[("overfit", "cpu")]["loss_before"] == pytest.approx(
        everything[("forward", "cpu")]["loss_at_init"]
    )
    assert "autocast_loss" in alone["precision"]


def test_starting_weights_come_back_and_the_trained_ones_are_named() -> None:
    torch.manual_seed(0)
    # Tanh before the batch norm: a bias right before one gets a gradient of 0 up to rounding, changed or not
    # depending on the torch build.
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    model[3].requires_grad_(False)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    saved = SavedWeights(model)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    model.train()
    model(torch.randn(16, 4)).pow(2).sum().backward()
    optimizer.step()
    assert saved.changed(model) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert not torch.equal(model[2].running_mean, before["2.running_mean"])  # a buffer training changed
    saved.restore(model)
    assert saved.changed(model) == []
    assert all(torch.equal(value, before[name]) for name, value in model.state_dict().items())
    saved.close()


def test_non_finite_names_nan_and_inf_and_not_large_finite_values() -> None:
    huge = torch.full((10,), 3e38)  # finite, but its float32 sum is not
    named = [
        ("nan", torch.tensor([1.0, math.nan])),
        ("inf", torch.tensor([-math.inf, 0.0])),
        ("huge", huge),
        ("half", torch.tensor([60000.0, 60000.0], dtype=torch.float16)),
        ("ids", torch.tensor([1, 2])),
    ]
    assert non_finite(named) == ["nan", "inf"]


def test_search_checks_examples_together_and_one_by_one_only_when_that_fails() -> None:
    one_by_one: list[int] = []

    def check(value: int) -> None:
        one_by_one.append(value)
        if value >= 5:
            raise ValueError(value)

    def together(examples: list[int]) -> bool:
        assert examples
        return True

    search(st.integers(0, 1000), check, "together passes", 20, together)
    assert one_by_one == []

    def fails_together(examples: list[int]) -> bool:
        try:
            for value in examples:
                check(value)
        except ValueError:
            return False
        return True

    with pytest.raises(ValueError) as found:  # found again one by one, and shrunk to the smallest
        search(st.integers(0, 1000), check, "together fails", 20, fails_together)
    assert found.value.args == (5,)

    one_by_one.clear()
    search(st.integers(0, 4), check, "only together fails", 20, lambda examples: False)
    assert one_by_one  # the examples were checked one by one, and none failed: no failure is reported


def test_first_rows_cuts_the_tensors_whose_first_dimension_is_the_batch() -> None:
    batch = {"input_ids": torch.zeros(8, 5), "labels": torch.zeros(8), "scale": torch.tensor(2.0), "names": ["a"] * 8}
    cut = first_rows(batch, "input_ids", 2)
    assert cut["input_ids"].shape == (2, 5) and cut["labels"].shape == (2,) and cut["names"] == ["a", "a"]
    assert cut["scale"] is batch["scale"]
    assert first_rows({"input_ids": torch.zeros(1, 5)}, "input_ids", 2)["input_ids"].shape == (1, 5)


def test_first_rows_keeps_a_batch_whose_images_are_not_one_to_a_row() -> None:
    """Qwen2-VL stacks every image's patches in one tensor, with one grid row per image beside it: with one image to
    each of 4 rows, the grids look like rows, and cutting them alone gave the model 2 grids for 72 patches."""
    batch = {
        "input_ids": torch.zeros(4, 30, dtype=torch.long),
        "pixel_values": torch.zeros(72, 1176),
        "image_grid_thw": torch.tensor([[1, 6, 3]] * 4),
    }
    assert first_rows(batch, "input_ids", 2) is batch
    # Whatever the tensor whose first dimension is not the rows (a per-batch constant too): compared whole.
    assert first_rows({"input_ids": torch.zeros(8, 5), "pixel_mean": torch.zeros(3)}, "input_ids", 2)[
        "input_ids"
    ].shape == (8, 5)


def _sft_trainer(output_dir: str) -> Any:
    """TRL's SFTTrainer on a tiny Llama and pre-tokenized rows: its loss goes through TRL's fused LM head."""
    from datasets import Dataset
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    words = {"[PAD]": 0, "[UNK]": 1, "[EOS]": 2, **{f"w{index}": index for index in range(3, 64)}}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(words, unk_token="[UNK]")),
        pad_token="[PAD]",
        unk_token="[UNK]",
        eos_token="[EOS]",
    )
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
        eos_token_id=2,
    )
    rows = [[3 + (row + column) % 60 for column in range(6 + row)] for row in range(8)]
    args = SFTConfig(output_dir=output_dir, per_device_train_batch_size=4, report_to=[], use_cpu=True, bf16=False)
    return SFTTrainer(
        LlamaForCausalLM(config),
        args=args,
        train_dataset=Dataset.from_dict({"input_ids": rows}),
        processing_class=tokenizer,
    )


def test_a_step_on_an_sft_pipeline_runs_the_model_as_often_as_trls_own_training_step(tmp_path: Any) -> None:
    # The checks that read logits ask the model for them in a forward of their own (TRL's loss builds none); a step
    # must not: over Qwen's or Llama's vocabulary those logits cost a step's time and memory again.
    from pytest_trainer.pipeline import Pipeline

    trainer = _sft_trainer(str(tmp_path))
    pipeline = Pipeline(trainer, "direct")
    model, batch = pipeline.model_on("cpu"), pipeline.batches.first_on("cpu")
    calls: list[bool] = []
    handle = model.register_forward_hook(lambda module, inputs, output: calls.append(torch.is_grad_enabled()))
    try:
        trainer.current_gradient_accumulation_steps = 1  # as Trainer.train() sets it
        trainer.training_step(model, dict(batch))
        trainers = len(calls)
        calls.clear()
        run = pipeline.fixed_batch_run("cpu")
        run.starting_loss()
        starting = len(calls)
        calls.clear()
        run.step()
        stepped = len(calls)
        calls.clear()
        _, outputs = pipeline.loss(model, batch)
    finally:
        handle.remove()
        pipeline.end_fixed_batch_runs()
    assert (trainers, starting, stepped) == (1, 1, 1), (trainers, starting, stepped)
    assert len(calls) == 2 and outputs.logits.shape[-1] == 64, "a check that reads the logits gets them"
