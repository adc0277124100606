"""Forecast of the memory one training step and one evaluation take, without allocating it.

The model's weights are swapped for fake tensors (torch's FakeTensorMode: shapes and dtypes, no
storage), and the Trainer's own optimizer, the Trainer's loss, backward and the optimizer step run on
them while a dispatch mode counts the bytes of every tensor alive. The optimizer first steps once on
zero gradients, so its state is there, as in every step of a run but the first; the step after it is
the one measured.
"""

from __future__ import annotations

import copy
import functools
import re
import types
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch.utils._python_dispatch import TorchDispatchMode

from pytest_trainer import diagnosis, training

if TYPE_CHECKING:
    import torch

    from pytest_trainer.pipeline import Pipeline
    from pytest_trainer.twin.loading import Twin

GIB = 2**30


@dataclass
class Forecast:
    """Bytes at the peak of a steady training step, by part."""

    peak: int
    parts: dict[str, int] = field(default_factory=dict)
    #: How it was found.
    how: str = "fake tensors (nothing allocated)"
    #: Bytes of the gradients of the trainable weights, which the step holds at the end of backward.
    gradients: int = 0

    def describe(self) -> str:
        shown = ", ".join(f"{name} {size(value)}" for name, value in self.parts.items() if value)
        return f"{size(self.peak)} ({shown})"


def size(count: int) -> str:
    """Bytes in the unit a person reads: `512 bytes`, `3.5 KiB`, `43.1 MiB`, `1.27 GiB`."""
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale * 1000 / 1024:  # 1023.9 KiB reads 0.999 MiB, not 1.02e+03 KiB
            return f"{count / scale:.3g} {unit}"
    return f"{count} bytes"


@contextmanager
def fake_weights(model: torch.nn.Module, mode: Any, device: str = "cpu") -> Iterator[None]:
    """Swap every parameter and buffer of `model` for a fake tensor of its shape and dtype, then put them back.

    Weights shared between modules stay shared; gradients and requires_grad are kept per parameter.
    """
    import torch

    swapped: list[tuple[dict[str, Any], str, Any]] = []
    fakes: dict[int, Any] = {}
    try:
        for module in model.modules():
            for table in (module._parameters, module._buffers):
                for name, tensor in list(table.items()):
                    if tensor is None:
                        continue
                    fake: Any = fakes.get(id(tensor))
                    if fake is None:
                        if tensor.is_meta:  # a model built at full size without storage
                            with mode:
                                fake = torch.empty(tensor.shape, dtype=tensor.dtype, device=device)
                        else:
                            fake = mode.from_tensor(tensor.detach())
                        if isinstance(tensor, torch.nn.Parameter):
                            fake = torch.nn.Parameter(fake, requires_grad=tensor.requires_grad)
                        fakes[id(tensor)] = fake
                    swapped.append((table, name, tensor))
                    table[name] = fake
        yield
    finally:
        for table, name, tensor in reversed(swapped):
            table[name] = tensor


def training_step(pipeline: Pipeline, model: torch.nn.Module, batch: dict[str, Any], dtype: Any = None) -> Forecast:
    """The peak memory of a steady training step of `model` on `batch`, under autocast to `dtype` when given.

    Fake tensors first; a pipeline that reads the values of its tensors (an `.item()` in its loss) cannot run on
    them, and its step is taken for real on the model's device and tracked the same way.
    """
    try:
        return _training_step(pipeline, model, batch, dtype, fake=True)
    except Exception:  # the real step below fails in the same way where the pipeline itself is broken
        with pipeline.weights_kept(model):
            forecast = _training_step(pipeline, model, batch, dtype, fake=False)
        forecast.how = "a real step tracked on this machine (the pipeline reads tensor values, which fake tensors lack)"
        return forecast


def _training_step(
    pipeline: Pipeline, model: torch.nn.Module, batch: dict[str, Any], dtype: Any, fake: bool, made_up: bool = False
) -> Forecast:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else None
    device = next(
        (p.device.type for p in model.parameters() if not p.is_meta),  # a model at full size on meta: the batch's
        next((value.device.type for value in batch.values() if torch.is_tensor(value)), "cpu"),
    )
    autocast = torch.autocast(device_type=device, dtype=dtype) if dtype is not None else nullcontext()
    was_training = model.training
    with (
        fake_weights(model, mode, device) if mode else nullcontext(),
        training.trainer_optimizer(pipeline.trainer, model) as (optimizer, _),
    ):
        if mode:
            batch = {key: mode.from_tensor(value) if torch.is_tensor(value) else value for key, value in batch.items()}
        model.train()
        tracker = LiveBytes(made_up)
        try:
            with mode or nullcontext():
                _prime(model, optimizer)
                with tracker:
                    _step(pipeline, model, batch, optimizer, autocast)
        finally:
            model.train(was_training)
        parts = {
            "weights": _bytes(model.parameters()),
            "buffers": _bytes(model.buffers()),
            "optimizer state": _bytes(
                value for state in optimizer.state.values() for value in state.values() if torch.is_tensor(value)
            ),
        }
        gradients = _bytes(parameter for parameter in model.parameters() if parameter.requires_grad)
        others = [
            value
            for name, value in vars(pipeline.trainer).items()  # a reference or reward model beside it
            if isinstance(value, torch.nn.Module)
            and name != "model_wrapped"  # the trained model itself, wrapped (or its twin, beside a full-size forecast)
            and value is not model
            and not _contains(value, model)
        ]
        if others:
            own = {id(tensor.untyped_storage()) for tensor in [*model.parameters(), *model.buffers()]}
            parts["other models of the trainer"] = _bytes(
                tensor
                for other in others
                for tensor in [*other.parameters(), *other.buffers()]
                if id(tensor.untyped_storage()) not in own
            )
    parts["activations and gradients"] = tracker.peak
    return Forecast(sum(parts.values()), parts, gradients=gradients)


def checkpoint_step(pipeline: Pipeline, twin: Twin, batch: dict[str, Any], dtype: Any) -> Forecast:
    """The peak memory of a steady training step of the checkpoint a twin stands for, at its full size.

    The checkpoint's model is built from its own config on the meta device and made as the script made its twin:
    the same adapters, the same dtype and trainability per weight (a layer of the checkpoint takes those of the
    twin's layer of its kind), gradient checkpointing as the Trainer turns it on. Its step then runs on fake tensors.
    Weights the script quantizes count at their bits (the k-bit layers compute in their compute dtype).
    """
    import torch

    from pytest_trainer import adapters, model_facts

    with torch.device("meta"):
        full = twin.builder._from_config(twin.full_config())
    trained = pipeline.model
    _patches_moved(model_facts.base_model(trained), full)
    adapters_of = getattr(trained, "peft_config", None)
    if isinstance(adapters_of, dict) and adapters_of:
        from peft import get_peft_model

        names = list(adapters_of)
        full = get_peft_model(full, copy.deepcopy(adapters_of[names[0]]), adapter_name=names[0])
        for name in names[1:]:
            full.add_adapter(name, copy.deepcopy(adapters_of[name]))
    kinds = {_kind(name): parameter for name, parameter in trained.named_parameters()}
    quantized = 0
    for name, parameter in full.named_parameters():
        like = kinds.get(_kind(name))
        if like is None:
            continue
        parameter.requires_grad_(like.requires_grad)
        into = like.dtype
        if twin.quantized_bits and _quantizable(full, name) and not like.requires_grad:
            into = twin.compute_dtype if isinstance(twin.compute_dtype, torch.dtype) else torch.float32
            quantized += parameter.numel()
        parameter.data = parameter.data.to(into)
    if pipeline.checkpointing:
        adapters.enable_checkpointing(pipeline.trainer, full)
    forecast = _training_step(pipeline, full, batch, dtype, fake=True, made_up=True)
    if quantized:
        held = sum(
            parameter.numel() * parameter.element_size()
            for name, parameter in full.named_parameters()
            if _quantizable(full, name) and not parameter.requires_grad
        )
        stored = quantized * twin.quantized_bits // 8
        forecast.parts["weights"] += stored - held
        forecast.peak += stored - held
    forecast.how = f"the checkpoint's own config at full size on fake tensors ({twin.name}, nothing allocated)"
    return forecast


def _patches_moved(twin: torch.nn.Module, full: torch.nn.Module) -> None:
    """Give `full` the methods a trainer set on its twin's instance (TRL's fused LM head replaces `forward`), bound to
    `full`: what the patch kept of the twin (its original forward, its config) is taken from `full` instead."""
    for name, patched in list(vars(twin).items()):
        if not isinstance(patched, types.MethodType) or patched.__self__ is not twin:
            continue
        function = patched.__func__
        cells = tuple(types.CellType(_moved(cell.cell_contents, twin, full)) for cell in function.__closure__ or ())
        moved = types.FunctionType(
            function.__code__, function.__globals__, function.__name__, function.__defaults__, cells or None
        )
        moved.__kwdefaults__ = function.__kwdefaults__
        moved.__dict__.update(function.__dict__)
        setattr(full, name, types.MethodType(moved, full))


def _moved(value: Any, twin: Any, full: Any) -> Any:
    """What a patch of `twin` held, as it is for `full`."""
    if value is twin:
        return full
    if value is getattr(twin, "config", None):
        return full.config
    if isinstance(value, types.MethodType) and value.__self__ is twin:
        return types.MethodType(getattr(type(full), value.__func__.__name__, value.__func__), full)
    return value


def _kind(name: str) -> str:
    """A weight's name with its layer indices taken out: the weights of every layer of one kind share it."""
    return re.sub(r"\.\d+(?=\.)", ".#", name)


def _quantizable(model: torch.nn.Module, name: str) -> bool:
    """Whether bitsandbytes quantizes this weight: a Linear layer's weight, but the output head and adapters."""
    import torch

    module_name, _, leaf = name.rpartition(".")
    if leaf != "weight" or "lm_head" in module_name or "lora_" in module_name or "modules_to_save" in module_name:
        return False
    try:
        module = model.get_submodule(module_name)
    except AttributeError:
        return False
    return type(module) is torch.nn.Linear


def _contains(wrapper: torch.nn.Module, model: torch.nn.Module) -> bool:
    """Whether `wrapper` holds `model` (DDP, torch.compile), so that its weights are the model's."""
    return any(module is model for module in wrapper.modules())


def _bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages under `tensors`."""
    storages = {id(storage): storage.nbytes() for storage in (tensor.untyped_storage() for tensor in tensors)}
    return sum(storages.values())


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of every tensor storage an operation creates, for as long as it lives, and their peak.

    A storage an operation returns among its inputs' (an in-place update, a view) was there before: not counted.
    """

    def __init__(self, made_up: bool = False) -> None:
        super().__init__()
        #: Answer a read of a fake tensor's value (`.item()`) with 1: a model without values, whose step reads them
        #: only for metrics and branches that do not change what it holds.
        self.made_up = made_up
        self.current = self.peak = 0
        self._live: dict[int, tuple[int, weakref.ref[Any]]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        import torch
        from torch.utils import _pytree

        if self.made_up and func is torch.ops.aten._local_scalar_dense.default:
            return True if args[0].dtype == torch.bool else 1
        out = func(*args, **(kwargs or {}))
        given = {
            id(value.untyped_storage())
            for value in _pytree.tree_leaves((args, kwargs))
            if isinstance(value, torch.Tensor)
        }
        for value in _pytree.tree_leaves(out):
            if isinstance(value, torch.Tensor):
                storage = value.untyped_storage()
                if id(storage) not in given and id(storage) not in self._live:
                    self._count(storage)
        return out

    def _count(self, storage: Any) -> None:
        key, size = id(storage), int(storage.nbytes())
        self._live[key] = (size, weakref.ref(storage, functools.partial(self._free, key)))
        self.current += size
        self.peak = max(self.peak, self.current)

    def _free(self, key: int, _: Any = None) -> None:
        size, _ = self._live.pop(key, (0, None))
        self.current -= size


def _prime(model: torch.nn.Module, optimizer: Any) -> None:
    """An optimizer step on zero gradients, so its state comes to be as after a first step, without a forward."""
    import torch

    for parameter in model.parameters():
        if parameter.requires_grad:
            parameter.grad = torch.zeros_like(parameter)
    with diagnosis.pipeline_part("the optimizer's step"):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _step(pipeline: Pipeline, model: torch.nn.Module, batch: dict[str, Any], optimizer: Any, autocast: Any) -> None:
    with autocast:  # the outputs are dropped before backward, as the Trainer's training_step drops them
        loss = pipeline.loss_only(model, batch)[0]
    with diagnosis.pipeline_part("backward() through the model"):
        loss.backward()
    with diagnosis.pipeline_part("the optimizer's step"):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def eval_outputs_per_row(pipeline: Pipeline, model: torch.nn.Module, batch: dict[str, Any], device: str) -> int:
    """Bytes the Trainer keeps per evaluation row when it gathers predictions for compute_metrics.

    What it keeps are the model's outputs but the loss (through preprocess_logits_for_metrics when set),
    and the labels; computed on fake tensors where the pipeline runs on them, else for real.
    """
    try:
        return _eval_outputs_per_row(pipeline, model, batch, device, fake=True)
    except Exception:  # as in training_step
        return _eval_outputs_per_row(pipeline, model, batch, device, fake=False)


def _eval_outputs_per_row(
    pipeline: Pipeline, model: torch.nn.Module, batch: dict[str, Any], device: str, fake: bool
) -> int:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    trainer = pipeline.trainer
    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else None
    was_training = model.training
    with fake_weights(model, mode) if mode else nullcontext(), mode or nullcontext(), torch.no_grad():
        model.eval()
        inputs = {
            key: mode.from_tensor(value) if mode and torch.is_tensor(value) else value for key, value in batch.items()
        }
        try:
            with diagnosis.pipeline_part("the Trainer's prediction step"):
                _, logits, labels = pipeline.family.predict(trainer, model, inputs, device, generate=False)
            preprocess: Any = trainer.preprocess_logits_for_metrics
            if logits is not None and preprocess is not None:
                with diagnosis.pipeline_part("preprocess_logits_for_metrics"):
                    logits = preprocess(logits, labels)
        finally:
            model.train(was_training)
    rows = next((int(value.shape[0]) for value in batch.values() if torch.is_tensor(value) and value.dim()), 1)
    return (_nbytes(logits) + _nbytes(labels)) // max(rows, 1)


def _nbytes(value: Any) -> int:
    import torch

    if torch.is_tensor(value):
        return int(value.numel() * value.element_size())
    if isinstance(value, dict):
        return sum(_nbytes(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(item) for item in value)
    return 0
