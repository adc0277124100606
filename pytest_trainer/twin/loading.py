"""Build a twin where the script would build a model this machine cannot: every way a script gets its model.

While the script runs, `from_pretrained` of every transformers model class (the Auto classes, a TRL trainer given a
model id, the frameworks, sentence-transformers all end there), `from_config`, a model class built from a config, and
`PeftModel.from_pretrained` go through `Twins`. It decides, from the checkpoint's config alone, whether the real model
is built:

- `--trainer-model=real` always builds it; `twin` never does;
- `auto` (the default) builds a twin where the checkpoint's weights are not on this machine, or where the model
  has `CPU_LIMIT` parameters or more and the machine has no GPU (or more than the GPU holds);
- `CPU_ITEMS`, the session's own, is `twin` for the cpu items of a machine with a GPU, where `auto` built a model of
  `CPU_LIMIT` parameters or more at full size for the cuda items.

A twin is the checkpoint's architecture narrowed (`shrink`), with random weights, saved to a session folder and
loaded from there by the script's own `from_pretrained` call with the script's own arguments: its dtype, its
adapters and k-bit preparation, its attention implementation where this machine runs it. Only what this machine
cannot run is replaced (a quantization backend, a GPU device map, flash attention), and each replacement is said.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from pytest_trainer.twin import checkpoint, shrink

#: The mode of the cpu items' own run of a script whose model `auto` built at full size on a machine with a GPU.
CPU_ITEMS = "cpu items"

#: Versions of bitsandbytes from which its 4-bit and 8-bit layers run on a CPU.
BITSANDBYTES_ON_CPU = (0, 46)


@dataclass
class Twin:
    """One model the script asked for and got as a twin."""

    name: str
    model_class: str
    #: Why a twin was built, in words.
    reason: str
    checkpoint_shape: str
    twin_shape: str
    twin_parameters: int
    #: What this machine cannot run and the twin replaced, one line each.
    replaced: list[str] = field(default_factory=list)
    #: The checkpoint's own config (a PretrainedConfig), which the memory stage forecasts at full size.
    config: Any = None
    #: The checkpoint's parameters (counted on the meta device; 0 where they were not counted).
    checkpoint_parameters: int = 0
    #: The model class the script asked for (a transformers class), which the memory stage builds at full size.
    builder: Any = None
    #: Bits of the weights the script quantizes (4 or 8; 0: none), and the dtype the quantized layers compute in.
    quantized_bits: int = 0
    compute_dtype: Any = None

    def full_config(self) -> Any:
        """The checkpoint's config with an attention implementation this machine runs."""
        return _narrowed(self.config, narrow=False)

    def line(self) -> str:
        """The note every item of the pipeline carries."""
        size = f"{checkpoint.count(self.checkpoint_parameters)} parameters, " if self.checkpoint_parameters else ""
        return (
            f"model: a twin of {self.name} ({self.model_class}, {size}{self.checkpoint_shape}) with "
            f"{self.twin_shape} ({checkpoint.count(self.twin_parameters)} parameters) and random weights; its "
            f"config, tokenizer and data pipeline are the checkpoint's. A twin because {self.reason}. Checks that "
            "need the trained weights do not hold on it; give --trainer-model=real where the machine holds the model"
        )


class TwinError(Exception):
    """The plugin could not build the twin of a checkpoint: a limit of the twin, not a fault of the script."""

    def __init__(self, name: Any, model_class: str, error: Exception) -> None:
        first = str(error).splitlines()[0] if str(error) else ""
        self.cause = (
            f"pytest-trainer could not build a twin of {name} ({model_class}): narrowed to {shrink.WIDTH} wide, its "
            f"config raised {type(error).__name__}: {first}"
        )
        self.fix = (
            "this is a limit of the twin, not a fault of the script: run with --trainer-model=real on a machine that "
            "holds the model, and report the architecture to pytest-trainer"
        )
        super().__init__(self.cause)


class Twins:
    """The models of one script run: which were twins, and the folder their weights are saved to."""

    def __init__(self, mode: str, folder: Path) -> None:
        self.mode = mode
        self.folder = folder
        self.made: list[Twin] = []
        self._of: weakref.WeakKeyDictionary[Any, Twin] = weakref.WeakKeyDictionary()
        self._busy = False
        #: The configs a model was built from directly, by id (configs are not hashable): each is judged once.
        self._seen: dict[int, weakref.ref[Any]] = {}

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Route the script's model loading through this object while it runs."""
        from transformers import PreTrainedModel

        patches: list[Any] = [
            mock.patch.object(PreTrainedModel, "from_pretrained", self._wrap(PreTrainedModel, "from_pretrained")),
            mock.patch.object(PreTrainedModel, "_from_config", self._wrap(PreTrainedModel, "_from_config")),
        ]
        original_init = PreTrainedModel.__init__

        @functools.wraps(original_init)
        def init(model: Any, config: Any, *args: Any, **kwargs: Any) -> None:
            if not self._busy and self.mode != "real" and _is_config(config) and self._first_sight(config):
                self._constructed(model, config)
            original_init(model, config, *args, **kwargs)

        patches.append(mock.patch.object(PreTrainedModel, "__init__", init))
        with contextlib.suppress(ImportError):
            from peft import PeftModel

            patches.append(mock.patch.object(PeftModel, "from_pretrained", self._wrap(PeftModel, "from_pretrained")))
        with contextlib.ExitStack() as stack:
            for patch in patches:
                stack.enter_context(patch)
            yield

    def _wrap(self, owner: type, name: str) -> classmethod[Any, Any, Any]:
        """A classmethod that keeps the original's name, docstring and signature (frameworks read signatures)."""
        original: Any = owner.__dict__[name].__func__
        route: Any = {"from_pretrained": self._from_pretrained, "_from_config": self._from_config}[name]
        if owner.__name__ == "PeftModel":
            route = self._adapter_from_pretrained

        @functools.wraps(original)
        def replacement(cls: Any, *args: Any, **kwargs: Any) -> Any:
            if self._busy:
                return original(cls, *args, **kwargs)
            return route(functools.partial(original, cls), cls, *args, **kwargs)

        return classmethod(replacement)

    # ---- the ways in ----------------------------------------------------------------------------------

    def _from_pretrained(self, original: Any, cls: Any, name: Any = None, *model_args: Any, **kwargs: Any) -> Any:
        if self.mode == "real" or name is None:
            return original(name, *model_args, **kwargs)
        found = checkpoint.locate(name, kwargs.get("subfolder") or "", kwargs.get("revision"), kwargs.get("cache_dir"))
        config = kwargs.get("config")
        if found is None:
            return original(name, *model_args, **kwargs)
        if not _is_config(config):
            config = self._config(cls, name, kwargs)
            if config is None:  # unreadable: the script's own call says why, in transformers' words
                return original(name, *model_args, **kwargs)
        reason, parameters = self._reason(cls, config, found.weights)
        if reason is None:
            return original(name, *model_args, **kwargs)
        try:
            twin = self._record(name, cls, config, reason, parameters)
            folder = self._saved(cls, config, self._generation(cls, name, kwargs))
        except Exception as error:
            raise TwinError(name, cls.__name__, error) from error
        twin.quantized_bits, twin.compute_dtype = _bits(kwargs)
        kwargs, twin.replaced = runnable_here(kwargs)
        line = _attention_here(getattr(config, "_attn_implementation_internal", None))[1]
        if line is not None and line not in twin.replaced:
            twin.replaced.insert(0, line)
        for key in ("subfolder", "revision", "gguf_file"):
            kwargs.pop(key, None)
        if _is_config(kwargs.get("config")):
            kwargs["config"] = _narrowed(kwargs["config"])
        with self._quiet():
            model = original(str(folder), *model_args, **kwargs)
        with contextlib.suppress(AttributeError):  # where the script's code and the libraries look for its files
            model.config._name_or_path = str(name)
            model.name_or_path = str(name)
        self._keep(model, twin)
        return model

    def _from_config(self, original: Any, cls: Any, config: Any, **kwargs: Any) -> Any:
        if self.mode == "real" or not _is_config(config):
            return original(config, **kwargs)
        reason, parameters = self._reason(cls, config, weights=True)
        if reason is None:
            return original(config, **kwargs)
        name = getattr(config, "_name_or_path", "") or f"a {type(config).__name__}"
        try:
            twin = self._record(name, cls, config, reason, parameters)
            with self._quiet():  # the narrowed config is the twin's own: its construction is not judged again
                model = original(_narrowed(config), **kwargs)
        except Exception as error:
            raise TwinError(name, cls.__name__, error) from error
        self._keep(model, twin)
        return model

    def _first_sight(self, config: Any) -> bool:
        """Whether no model was built from this config object yet (a model's submodules share their parent's)."""
        seen = self._seen.get(id(config))
        if seen is not None and seen() is config:
            return False
        with contextlib.suppress(TypeError):
            self._seen[id(config)] = weakref.ref(config)
        return True

    def _constructed(self, model: Any, config: Any) -> None:
        """A model class built directly from a config (`LlamaForCausalLM(config)`): where it is to be a twin, the
        config it is built from is narrowed in place, before its layers are made from it."""
        cls = type(model)
        reason, parameters = self._reason(cls, config, weights=True)
        if reason is None:
            return
        name = getattr(config, "_name_or_path", "") or f"a {type(config).__name__}"
        full = _narrowed(config, narrow=False)
        try:
            twin = self._record(name, cls, full, reason, parameters)
            _update(config, shrink.narrow(config.to_dict()))
        except Exception as error:
            raise TwinError(name, cls.__name__, error) from error
        self._keep(model, twin)

    def _adapter_from_pretrained(
        self, original: Any, cls: Any, model: Any, model_id: Any, *args: Any, **kwargs: Any
    ) -> Any:
        """An adapter saved for the checkpoint does not fit its twin's narrow layers: the twin gets a fresh adapter of
        the same config (its target modules, rank and task), trainable as the script asked."""
        twin = self._twin_of(model)
        if twin is None:
            return original(model, model_id, *args, **kwargs)
        from peft import PeftConfig, get_peft_model

        adapter = PeftConfig.from_pretrained(
            model_id, **{key: kwargs[key] for key in ("subfolder", "revision", "cache_dir", "token") if key in kwargs}
        )
        trainable = bool(kwargs.get("is_trainable", False))
        adapter.inference_mode = not trainable
        wrapped = get_peft_model(model, adapter, adapter_name=kwargs.get("adapter_name", "default"))
        if not trainable:
            for parameter in wrapped.parameters():
                parameter.requires_grad_(False)
        twin.replaced.append(
            f"the adapter {model_id} is new on the twin (its saved weights fit the checkpoint's widths)"
        )
        self._of[wrapped] = twin
        return wrapped

    # ---- deciding and building ---------------------------------------------------------------------

    def _reason(self, cls: Any, config: Any, weights: bool) -> tuple[str | None, int]:
        """Why this model is a twin (None: the real one is built), and its parameters where they were counted."""
        import torch

        if self.mode == "twin":
            return "--trainer-model=twin asks for one", self._count(cls, config)
        if self.mode == CPU_ITEMS:
            return (
                f"the script trains a model of {checkpoint.count(checkpoint.CPU_LIMIT)} parameters or more, which the "
                "cpu items do not build at full size (the cuda items run it at full size)",
                self._count(cls, config),
            )
        if not weights:
            return "its weights are not on this machine (only its config and tokenizer files are read)", self._count(
                cls, config
            )
        if checkpoint.estimate(config.to_dict()) < checkpoint.CPU_LIMIT // 4:
            return None, 0
        parameters = self._count(cls, config)
        if not torch.cuda.is_available():
            if parameters >= checkpoint.CPU_LIMIT:
                return (
                    f"it has {checkpoint.count(parameters)} parameters and this machine has no GPU (a model from "
                    f"{checkpoint.count(checkpoint.CPU_LIMIT)} parameters is not built at full size on a CPU)",
                    parameters,
                )
            return None, parameters
        memory = torch.cuda.get_device_properties(0).total_memory
        if parameters * 2 > memory:  # its weights alone in 16 bits
            return f"its {checkpoint.count(parameters)} parameters do not fit this GPU in 16 bits", parameters
        return None, parameters

    def _count(self, cls: Any, config: Any) -> int:
        try:
            with self._quiet():
                return checkpoint.parameters(cls, _narrowed(config, narrow=False))
        except Exception:  # counted for the report only
            return 0

    def _generation(self, cls: Any, name: Any, kwargs: dict[str, Any]) -> Any:
        """The checkpoint's own generation config, where the class generates and the checkpoint has one (read as its
        config is: no weight file)."""
        from transformers import GenerationConfig

        hub = {
            key: kwargs[key]
            for key in ("subfolder", "revision", "cache_dir", "token", "local_files_only")
            if key in kwargs
        }
        try:
            if not cls.can_generate():
                return None
            return GenerationConfig.from_pretrained(name, **hub)
        except Exception:  # none (an encoder's checkpoint), or unreadable: the one derived from the config stands
            return None

    def _config(self, cls: Any, name: Any, kwargs: dict[str, Any]) -> Any:
        from transformers import AutoConfig, PretrainedConfig

        reader = cls.config_class if getattr(cls, "config_class", PretrainedConfig) is not PretrainedConfig else None
        hub = {
            key: kwargs[key]
            for key in ("subfolder", "revision", "cache_dir", "token", "trust_remote_code", "local_files_only")
            if key in kwargs
        }
        try:
            return (reader or AutoConfig).from_pretrained(name, **hub)
        except Exception:
            return None

    def _record(self, name: Any, cls: Any, config: Any, reason: str, parameters: int) -> Twin:
        full = config.to_dict()
        twin = Twin(
            str(name),
            cls.__name__,
            reason,
            shrink.shape(full),
            shrink.shape(shrink.narrow(full)),
            self._count(cls, _narrowed(config)),
            config=config,
            checkpoint_parameters=parameters,
            builder=cls,
        )
        self.made.append(twin)
        return twin

    def _saved(self, cls: Any, config: Any, generation: Any = None) -> Path:
        """The folder of the twin's weights, built once per architecture, config and generation config in the session.

        `generation` is the checkpoint's own generation config (Whisper's holds its languages and tasks, which its
        `generate` reads): the twin's folder holds it in place of the one derived from the model's config.
        """
        import torch

        narrowed = _narrowed(config)
        text = json.dumps(
            {
                "class": cls.__name__,
                "config": narrowed.to_dict(),
                "generation": generation.to_dict() if generation is not None else None,
            },
            sort_keys=True,
            default=str,
        )
        folder = self.folder / f"{cls.__name__}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
        if folder.is_dir():
            return folder
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            with self._quiet(), torch.random.fork_rng(devices=[]):  # the script's random state goes on unchanged
                torch.manual_seed(0)
                model = cls._from_config(narrowed)
            building = Path(tempfile.mkdtemp(dir=self.folder))
            model.save_pretrained(building)
            if generation is not None and model.can_generate():  # as read: save_pretrained would validate it anew
                generation.to_json_file(building / "generation_config.json")
            try:
                building.rename(folder)
            except OSError:  # another process of a distributed run saved the same twin first
                if not folder.is_dir():
                    raise
        finally:
            for left in self.folder.glob("tmp*"):
                shutil.rmtree(left, ignore_errors=True)
        return folder

    @contextlib.contextmanager
    def _quiet(self) -> Iterator[None]:
        """The plugin's own building (a twin, a count on the meta device): not routed through the twins again."""
        busy, self._busy = self._busy, True
        try:
            yield
        finally:
            self._busy = busy

    def _keep(self, model: Any, twin: Twin) -> None:
        with contextlib.suppress(TypeError):
            self._of[model] = twin

    def _twin_of(self, model: Any) -> Twin | None:
        try:
            return self._of.get(model)
        except TypeError:
            return None


def _is_config(value: Any) -> bool:
    from transformers import PretrainedConfig

    return isinstance(value, PretrainedConfig)


def _narrowed(config: Any, narrow: bool = True) -> Any:
    """A new config of the same class, narrowed, with an attention implementation this machine runs."""
    copied = type(config).from_dict(shrink.narrow(config.to_dict()) if narrow else config.to_dict())
    asked = getattr(config, "_attn_implementation_internal", None)
    if asked is not None:
        copied._attn_implementation_internal = _attention_here(asked)[0]
    return copied


def _update(config: Any, values: dict[str, Any]) -> None:
    """Set a config's attributes, and those of its nested configs, to `values`."""
    for key, value in values.items():
        current = getattr(config, key, None)
        if _is_config(current) and isinstance(value, dict):
            _update(current, value)
        elif current != value and not key.startswith("_") and key != "transformers_version":
            with contextlib.suppress(AttributeError):
                setattr(config, key, value)


def _attention_here(asked: Any) -> tuple[Any, str | None]:
    """The attention implementation the twin uses for the one asked for, and the line saying what was replaced."""
    import torch

    if not isinstance(asked, str) or "flash" not in asked:
        return asked, None
    if torch.cuda.is_available() and importlib.util.find_spec("flash_attn"):
        return asked, None
    return "sdpa", (
        f"attn_implementation={asked!r} needs a GPU and flash-attn: the twin uses 'sdpa', and the padding-free path "
        "of flash attention is not exercised"
    )


def runnable_here(kwargs: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The script's from_pretrained arguments with what this machine cannot run replaced, and a line for each."""
    import torch

    kwargs = dict(kwargs)
    replaced: list[str] = []
    gpu = torch.cuda.is_available()
    attention, line = _attention_here(kwargs.get("attn_implementation"))
    if line is not None:
        kwargs["attn_implementation"] = attention
        replaced.append(line)
    quantization = _quantization(kwargs)
    if quantization is not None:
        missing = (
            _bitsandbytes_missing(gpu) if quantization.endswith("(bitsandbytes)") else "a GPU" if not gpu else None
        )
        if missing:
            for key in ("quantization_config", "load_in_4bit", "load_in_8bit"):
                kwargs.pop(key, None)
            replaced.append(
                f"{quantization} needs {missing}: the twin loads unquantized in the script's dtype, so the k-bit "
                "layers under the adapters are not exercised (PEFT's k-bit preparation and the adapters are)"
            )
    device_map = kwargs.get("device_map")
    if not gpu and device_map is not None and _names_gpu(device_map):
        kwargs.pop("device_map")
        kwargs.pop("max_memory", None)
        replaced.append(f"device_map={device_map!r} places the model on GPUs: the twin is on the CPU")
    return kwargs, replaced


def _quantization(kwargs: dict[str, Any]) -> str | None:
    """The quantization a from_pretrained call asks for, in words, or None."""
    config = kwargs.get("quantization_config")
    if config is None:
        bits = 4 if kwargs.get("load_in_4bit") else 8 if kwargs.get("load_in_8bit") else 0
        return f"{bits}-bit quantization (bitsandbytes)" if bits else None
    read = config if isinstance(config, dict) else getattr(config, "__dict__", {})
    method = getattr(config, "quant_method", None) or read.get("quant_method", "")
    method = str(getattr(method, "value", method))
    if (
        "bitsandbytes" in str(method)
        or read.get("load_in_4bit")
        or read.get("load_in_8bit")
        or read.get("_load_in_4bit")
    ):
        bits = 4 if read.get("load_in_4bit") or read.get("_load_in_4bit") else 8
        return f"{bits}-bit quantization (bitsandbytes)"
    return f"{method or 'the'} quantization"


def _bits(kwargs: dict[str, Any]) -> tuple[int, Any]:
    """Bits of the bitsandbytes quantization a from_pretrained call asks for (0: none), and its compute dtype."""
    found = _quantization(kwargs)
    if found is None or not found.endswith("(bitsandbytes)"):
        return 0, None
    config = kwargs.get("quantization_config")
    read = config if isinstance(config, dict) else getattr(config, "__dict__", {})
    return int(found.split("-")[0]), read.get("bnb_4bit_compute_dtype")


def _bitsandbytes_missing(gpu: bool) -> str | None:
    """What bitsandbytes lacks to run here, or None."""
    try:
        version: str | None = importlib.metadata.version("bitsandbytes")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return bitsandbytes_lacks(version, gpu)


def bitsandbytes_lacks(version: str | None, gpu: bool) -> str | None:
    """What bitsandbytes of `version` (None: not installed) lacks to run on this machine, or None."""
    if version is None:
        return "bitsandbytes, which is not installed"
    if gpu:
        return None
    parts = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    return None if parts >= BITSANDBYTES_ON_CPU else f"a GPU (bitsandbytes {version} runs on a CPU from 0.46)"


def _names_gpu(device_map: Any) -> bool:
    if isinstance(device_map, dict):
        return any(_names_gpu(value) for value in device_map.values())
    if isinstance(device_map, int) and not isinstance(device_map, bool):
        return True
    text = str(device_map)
    return text.startswith(("cuda", "mps", "xpu", "npu")) or text.isdigit()
