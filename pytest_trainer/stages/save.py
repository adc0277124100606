"""`save`: the first checkpoint, which a dry run never writes, is written and reloads to the same model.

After training steps (so that adapters and heads differ from their initialisation), the Trainer's
own code writes a checkpoint into a temporary folder: `save_model` (weights, config, tokenizer or
processor) and the optimizer, scheduler and RNG states. The model is then reloaded the way a user
would (`from_pretrained` of the folder, `load_adapter` for a PEFT adapter) and must give the same
outputs on the fixed batch; a model of one's own, without from_pretrained, must find its whole state
dict, unchanged, in the checkpoint. The optimizer and scheduler are resumed with the Trainer's own
loader.
"""

from __future__ import annotations

import inspect
import re
import tempfile
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_trainer import diagnosis, model_facts, training
from pytest_trainer.stages.base import Stage, StageResult

if TYPE_CHECKING:
    import torch

    from pytest_trainer.pipeline import Pipeline

SAVING = "saving the model (Trainer.save_model)"
SAVING_STATE = "saving the optimizer, scheduler and RNG states (the Trainer's checkpoint)"
RESUMING = "resuming the optimizer and scheduler from the checkpoint (the Trainer's loader)"
RELOADING = "reloading the saved model"
#: Rows of the fixed batch the reloaded model is compared on: enough to show it is the same function.
COMPARED_ROWS = 2
#: Name under which a PEFT adapter is reloaded beside the one in training.
RELOADED_ADAPTER = "pytest_trainer_reloaded"


def run(pipeline: Pipeline, device: str) -> StageResult:
    import torch

    run = pipeline.fixed_batch_run(device)  # trained by the step and overfit stages, or one step here
    if run.steps == 0:
        run.step()
    model, batch = run.model, run.batch
    result = StageResult("save", device, batch=batch)
    trainer = pipeline.trainer
    with (
        tempfile.TemporaryDirectory(prefix="checkpoint-", dir=_parent(trainer)) as folder,
        training.holding(pipeline.trainer, model, run.optimizer, run.scheduler),
    ):
        try:
            with diagnosis.pipeline_part(SAVING):
                trainer.save_model(folder)
        except (RuntimeError, TypeError, ValueError) as error:
            unsaveable = _unsaveable(error, trainer)
            if unsaveable is None:
                raise
            raise unsaveable from error
        if getattr(trainer.args, "save_only_model", False):
            result.notes.append(
                "save_only_model=True: the Trainer's checkpoints hold the model alone, so resuming from one (its "
                "optimizer, scheduler and random state) is not checked"
            )
        else:  # as Trainer._save_checkpoint saves them, and resuming reloads them
            with diagnosis.pipeline_part(SAVING_STATE):
                trainer._save_optimizer_and_scheduler(folder)
                trainer._save_rng_state(folder)
            with diagnosis.pipeline_part(RESUMING):
                trainer._load_optimizer_and_scheduler(folder)
        files = sorted(path.name for path in Path(folder).iterdir())
        size = sum(path.stat().st_size for path in Path(folder).rglob("*") if path.is_file())
        model.eval()
        with torch.no_grad():
            how = _compare_reloaded(
                pipeline, model, first_rows(batch, pipeline.task.sequence, COMPARED_ROWS), folder, device
            )
        held = _check_processor(pipeline, folder)
    result.figures.update({"checkpoint_mib": size / 2**20, "checkpoint_files": float(len(files))})
    result.notes.append(f"checkpoint of {size / 2**20:.1f} MiB ({', '.join(files)}); {how}{held}")
    return result


def first_rows(batch: dict[str, Any], sequence: str | None, rows: int) -> dict[str, Any]:
    """The batch cut to its first `rows` rows: every tensor (of one dimension or more) and every list of one value per
    row (the texts a cross-encoder's loss tokenizes). A batch holding a tensor whose first dimension is not its rows
    (the image patches of all rows stacked, with one grid per image beside them) is kept whole: which of its entries
    belong to the first rows is the model's to know."""
    import torch

    anchor = batch.get(sequence or "")
    if not torch.is_tensor(anchor):
        anchor = next((value for value in batch.values() if torch.is_tensor(value) and value.dim()), None)
    if anchor is None or anchor.dim() == 0 or anchor.shape[0] <= rows:
        return batch
    count = anchor.shape[0]
    if any(torch.is_tensor(value) and value.dim() and value.shape[0] != count for value in batch.values()):
        return batch
    return {
        key: value[:rows]
        if (torch.is_tensor(value) and value.dim()) or (isinstance(value, list) and len(value) == count)
        else value
        for key, value in batch.items()
    }


def _parent(trainer: Any) -> str | None:
    """The Trainer's output folder (the plugin's own temporary one) when it exists."""
    output = Path(trainer.args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    return str(output)


def _outputs(pipeline: Pipeline, model: torch.nn.Module, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The floating-point tensors the Trainer's loss and the model's outputs give on the batch."""
    loss, outputs = pipeline.loss(model, batch)
    return _floats({"loss": loss, **_as_dict(outputs)})


def _forward_outputs(model: torch.nn.Module, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The floating-point outputs of the model's own class forward on the batch inputs it takes.

    A trainer may patch the forward of its model instance (TRL's fused LM head): a model reloaded from the
    checkpoint has no such patch, so both are compared through the forward their class defines.
    """
    accepted = set(inspect.signature(type(model).forward).parameters)
    inputs = {key: value for key, value in batch.items() if key in accepted}
    patched = model.__dict__.pop("forward", None)
    try:
        with diagnosis.pipeline_part("the model's forward"):
            outputs = model(**inputs)
    finally:
        if patched is not None:
            model.__dict__["forward"] = patched
    return _floats(_as_dict(outputs))


def _as_dict(outputs: Any) -> dict[str, Any]:
    if isinstance(outputs, dict):
        return dict(outputs)
    return {str(index): value for index, value in enumerate(outputs or ())}


def _floats(values: dict[str, Any]) -> dict[str, torch.Tensor]:
    import torch

    return {
        key: value.detach() for key, value in values.items() if torch.is_tensor(value) and value.is_floating_point()
    }


def _compare_reloaded(pipeline: Pipeline, model: Any, batch: dict[str, Any], folder: str, device: str) -> str:
    """Reload the checkpoint as a user would and fail when it gives other outputs; say how it was reloaded."""
    library = pipeline.family.reload(model, folder, device)
    if library is not None:
        reloaded, how = library
        reloaded.eval()
        _same_outputs(_outputs(pipeline, model, batch), _outputs(pipeline, reloaded, batch), how, [])
        _same_outputs(_floats(model.state_dict()), _floats(reloaded.state_dict()), how, [])
        return f"{how} reloads it to the same loss and weights"
    if hasattr(model, "peft_config") and callable(getattr(model, "load_adapter", None)):
        expected = _outputs(pipeline, model, batch)
        with diagnosis.pipeline_part(RELOADING):
            model.load_adapter(folder, adapter_name=RELOADED_ADAPTER)
        active = model.active_adapter
        try:
            model.set_adapter(RELOADED_ADAPTER)
            how = "the adapter reloaded with load_adapter"
            rounding = _adapter_rounding(model, active)
            if rounding:  # its outputs may move by the rounding: its weights and settings must be the very same
                _same_outputs(_adapter_weights(model, active), _adapter_weights(model, RELOADED_ADAPTER), how, [])
                _same_settings(model.peft_config[active], model.peft_config[RELOADED_ADAPTER])
            _same_outputs(expected, _outputs(pipeline, model, batch), how, [], rounding)
        finally:
            model.set_adapter(active)
            model.delete_adapter(RELOADED_ADAPTER)
        return "the adapter reloads (PeftModel.load_adapter) to the same outputs"
    from_pretrained = getattr(type(model), "from_pretrained", None)
    if callable(from_pretrained) and hasattr(model, "config"):
        with diagnosis.pipeline_part(RELOADING):
            reloaded, info = from_pretrained(folder, dtype=model.dtype, output_loading_info=True)
        reloaded.to(device).eval()
        how = f"{type(model).__name__}.from_pretrained"
        lost = sorted(info.get("missing_keys", ()))
        if model_facts.main_input(model) in batch:
            expected, found = _forward_outputs(model, batch), _forward_outputs(reloaded, batch)
        else:  # the trainer builds the model's inputs from columns of its own (preference pairs): through its loss
            expected, found = _outputs(pipeline, model, batch), _outputs(pipeline, reloaded, batch)
        shared = set(expected) & set(found)
        if shared:
            _same_outputs({key: expected[key] for key in shared}, found, how, lost)
        else:  # the forward gives nothing to compare: the weights must be the same
            _same_outputs(_floats(model.state_dict()), _floats(reloaded.state_dict()), how, lost)
        del reloaded
        return f"{how} reloads it to the same outputs"
    return _compare_state_dict(model, folder)


def _unsaveable(error: Exception, trainer: Any) -> diagnosis.PipelineFailure | None:
    """What the checkpoint cannot hold, when `error` says it; None for an error this does not explain."""
    message = str(error)
    if "share memory" in message:
        shared = re.findall(r"\[\{?([^\]]*?)\}?\]", message)
        return diagnosis.PipelineFailure(
            f"safetensors refuses to save weights that share memory without being declared tied"
            f"{f' ({shared[0]})' if shared else ''}: the first checkpoint (save_steps) and save_model fail",
            "declare the tie where the model is built (a PreTrainedModel lists it in _tied_weights_keys and ties "
            "it in tie_weights), or give each module its own copy (nn.Parameter(weight.clone())) when they are "
            "not meant to be shared",
        )
    if "JSON serializable" in message and _raised_saving_processor(error):
        return diagnosis.PipelineFailure(
            f"the {type(trainer.processing_class).__name__} saved beside the model holds a setting JSON cannot store "
            f"({message}): save_model fails at the first checkpoint",
            "keep the tokenizer's or processor's settings (its from_pretrained/init arguments, init_kwargs) to "
            "plain values (strings, numbers, lists, dicts)",
        )
    if "JSON serializable" in message:
        return diagnosis.PipelineFailure(
            f"the model's config holds a value JSON cannot store ({message}): save_pretrained fails at the "
            "first checkpoint",
            "keep config attributes to plain values (strings, numbers, lists, dicts); keep objects such as "
            "modules, dtypes or functions out of the config, or rebuild them from plain values in __init__",
        )
    return None


def _raised_saving_processor(error: Exception) -> bool:
    """Whether the tokenizer's or processor's save_pretrained raised `error`, rather than the model's."""
    files = [frame.filename for frame in traceback.extract_tb(error.__traceback__)]
    return any(re.search(r"(tokenization|processing|feature_extraction)_utils", name) for name in files)


def _adapter_rounding(model: Any, adapter: Any) -> float:
    """The rounding of an adapter trained in 16 bits (TRL keeps QLoRA's adapters in bf16), which PEFT's load_adapter
    casts to fp32: the reloaded adapter is the same one, its outputs differ at that rounding. 0 for a 32-bit one."""
    import torch

    names = adapter if isinstance(adapter, (list, tuple)) else [adapter]
    dtypes = {
        parameter.dtype
        for name, parameter in model.named_parameters()
        if any(f".{each}." in name for each in names) and parameter.is_floating_point()
    }
    return max((float(torch.finfo(dtype).eps) for dtype in dtypes if torch.finfo(dtype).bits < 32), default=0.0)


def _adapter_weights(model: Any, adapter: str) -> dict[str, Any]:
    """The weights of one adapter in fp32, named without the adapter's name."""
    marker = f".{adapter}."
    return {
        name.replace(marker, "."): parameter.detach().float()
        for name, parameter in model.named_parameters()
        if marker in name and parameter.is_floating_point()
    }


#: Settings of an adapter that a reload may change without changing the adapter.
ADAPTER_PLACES = ("inference_mode", "base_model_name_or_path", "revision")


def _same_settings(trained: Any, reloaded: Any) -> None:
    """The adapter's settings (rank, alpha, targets) in the checkpoint must be those it was trained with."""
    given, found = trained.to_dict(), reloaded.to_dict()
    changed = sorted(key for key in given if key not in ADAPTER_PLACES and given[key] != found.get(key))
    if changed:
        shown = ", ".join(f"{key} {given[key]!r} trained, {found.get(key)!r} saved" for key in changed[:4])
        raise diagnosis.PipelineFailure(
            f"the adapter's settings saved in the checkpoint are not those it was trained with ({shown}): the "
            "reloaded adapter scales or places its weights otherwise, and every checkpoint is a different model",
            "save the adapter with the config the model trains with: leave model.peft_config as get_peft_model made "
            "it, and change settings before get_peft_model, not before saving",
        )


#: Multiples of the rounding of 16-bit adapter weights that outputs may move by when they are reloaded in fp32.
ROUNDINGS = 4


def _same_outputs(
    expected: dict[str, Any], found: dict[str, Any], how: str, lost: list[str], rounding: float = 0.0
) -> None:
    import torch

    differences = {}
    for key, value in expected.items():
        other = found.get(key)
        if other is None or other.shape != value.shape:
            differences[key] = float("inf")
            continue
        tolerance = max(1e3 * torch.finfo(value.dtype).eps, ROUNDINGS * rounding)
        gap = float((value.float() - other.float()).abs().max()) if value.numel() else 0.0
        if gap > tolerance * (1 + float(value.float().abs().max())):
            differences[key] = gap
    if not differences:
        return
    shown = ", ".join(f"{key} by {gap:.3g}" for key, gap in differences.items())
    details = [f"weights the checkpoint lacks, newly initialised on reload: {', '.join(lost[:8])}"] if lost else []
    raise diagnosis.PipelineFailure(
        f"the model saved by the Trainer and reloaded with {how} gives other outputs on the same batch ({shown}): "
        "every checkpoint of this run, and the final model, would be a different model",
        "weights missing from the checkpoint come back newly initialised: declare weights shared with another "
        "module as tied (_tied_weights_keys, tie_word_embeddings), register every trained module as a submodule, "
        "and keep the config able to rebuild the model (a setting the constructor reads from elsewhere is lost)",
        details,
    )


def _compare_state_dict(model: Any, folder: str) -> str:
    """A model of the user's own has no from_pretrained: the checkpoint must hold its whole state dict."""
    import torch
    from safetensors.torch import load_file

    weights = Path(folder) / "model.safetensors"
    if not weights.is_file():
        binary = Path(folder) / "pytorch_model.bin"
        if not binary.is_file():
            raise diagnosis.PipelineFailure(
                f"Trainer.save_model wrote no weights for the {type(model).__name__} ({_listing(folder)})",
                "give the model save_pretrained/from_pretrained (subclass PreTrainedModel), or override "
                "Trainer._save to write its weights",
            )
    with diagnosis.pipeline_part(RELOADING):
        saved = load_file(str(weights)) if weights.is_file() else torch.load(binary, weights_only=True)
    state = model.state_dict()
    missing = sorted(set(state) - set(saved))
    changed = sorted(key for key in set(state) & set(saved) if not torch.equal(state[key].cpu(), saved[key].cpu()))
    if missing or changed:
        raise diagnosis.PipelineFailure(
            f"the checkpoint of the {type(model).__name__} lacks or alters weights it trains: "
            f"{', '.join((missing + changed)[:8])}",
            "save the model's whole state dict (Trainer._save writes model.state_dict() for a model of your own)",
        )
    return (
        f"the {type(model).__name__} has no from_pretrained: its checkpoint holds its whole state dict "
        "(reload it with load_state_dict(safetensors.torch.load_file(...)))"
    )


#: Files a saved tokenizer or processor writes, one at least.
PROCESSOR_FILES = ("tokenizer_config.json", "tokenizer.json", "preprocessor_config.json", "processor_config.json")


def _check_processor(pipeline: Pipeline, folder: str) -> str:
    """The tokenizer or processor saved beside the model loads back as the same one: its vocabulary, its chat
    template, and for a vision-language model the settings that prepare its images. A trainer that saves none (an
    adapter checkpoint, whose tokenizer is the base model's) is said so: the part of the note that says it, if any."""
    from pytest_trainer import vision_text

    processor = getattr(pipeline.trainer, "processing_class", None)
    from_pretrained = getattr(type(processor), "from_pretrained", None)
    if processor is None or not callable(from_pretrained) or not hasattr(processor, "save_pretrained"):
        return vision_text.check_processor_saved(pipeline)
    if not any((Path(folder) / name).is_file() for name in PROCESSOR_FILES):
        return f"; the trainer saves no {type(processor).__name__} with it (reload that from where the script loads it)"
    text_only = vision_text.check_processor_saved(pipeline)
    with diagnosis.pipeline_part(f"reloading the saved {type(processor).__name__}"):
        reloaded = from_pretrained(folder)
    compared = [
        ("vocabulary size", _vocabulary(processor), _vocabulary(reloaded)),
        ("chat template", getattr(processor, "chat_template", None), getattr(reloaded, "chat_template", None)),
    ]
    if pipeline.task.image_token is not None:
        compared += vision_text.image_settings(processor, reloaded)
    for what, before, after in compared:
        if before != after:
            raise diagnosis.PipelineFailure(
                f"the {type(processor).__name__} saved with the checkpoint reloads with another {what} "
                f"({before!r} became {after!r}): a reloaded model is fed otherwise than in training",
                "save the tokenizer or processor the script trains with (pass it as processing_class=) and keep its "
                "settings in what save_pretrained writes (its constructor or saved attributes), not in code a reload "
                "does not run",
            )
    return text_only


def _vocabulary(processor: Any) -> int | None:
    """The size of the vocabulary of a tokenizer, or of the one inside a processor (None where there is none)."""
    try:
        return len(getattr(processor, "tokenizer", processor))
    except TypeError:
        return None


def _listing(folder: str) -> str:
    names = sorted(path.name for path in Path(folder).iterdir())
    return f"it wrote {', '.join(names)}" if names else "the folder is empty"


# The first checkpoint, of the model the steps before trained.
STAGE = Stage(
    "save",
    rank=80,
    run=run,
    needs=("step",),
    same_on_every_device="a checkpoint holds the same files whichever device trained",
)
