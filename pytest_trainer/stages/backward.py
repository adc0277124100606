"""`backward`: the loss reaches every trainable parameter with a finite gradient."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_trainer import diagnosis
from pytest_trainer.stages import StageResult
from pytest_trainer.stages.forward import checked_loss

if TYPE_CHECKING:
    from pytest_trainer.pipeline import Pipeline

#: How many parameter names a message lists before it says "and N more".
SHOWN = 5


def run(pipeline: Pipeline, device: str) -> StageResult:
    import torch

    model = pipeline.model_on(device)
    batch = pipeline.batch_on(device)
    trainable = [(name, parameter) for name, parameter in model.named_parameters() if parameter.requires_grad]
    if not trainable:
        raise diagnosis.PipelineFailure(
            "the model has no trainable parameter: every parameter has requires_grad=False, so nothing can learn",
            "unfreeze what should train, e.g. model.requires_grad_(True), or only the head's parameters",
        )
    with pipeline.weights_kept(model):
        model.train()
        model.zero_grad(set_to_none=True)
        loss, outputs = pipeline.loss(model, batch)
        value = checked_loss(loss)
        if loss.grad_fn is None:
            raise diagnosis.PipelineFailure(
                "the loss is detached from the model (it has no grad_fn), so backward() reaches no parameter",
                "compute the loss from the model's outputs without torch.no_grad(), .detach(), .item() or "
                "numpy in between, and return that tensor from compute_loss",
            )
        with diagnosis.pipeline_part("backward() through the model"):
            loss.backward()
        # Kept by reference: weights_kept() only unhooks them from the parameters, so no copy is needed.
        gradients = {name: parameter.grad.detach() for name, parameter in trainable if parameter.grad is not None}
    missing = [name for name, _ in trainable if name not in gradients]
    if missing:
        raise diagnosis.PipelineFailure(
            f"{len(missing)} of {len(trainable)} trainable parameters get no gradient from the loss: "
            f"{_names(missing)}",
            "if they should not train, freeze them (requires_grad=False); otherwise look for .detach(), "
            "torch.no_grad() or a branch of forward() that leaves them out of the loss",
        )
    broken = [name for name, gradient in gradients.items() if not torch.isfinite(gradient).all()]
    if broken:
        raise diagnosis.PipelineFailure(
            f"non-finite gradients (NaN or inf) in {len(broken)} parameters: {_names(broken)}",
            "look for NaN or infinite inputs or labels, a loss that divides by zero, or fp16 overflow "
            "(use bf16 or a loss scaler)",
        )
    norm = float(torch.linalg.vector_norm(torch.stack([g.float().norm() for g in gradients.values()])))
    return StageResult(
        "backward", device, batch=batch, outputs=outputs, loss=value, gradients=gradients,
        figures={"gradient_norm": norm, "trainable_parameters": float(sum(p.numel() for _, p in trainable))},
    )


def _names(names: list[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more
