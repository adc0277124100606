"""`precision`: the script's own mixed precision (fp16, bf16) works with this model and this data.

Read from the script's flags, even where this machine turned them off to build the Trainer:
- trainable weights in fp16 under `fp16=True`: the GPU's gradient scaler refuses them ("Attempting
  to unscale FP16 gradients"), and without one AdamW updates fp16 weights until they are NaN;
- under `fp16=True`, activations of the layers autocast runs in fp16 beyond its range (65504), found
  by forward hooks in an fp32 forward of the fixed batch: they become inf, then the loss NaN;
- a forward and backward of the fixed batch under autocast in the script's precision give a finite
  loss and finite gradients (CPU autocast on the CPU);
- on CUDA, bf16 asked of a GPU without it.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Any

from pytest_trainer import diagnosis
from pytest_trainer.explanations import pipeline_rows
from pytest_trainer.stages.base import Stage, StageResult
from pytest_trainer.training import non_finite

if TYPE_CHECKING:
    import torch

    from pytest_trainer.pipeline import Pipeline

#: The largest finite fp16 value.
FP16_MAX = 65504.0
#: Module classes whose outputs autocast computes in half precision (matrix products and convolutions).
HALF_UNDER_AUTOCAST = ("Linear", "Conv1d", "Conv2d", "Conv3d", "Conv1D")


def run(pipeline: Pipeline, device: str) -> StageResult:
    import torch

    mixed = pipeline.precision()
    model = pipeline.model_on(device)
    result = StageResult("precision", device)
    trainable = {name: parameter for name, parameter in model.named_parameters() if parameter.requires_grad}
    counts = Counter(str(parameter.dtype).removeprefix("torch.") for parameter in trainable.values())
    result.notes.append(
        f"mixed precision: {mixed or 'none (fp32)'}; trainable weights: "
        + ", ".join(f"{count} in {dtype}" for dtype, count in sorted(counts.items()))
    )
    if device == "cuda" and mixed == "bf16" and not torch.cuda.is_bf16_supported(including_emulation=False):
        raise diagnosis.PipelineFailure(
            f"the script asks for bf16=True, but this GPU ({torch.cuda.get_device_name()}) has no bf16 arithmetic",
            "use fp16=True on this GPU (with fp32 trainable weights), or train on one with bf16 (Ampere or newer)",
        )
    half = pipeline_rows.fp16_trainable(pipeline, model)
    if half is not None:
        raise half
    if mixed is None:
        return result
    batch = pipeline.batches.first_on(device)
    if mixed == "fp16" and pipeline.twins:
        result.notes.append(
            "not checked: whether the checkpoint's trained activations overflow fp16 (the twin's random weights say "
            "nothing of them); --trainer-model=real on a machine that holds the model checks it"
        )
    elif mixed == "fp16":
        peak = _check_fp16_range(pipeline, model, batch)
        result.figures["largest_half_activation"] = peak
    loss = _check_autocast(pipeline, model, batch, device, mixed)
    result.figures["autocast_loss"] = loss
    return result


def _check_fp16_range(pipeline: Pipeline, model: torch.nn.Module, batch: dict[str, Any]) -> float:
    """The largest output of a layer autocast runs in fp16, in an fp32 forward; fail where one is beyond fp16."""
    import torch

    largest: dict[str, float] = {}

    def record(name: str) -> Any:
        def hook(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            if torch.is_tensor(output) and output.is_floating_point() and output.numel():
                value = float(output.detach().abs().float().nan_to_num(0.0, 0.0, 0.0).max())
                largest[name] = max(largest.get(name, 0.0), value)

        return hook

    handles = [
        module.register_forward_hook(record(name))
        for name, module in model.named_modules()
        if type(module).__name__ in HALF_UNDER_AUTOCAST
    ]
    try:
        with torch.no_grad():
            pipeline.loss(model, batch)
    finally:
        for handle in handles:
            handle.remove()
    beyond = [(name, value) for name, value in largest.items() if value > FP16_MAX]
    if beyond:
        name, value = beyond[0]
        raise diagnosis.PipelineFailure(
            f"under fp16=True, {len(beyond)} layers produce values beyond the fp16 range (65504) on the first batch, "
            f"first {name} ({value:.4g}): they become inf in fp16, then the loss NaN",
            "train in bf16 (bf16=True) where the GPU has it; models pretrained in bf16 and T5-family feed-forward "
            "layers overflow fp16. Otherwise keep the overflowing layers in fp32",
            [f"{layer}: {peak:.4g}" for layer, peak in beyond[:5]],
        )
    return max(largest.values(), default=0.0)


def _check_autocast(
    pipeline: Pipeline, model: torch.nn.Module, batch: dict[str, Any], device: str, mixed: str
) -> float:
    """A forward and backward of the batch under autocast in the script's precision: finite loss and gradients."""
    import torch

    dtype = torch.float16 if mixed == "fp16" else torch.bfloat16
    with pipeline.weights_kept(model):
        model.train()
        with torch.autocast(device_type=device, dtype=dtype):
            loss, _ = pipeline.loss_only(model, batch)
        value = float(loss.detach().float())
        if not math.isfinite(value):
            raise diagnosis.PipelineFailure(
                f"the loss of the first batch is {value} under {mixed} autocast (it is finite in fp32)",
                "look for a layer beyond the half-precision range or a loss computed in half precision; "
                + ("train in bf16 where the GPU has it" if mixed == "fp16" else "compute the loss in fp32"),
            )
        with diagnosis.pipeline_part(f"backward() under {mixed} autocast"):
            loss.backward()
        broken = non_finite(
            (name, parameter.grad) for name, parameter in model.named_parameters() if parameter.grad is not None
        )
    if broken:
        raise diagnosis.PipelineFailure(
            f"backward under {mixed} autocast gives non-finite gradients for {len(broken)} weights, e.g. {broken[0]}",
            "look for a layer beyond the half-precision range; "
            + ("train in bf16 where the GPU has it" if mixed == "fp16" else "keep that layer in fp32"),
        )
    return value


STAGE = Stage("precision", rank=100, run=run, needs=("backward",))
