"""Errors of tensors on two devices, and of CUDA asked for on a machine without it, named at their cause: the tensor,
its device, the line that meets it with the batch, the line that made it, and the fix. A CPU meets the same family
of errors through a second device, `meta`, that a GPU machine meets between the CPU and CUDA."""

from __future__ import annotations

import pytest
from pipeline_runs import GOOD_SCRIPT, outcomes, run_script, write

from pytest_trainer import devices, options

#: A Trainer subclass weighting its loss by class, the weights made on `{device}` and used as `{used}`.
WEIGHTED = """
    import torch
    import tiny
    from transformers import Trainer, TrainingArguments


    class WeightedTrainer(Trainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.class_weights = torch.tensor([1.0, 2.0, 1.0], device={device!r})

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            labels = inputs.pop("labels")
            outputs = model(**inputs)
            logits = outputs.logits
            loss = torch.nn.functional.cross_entropy(logits, labels, weight={used})
            return (loss, outputs) if return_outputs else loss


    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(), tok)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
    trainer = WeightedTrainer(model=tiny.classifier(), args=args, train_dataset=data, processing_class=tok)
    trainer.train()
"""


def test_weights_on_another_device_than_the_batch_name_the_tensor_its_lines_and_the_fix(
    project: pytest.Pytester,
) -> None:
    write(project, "train.py", WEIGHTED.format(device="meta", used="self.class_weights"))
    result = run_script(project, "--trainer-stages=forward")
    assert outcomes(result) == {"forward[cpu]": "FAILED"}
    result.stdout.fnmatch_lines(
        [
            "forward[[]cpu[]] failed: self.class_weights is on meta, and what it meets at train.py:16 is on cpu: a "
            "tensor made on one device (or with none, which is the CPU) where the model and the batch are on another; "
            "self.class_weights is made at train.py:10 (`self.class_weights = torch.tensor([[]1.0, 2.0, 1.0[]], "
            "device='meta')`)",
            "  fix: put it where it is used on the device of what it meets: self.class_weights.to(logits.device); a "
            "tensor every step needs is better a buffer of the model (model.register_buffer(...)), which the Trainer "
            "moves with the model",
        ]
    )


def test_weights_moved_where_they_are_used_pass(project: pytest.Pytester) -> None:
    write(project, "train.py", WEIGHTED.format(device="cpu", used="self.class_weights.to(logits.device)"))
    assert outcomes(run_script(project, "--trainer-stages=forward")) == {"forward[cpu]": "PASSED"}


@pytest.mark.parametrize(
    ("call", "lines"),
    [
        (
            "cuda",
            [
                "collate[[]cpu[]] failed: the script's code puts a tensor or the model on a GPU at train.py:9 "
                "(`collate = lambda rows: {name: value.cuda() for name, value in pad(rows).items()}`), and this "
                "machine has none",
                "  fix: leave the devices to the Trainer, which moves the model and each batch: drop the .cuda() or "
                "device='cuda', or take the device from what the tensor meets (tensor.to(logits.device), "
                "model.device)",
            ],
        ),
        (
            "pin_memory",
            [
                "collate[[]cpu[]] failed: the script's pinned memory needs a GPU at train.py:9 (`collate = *`), and "
                "this machine has none",
                "  fix: leave the devices to the Trainer, which moves the model and each batch: drop the .pin_memory() "
                "(dataloader_pin_memory=True pins where a GPU is), *",
            ],
        ),
    ],
    ids=["cuda", "pinned"],
)
def test_a_collator_that_needs_a_gpu_is_named_on_a_machine_without_one(
    project: pytest.Pytester, call: str, lines: list[str]
) -> None:
    script = GOOD_SCRIPT.replace(
        "args = TrainingArguments(",
        "from transformers import DataCollatorWithPadding\n"
        "    pad = DataCollatorWithPadding(tok)\n"
        f"    collate = lambda rows: {{name: value.{call}() for name, value in pad(rows).items()}}\n"
        "    args = TrainingArguments(",
    ).replace("processing_class=tok)", "processing_class=tok, data_collator=collate)")
    write(project, "train.py", script)
    result = run_script(project, "--trainer-stages=collate")
    assert outcomes(result) == {"collate[cpu]": "FAILED"}
    result.stdout.fnmatch_lines(lines)


def test_a_script_that_moves_its_model_to_cuda_is_named_at_load(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT.replace("model=tiny.classifier()", "model=tiny.classifier().cuda()"))
    result = run_script(project, "--trainer-stages=load")
    result.stdout.fnmatch_lines(
        ["load[[]cpu[]] failed: train.py: the script's code puts a tensor or the model on a GPU at train.py:8 *"]
    )


def test_an_index_on_another_device_than_the_tensor_it_indexes_is_named() -> None:
    """torch's words for a CPU tensor indexed by a CUDA tensor, met here with the index on meta."""
    import torch

    from pytest_trainer.explanations import script_rows

    def pick(values: torch.Tensor) -> torch.Tensor:
        chosen = torch.zeros(2, dtype=torch.long, device="meta")
        if chosen.device != values.device:  # what CUDA raises here; meta indexes the CPU without a word
            raise RuntimeError(
                f"indices should be either on cpu or on the same device as the indexed tensor ({values.device})"
            )
        return values[chosen]

    try:
        pick(torch.randn(3))
    except RuntimeError as error:
        found = script_rows.placement(error)
    assert found is not None
    assert found.cause.startswith("chosen is on meta, and what it meets at test_device_errors.py:")
    assert found.fix.startswith("put it where it is used on the device of what it meets: chosen.to(values.device)")


def test_a_model_s_tensor_that_is_no_buffer_is_named(project: pytest.Pytester) -> None:
    """A tensor a model keeps as a plain attribute does not move with the model, as a buffer would."""
    scaled = GOOD_SCRIPT.replace(
        "args = TrainingArguments(",
        "import torch\n\n"
        "    class Scaled(tiny.BertForSequenceClassification):\n"
        "        def __init__(self, config):\n"
        "            super().__init__(config)\n"
        "            self.scale = torch.ones(config.num_labels, device='meta')\n\n"
        "        def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None):\n"
        "            outputs = super().forward(input_ids, attention_mask, token_type_ids, labels=labels)\n"
        "            outputs.logits = outputs.logits * self.scale\n"
        "            return outputs\n\n"
        "    args = TrainingArguments(",
    ).replace("model=tiny.classifier()", "model=Scaled(tiny.config())")
    write(project, "train.py", scaled)
    result = run_script(project, "--trainer-stages=forward")
    assert outcomes(result) == {"forward[cpu]": "FAILED"}
    result.stdout.fnmatch_lines(
        [
            "forward[[]cpu[]] failed: self.scale is on meta, and what it meets at train.py:* is on cpu: * self.scale "
            "is made at train.py:* (`self.scale = torch.ones(config.num_labels, device='meta')`)",
            "  fix: put it where it is used on the device of what it meets: self.scale.to(*.device); a tensor every "
            "step needs is better a buffer of the model (model.register_buffer(...)), *",
        ]
    )


# ---- a device asked for in the options that this machine lacks (devices.unavailable_reason imports torch) ------


@pytest.mark.skipif(devices.unavailable_reason("cuda") is None, reason="this machine has CUDA: nothing is missing")
@pytest.mark.parametrize("given", ["--trainer-devices=cuda", "--trainer-devices=cpu,cuda", "ini"])
def test_a_named_device_this_machine_lacks_is_a_usage_error(pytester: pytest.Pytester, given: str) -> None:
    if given == "ini":
        pytester.makeini("[pytest]\ntrainer_devices = cuda\n")
    with pytest.raises(pytest.UsageError) as raised:
        options.resolve(pytester.parseconfig(*([given] if given != "ini" else [])))
    message = str(raised.value)
    source = "trainer_devices in " if given == "ini" else "--trainer-devices on the command line"
    assert message.startswith(f"{source}") and " asks for cuda, but CUDA is not available on this machine" in message
    assert "--trainer-devices=cpu" in message
    assert options.resolve(pytester.parseconfig("--trainer-devices=cpu")).devices == ("cpu",)
