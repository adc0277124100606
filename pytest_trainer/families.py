"""Trainer families: how each kind of Trainer makes its batches, takes its loss, and what it calls a label.

The plain `Trainer`, `Seq2SeqTrainer`, TRL's `SFTTrainer`, its preference trainers (DPO, reward, KTO, ORPO, CPO)
and its online RL trainers (GRPO, RLOO) feed and score a model in their own ways. A stage never asks which
trainer it has: it asks the pipeline's `Family`. A new kind of trainer plugs in as one class here, listed in
`FAMILIES`, or as a subclass of `Family` in another package, named by its `pytest_trainer.families` entry point.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

from pytest_trainer import diagnosis, extensions, model_facts, sampling, tasks, training
from pytest_trainer.catalogue import BATCH, RUN, SPLIT, checks

if TYPE_CHECKING:
    import torch
    from transformers import Trainer

#: Seed of the sampler that draws the fixed batch, so every stage and every run sees the same rows.
BATCH_SEED = 0
#: What a failure in drawing the first batch names.
TRAIN_LOADER = "the training dataloader (its dataset and data_collator)"


class Family:
    """The plain `Trainer`: its train dataloader makes the batches, its `compute_loss` takes the loss."""

    #: The trainer classes (by name, anywhere in the script's trainer's class hierarchy) of this family.
    trainers: tuple[str, ...] = ()
    name = "Trainer"
    #: Why the trainer tokenizes and pads batches of its own, so that rows cannot be cut or padded one by one
    #: by the property stages (None: they can).
    builds_own_batches: str | None = None
    #: The completions an online RL family sampled for its batch, and how they were scored (None for the others).
    sampled: sampling.Sampled | None = None
    #: What the overfit stage judges the fixed batch by: the loss, unless a family's loss cannot show learning.
    judged_as = "loss"
    #: Whether the trainer feeds every column of a split (it builds its own dataloaders and removes none).
    keeps_columns = False
    #: Why a batch cannot be cut into micro-batches by rows (its rows belong together), or None where it can.
    unsplittable: str | None = None
    #: Whether the family checks padding its own way (`check_padding`): its library pads the rows it encodes.
    padded_by_library = False

    def task(self, model: Any) -> tasks.Task:
        """What the model is trained to do with the labels this family feeds it."""
        return tasks.detect(model)

    def not_covered(self, stage: str) -> str | None:
        """Why pytest-trainer cannot yet check `stage` of this family's trainers (skipped with it), or None."""
        return None

    def draw(self, trainer: Trainer) -> dict[str, Any]:
        """The first batch of the Trainer's own train dataloader, drawn with a fixed seed."""
        import torch

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(BATCH_SEED)
            with diagnosis.pipeline_part(TRAIN_LOADER):
                return dict(next(iter(trainer.get_train_dataloader())))

    def loss(self, trainer: Trainer, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        """The Trainer's own loss (its compute_loss, subclasses included) and the model's outputs."""
        with (
            diagnosis.pipeline_part("the model's forward (through the Trainer's compute_loss)"),
            trainer.compute_loss_context_manager(),
        ):
            result = trainer.compute_loss(model, dict(batch), return_outputs=True)
        loss, outputs = result if isinstance(result, tuple) else (result, None)
        return loss, outputs

    def loss_value(self, trainer: Trainer, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        """The loss alone, as a training step takes it: a family that runs a forward of its own for the outputs
        (`SFT`) skips it here."""
        return self.loss(trainer, model, batch)[0]

    def judged(self, trainer: Trainer, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        """The figure that falls when the model learns the fixed batch (`judged_as`): the loss itself."""
        return self.loss(trainer, model, batch)

    def after_forward(self, trainer: Trainer) -> tuple[dict[str, float], list[str]]:
        """Figures and notes of what the trainer logged while it took the loss of a batch (nothing for the plain
        Trainer); raises a failure where they show the batch is broken."""
        return {}, []

    @checks("dataset", reads=SPLIT)
    def check_training(self, trainer: Trainer, split: Any) -> list[str]:
        """Notes of the family's own checks of the training split as fed (none for the plain Trainer); raises a
        finding where the split cannot train as the family feeds it."""
        return []

    def reload(self, model: Any, folder: str, device: str) -> tuple[Any, str] | None:
        """The model saved in `folder` reloaded as the family's library reloads it, and how; None where the model's
        own class (from_pretrained, a PEFT adapter) says how."""
        return None

    def evaluator(self, trainer: Trainer, model: Any) -> dict[str, float] | None:
        """The metrics of the evaluator the trainer runs at each evaluation beside its eval loss (None: it has none)."""
        return None

    @checks("padding", reads=BATCH)
    def check_padding(self, trainer: Trainer, split: Any) -> str | None:
        """The family's own padding property, where its library pads the rows itself (`padded_by_library`): a note of
        what was compared; raises a failure where padding changes the outputs."""
        return None

    def prediction_settings(self, trainer: Trainer) -> dict[str, Any]:
        """Keyword arguments the trainer's evaluation passes to its prediction step."""
        return {}

    def predict(
        self, trainer: Trainer, model: torch.nn.Module, batch: dict[str, Any], device: str, generate: bool = True
    ) -> tuple[Any, Any, Any]:
        """(loss, logits, labels) of the trainer's own prediction step on a batch on `device`, as its evaluation takes
        it (with `generate`, the generation settings of its evaluation too)."""
        settings = self.prediction_settings(trainer) if generate else {}
        # As Trainer.evaluate asks: the predictions only where compute_metrics reads them.
        loss_only = trainer.compute_metrics is None or bool(trainer.args.prediction_loss_only)
        with training.inputs_on(trainer, device):
            return trainer.prediction_step(model, batch, prediction_loss_only=loss_only, **settings)  # type: ignore[no-any-return]


class Seq2Seq(Family):
    """`Seq2SeqTrainer`: with predict_with_generate, evaluation generates with the arguments' settings."""

    trainers = ("Seq2SeqTrainer",)
    name = "Seq2SeqTrainer"

    def prediction_settings(self, trainer: Trainer) -> dict[str, Any]:
        """What Seq2SeqTrainer.evaluate passes to generate with predict_with_generate (max_length, num_beams)."""
        args = trainer.args
        if not getattr(args, "predict_with_generate", False) or hasattr(trainer, "_gen_kwargs"):
            return {}
        settings = {
            "max_length": getattr(args, "generation_max_length", None),
            "num_beams": getattr(args, "generation_num_beams", None),
        }
        return {name: value for name, value in settings.items() if value is not None}


class SFT(Family):
    """TRL's `SFTTrainer`: it tokenizes the text or chat data itself; its collator makes (completion-only) labels."""

    trainers = ("SFTTrainer",)
    name = "SFTTrainer"

    def loss(self, trainer: Trainer, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        """The trainer's own loss, and the model's outputs from a forward of their own: TRL's fused LM head builds no
        logits, and asking its compute_loss for them (return_outputs=True) is deprecated."""
        import torch

        loss = self.loss_value(trainer, model, batch)
        with (
            diagnosis.pipeline_part("the model's forward (through the Trainer's compute_loss)"),
            trainer.compute_loss_context_manager(),
            torch.no_grad(),
        ):
            outputs = model(**{key: value for key, value in batch.items() if key != "labels"}, use_cache=False)
        return loss, outputs

    def loss_value(self, trainer: Trainer, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        """The trainer's own loss without the second forward: it builds the logits of the whole vocabulary, which a
        training step never holds beside the loss's graph."""
        with (
            diagnosis.pipeline_part("the model's forward (through the Trainer's compute_loss)"),
            trainer.compute_loss_context_manager(),
        ):
            loss: torch.Tensor = trainer.compute_loss(model, dict(batch))  # type: ignore[assignment]
        return loss


class Preference(Family):
    """TRL's preference trainers: a batch holds chosen and rejected answers, scored against each other."""

    trainers = ("DPOTrainer", "RewardTrainer", "KTOTrainer", "ORPOTrainer", "CPOTrainer")
    name = "preference trainer"
    builds_own_batches = "preference pairs are tokenized and padded by the trainer itself, as chosen and rejected"
    unsplittable = (
        "a pair's chosen and rejected answers may sit in rows far apart (LLaMA-Factory and ms-swift "
        "stack all chosen rows above all rejected ones), so cutting the batch by rows would break pairs"
    )
    #: The token-id columns those trainers tokenize into (TRL's names across its versions).
    token_columns = (
        "prompt_ids",
        "chosen_ids",
        "rejected_ids",
        "completion_ids",
        "prompt_input_ids",
        "chosen_input_ids",
        "rejected_input_ids",
        "completion_input_ids",
        "input_ids_chosen",
        "input_ids_rejected",
    )

    def task(self, model: Any) -> tasks.Task:
        main = getattr(model_facts.base_model(model), "main_input_name", "input_ids")
        sequence = main if main in tasks.TOKEN_INPUTS else None
        return tasks.Task("preference pairs", tasks.PREFERENCE, sequence, more_token_columns=self.token_columns)

    @checks("forward", reads=RUN)
    def after_forward(self, trainer: Trainer) -> tuple[dict[str, float], list[str]]:
        """The batch's chosen and rejected log-probabilities and rewards (TRL's logged metrics): all finite."""
        figures = logged_preferences(trainer)
        broken = {name: value for name, value in figures.items() if not math.isfinite(value)}
        if broken:
            raise diagnosis.PipelineFailure(
                f"the preference batch gives non-finite figures: {broken}",
                "look for empty chosen or rejected answers after truncation (max_length, max_prompt_length) and for "
                "rows whose answer tokens are all masked",
            )
        shown = ", ".join(f"{name} {value:.4g}" for name, value in sorted(figures.items()) if "logps" in name)
        return figures, [f"preference batch: {shown}"] if figures else []


def logged_preferences(trainer: Any) -> dict[str, float]:
    """The last chosen and rejected log-probabilities and rewards a preference trainer logged: TRL's metrics
    (`_metrics`; `_stored_metrics` for ORPO and CPO), by mode then name, each a list of the values logged."""
    figures: dict[str, float] = {}
    for store in ("_metrics", "_stored_metrics"):
        logged = getattr(trainer, store, None)
        for metrics in logged.values() if isinstance(logged, dict) else ():
            for name, values in metrics.items() if isinstance(metrics, dict) else ():
                if name.split("/")[0] in ("logps", "rewards") and isinstance(values, list) and values:
                    figures[name.replace("/", "_")] = float(values[-1])
    return figures


class Online(Family):
    """TRL's online RL trainers (GRPO, RLOO): a batch is a group of prompts, completions sampled from the model with
    the script's generation settings, and their advantages, from the rewards the reward functions give them."""

    trainers = ("GRPOTrainer", "RLOOTrainer")
    name = "online RL trainer"
    builds_own_batches = "online RL samples its completions and scores them with its reward functions"
    judged_as = "negative log-likelihood of the completions with a positive advantage"
    #: The stages that check these trainers; the others skip with the reason.
    covered = (
        "load",
        "dataset",
        "collate",
        "targets",
        "forward",
        "backward",
        "step",
        "overfit",
        "precision",
        "labels",
        "lengths",
        "padding",
    )
    #: The stages that step on the batch's gradient, which is zero where every advantage is.
    stepping = ("backward", "step", "overfit")

    def __init__(self) -> None:
        self._no_signal: str | None = None

    def task(self, model: Any) -> tasks.Task:
        main = getattr(model_facts.base_model(model), "main_input_name", "input_ids")
        sequence = main if main in tasks.TOKEN_INPUTS else None
        return tasks.Task(
            "online RL (prompts, sampled completions, rewards)",
            tasks.REWARD,
            sequence,
            more_token_columns=("prompt_ids", "completion_ids"),
        )

    def draw(self, trainer: Trainer) -> dict[str, Any]:
        """The trainer's first generation batch: prompts drawn, completions sampled and scored, with a fixed seed."""
        batch, self.sampled = sampling.sample(trainer)
        if not hasattr(trainer, "current_gradient_accumulation_steps"):  # set by train(); the loss scales by it
            trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
        if self.sampled.masks_truncated and self.sampled.ended and not any(self.sampled.ended):
            self._no_signal = (
                "every sampled completion is cut at max_completion_length and mask_truncated_completions drops it "
                "from the loss, so the policy loss has no gradient to check (targets says why)"
            )
        elif not sampling.has_advantage(batch):
            self._no_signal = (
                f"every advantage of the sampled batches is 0: each prompt's {self.sampled.group} completions got the "
                "same total reward, so the policy loss has no gradient to check (targets says why)"
            )
        return batch

    def loss(self, trainer: Trainer, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        """The trainer's own policy loss of the sampled completions, weighted by their advantages."""
        with diagnosis.pipeline_part("the policy loss (the trainer's compute_loss)"):
            loss: torch.Tensor = trainer.compute_loss(model, dict(batch))  # type: ignore[assignment]
        return loss, None

    def judged(self, trainer: Trainer, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        """The mean negative log-likelihood of the completions the rewards favour (a positive advantage): steps on
        the batch raise their likelihood, while the policy loss itself stays near 0 by construction."""
        import torch

        prompt, completion = batch["prompt_ids"], batch["completion_ids"]
        ids = torch.cat([prompt, completion], dim=1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        with diagnosis.pipeline_part("the model's forward on the sampled completions"):
            online: Any = trainer  # TRL's GRPO and RLOO trainers
            logps = online._get_per_token_logps_and_entropies(model, ids, mask, completion.size(1))[0]
        favoured = (batch["advantages"].reshape(len(ids), -1)[:, :1] > 0) & batch["completion_mask"].bool()
        return -(logps * favoured).sum() / favoured.sum().clamp(min=1), None

    def not_covered(self, stage: str) -> str | None:
        if stage in self.stepping and self._no_signal:
            return self._no_signal
        if stage in self.covered:
            return None
        return f"online RL (GRPO, RLOO): pytest-trainer does not check {stage} of these trainers yet"


class SentenceTransformers(Family):
    """sentence-transformers' trainers: every column is fed, the collator (or the loss, for a cross-encoder) tokenizes
    each text column, and the loss module (which holds the model) takes the embeddings or scores and the label."""

    trainers = ("SentenceTransformerTrainer", "CrossEncoderTrainer", "SparseEncoderTrainer")
    name = "sentence-transformers trainer"
    builds_own_batches = "sentence-transformers tokenizes each text column itself, in its collator or its loss"
    keeps_columns = True
    padded_by_library = True

    def task(self, model: Any) -> tasks.Task:
        return tasks.Task(f"sentence-transformers ({type(model).__name__})", tasks.EMBEDDING, None, conventional=False)

    def loss(self, trainer: Trainer, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        """The trainer's loss, scored with `model`: the library's losses hold the model they score with, so another
        copy of it (a reloaded one, say) is put in the loss for the call."""
        losses = list(trainer.loss.values()) if isinstance(trainer.loss, dict) else [trainer.loss]  # type: ignore[attr-defined]
        held = getattr(losses[0], "model", None)
        if held is None or held is model:
            return super().loss(trainer, model, batch)
        owner: Any = trainer
        for loss in losses:
            owner.override_model_in_loss(loss, model)
        try:
            return super().loss(trainer, model, batch)
        finally:
            for loss in losses:
                owner.override_model_in_loss(loss, held)

    @checks("dataset", reads=SPLIT)
    def check_training(self, trainer: Trainer, split: Any) -> list[str]:
        """Texts the model truncates, and texts repeated within a batch under an in-batch-negatives loss."""
        from pytest_trainer import embeddings

        notes = [note for note in (embeddings.truncated(trainer, split),) if note]
        note, finding = embeddings.check_duplicates(trainer, split)
        if finding is not None:
            raise finding
        return notes + ([note] if note else [])

    def evaluator(self, trainer: Trainer, model: Any) -> dict[str, float] | None:
        """The trainer's evaluator, run on the model as its evaluation runs it (without writing its CSV)."""
        evaluator = getattr(trainer, "evaluator", None)
        if evaluator is None:
            return None
        with diagnosis.pipeline_part(f"the trainer's evaluator ({type(evaluator).__name__})"):
            metrics = evaluator(model)
        values = metrics if isinstance(metrics, dict) else {"evaluator": metrics}
        return {str(name): float(value) for name, value in values.items() if isinstance(value, (int, float))}

    @checks("padding", reads=BATCH)
    def check_padding(self, trainer: Trainer, split: Any) -> str | None:
        """A text's embedding does not depend on the padding its batch gives it (`embeddings.check_padded`)."""
        from pytest_trainer import embeddings

        return embeddings.check_padded(trainer, split)

    def reload(self, model: Any, folder: str, device: str) -> tuple[Any, str] | None:
        with diagnosis.pipeline_part(f"reloading the saved {type(model).__name__}"):
            return type(model)(folder, device=device), f"{type(model).__name__}(folder)"


#: The families, most specific first; a trainer none of them names is a plain Trainer.
FAMILIES: tuple[type[Family], ...] = (Online, Preference, SFT, Seq2Seq, SentenceTransformers)


@functools.cache
def registered() -> tuple[type[Family], ...]:
    """The families installed packages add through the `pytest_trainer.families` entry points (`extensions`)."""

    def fits(value: Any) -> bool:
        return isinstance(value, type) and issubclass(value, Family)

    return tuple(family for _, family in extensions.loaded(extensions.FAMILIES, "a subclass of Family", fits))


def family_of(trainer: Any) -> Family:
    """The family of a trainer, read from its class hierarchy (a subclass of the user's own keeps its family): the
    installed packages' families first, so that one may take over a trainer class a built-in family covers."""
    names = {cls.__name__ for cls in type(trainer).__mro__}
    return next((family() for family in (*registered(), *FAMILIES) if names & set(family.trainers)), Family())
