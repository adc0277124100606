"""Trainer families: how each kind of Trainer makes its batches, takes its loss, and what it calls a label.

The plain `Trainer`, `Seq2SeqTrainer`, TRL's `SFTTrainer`, its preference trainers (DPO, reward, KTO, ORPO, CPO)
and its online RL trainers (GRPO, RLOO) feed and score a model in their own ways. A stage never asks which
trainer it has: it asks the pipeline's `Family`. A new kind of trainer plugs in as one class here, listed in
`FAMILIES`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from pytest_trainer import diagnosis, model_facts, tasks, training

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
        with diagnosis.pipeline_part("the model's forward (through the Trainer's compute_loss)"), \
                trainer.compute_loss_context_manager():
            result = trainer.compute_loss(model, dict(batch), return_outputs=True)
        loss, outputs = result if isinstance(result, tuple) else (result, None)
        return loss, outputs

    def after_forward(self, trainer: Trainer) -> tuple[dict[str, float], list[str]]:
        """Figures and notes of what the trainer logged while it took the loss of a batch (nothing for the plain
        Trainer); raises a failure where they show the batch is broken."""
        return {}, []

    def prediction_settings(self, trainer: Trainer) -> dict[str, Any]:
        """Keyword arguments the trainer's evaluation passes to its prediction step."""
        return {}

    def predict(self, trainer: Trainer, model: torch.nn.Module, batch: dict[str, Any], device: str,
                generate: bool = True) -> tuple[Any, Any, Any]:
        """(loss, logits, labels) of the trainer's own prediction step on a batch on `device`, as its evaluation takes
        it (with `generate`, the generation settings of its evaluation too)."""
        settings = self.prediction_settings(trainer) if generate else {}
        with training.inputs_on(trainer, device):
            return trainer.prediction_step(model, batch, prediction_loss_only=False, **settings)  # type: ignore[no-any-return]


class Seq2Seq(Family):
    """`Seq2SeqTrainer`: with predict_with_generate, evaluation generates with the arguments' settings."""

    trainers = ("Seq2SeqTrainer",)
    name = "Seq2SeqTrainer"

    def prediction_settings(self, trainer: Trainer) -> dict[str, Any]:
        """What Seq2SeqTrainer.evaluate passes to generate with predict_with_generate (max_length, num_beams)."""
        args = trainer.args
        if not getattr(args, "predict_with_generate", False) or hasattr(trainer, "_gen_kwargs"):
            return {}
        settings = {"max_length": getattr(args, "generation_max_length", None),
                    "num_beams": getattr(args, "generation_num_beams", None)}
        return {name: value for name, value in settings.items() if value is not None}


class SFT(Family):
    """TRL's `SFTTrainer`: it tokenizes the text or chat data itself; its collator makes (completion-only) labels."""

    trainers = ("SFTTrainer",)
    name = "SFTTrainer"


class Preference(Family):
    """TRL's preference trainers: a batch holds chosen and rejected answers, scored against each other."""

    trainers = ("DPOTrainer", "RewardTrainer", "KTOTrainer", "ORPOTrainer", "CPOTrainer")
    name = "preference trainer"
    builds_own_batches = "preference pairs are tokenized and padded by the trainer itself, as chosen and rejected"
    #: The token-id columns those trainers tokenize into (TRL's names across its versions).
    token_columns = ("prompt_ids", "chosen_ids", "rejected_ids", "completion_ids", "prompt_input_ids",
                     "chosen_input_ids", "rejected_input_ids", "completion_input_ids", "input_ids_chosen",
                     "input_ids_rejected")

    def task(self, model: Any) -> tasks.Task:
        main = getattr(model_facts.base_model(model), "main_input_name", "input_ids")
        sequence = main if main in tasks.TOKEN_INPUTS else None
        return tasks.Task("preference pairs", tasks.PREFERENCE, sequence, more_token_columns=self.token_columns)

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
        for metrics in (logged.values() if isinstance(logged, dict) else ()):
            for name, values in (metrics.items() if isinstance(metrics, dict) else ()):
                if name.split("/")[0] in ("logps", "rewards") and isinstance(values, list) and values:
                    figures[name.replace("/", "_")] = float(values[-1])
    return figures


class Online(Family):
    """TRL's online RL trainers (GRPO, RLOO): a batch is a group of prompts; completions are sampled from the model
    during training and scored by the reward functions. Until the plugin samples them itself, the stages that need
    a batch skip with the reason, rather than take the prompts for a batch."""

    trainers = ("GRPOTrainer", "RLOOTrainer")
    name = "online RL trainer"
    builds_own_batches = "online RL samples its completions and scores them with its reward functions"
    #: What is checked of these trainers today: the script loads, and its prompts as fed.
    covered = ("load", "dataset")

    def task(self, model: Any) -> tasks.Task:
        main = getattr(model_facts.base_model(model), "main_input_name", "input_ids")
        sequence = main if main in tasks.TOKEN_INPUTS else None
        return tasks.Task("online RL (prompts, sampled completions, rewards)", tasks.REWARD, sequence,
                          more_token_columns=("prompt_ids", "completion_ids"))

    def draw(self, trainer: Trainer) -> dict[str, Any]:
        """Its dataloader yields prompts, not a batch: a test that asks for one (the train_batch fixture) skips."""
        import pytest

        pytest.skip(self.not_covered("collate") or "")

    def not_covered(self, stage: str) -> str | None:
        if stage in self.covered:
            return None
        return ("online RL (GRPO, RLOO) makes its batches by sampling completions from the model and "
                "scoring them with the reward functions; pytest-trainer does not sample them yet, so it has no batch "
                f"to check (checked: {', '.join(self.covered)})")


#: The families, most specific first; a trainer none of them names is a plain Trainer.
FAMILIES: tuple[type[Family], ...] = (Online, Preference, SFT, Seq2Seq)


def of(trainer: Any) -> Family:
    """The family of a trainer, read from its class hierarchy (a subclass of the user's own keeps its family)."""
    names = {cls.__name__ for cls in type(trainer).__mro__}
    return next((family() for family in FAMILIES if names & set(family.trainers)), Family())
