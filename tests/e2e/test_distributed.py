"""`--trainer-processes=2`: real two-process jobs under torch.distributed.run on the CPU (gloo).

Each broken script fails `distributed[cpu]` with its cause named first; the shapes that behave correctly with several
processes (an uneven map-style eval set, training rows padded to even batches, a checkpoint saved on rank 0 only, a
LoRA fine-tune, a stream with max_steps, a split seeded before the Trainer, FSDP asked for) pass.

The judges of a finished job are unit-tested on recorded jobs of these scripts (tests/unit/record.py,
tests/unit/test_rank_judges.py). The jobs here hold what only real processes show: the launch, how each rank seeds and
records what it trained on, a rank killed under torchrun, the timeout of a rank that hangs, a plugin bug inside a
rank, DDP's and FSDP's own errors, and a judge's verdict reaching the item. Weights that drift apart and a file every
rank writes are judged on their recordings only (their findings reach the item as the same rows' do, here).
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest
from pipeline_runs import outcomes, write

#: Every test here runs a job of several processes (45 to 85 s each on 2 cores).
pytestmark = pytest.mark.slow

#: A correct classifier: 10 training rows on 2 ranks of 4 (padded to 12), 7 eval rows, a metric, a callback that
#: writes on the main process only.
GOOD = """
    import json
    import tiny
    from transformers import Trainer, TrainerCallback, TrainingArguments

    tok = tiny.tokenizer()
    train = tiny.tokenized(tiny.text_dataset(10), tok)
    evaluation = tiny.tokenized(tiny.text_dataset(7, seed=1), tok)

    def accuracy(prediction):
        return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}

    class Notes(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                with open(f"{args.output_dir}/notes.json", "w") as notes:
                    json.dump({"step": state.global_step}, notes)

    args = TrainingArguments(output_dir="checkpoints", per_device_train_batch_size=4, per_device_eval_batch_size=2,
                             report_to="none")
    trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=train, eval_dataset=evaluation,
                      processing_class=tok, compute_metrics=accuracy, callbacks=[Notes()])
    trainer.train()
"""

#: A rank that waits, in a callback, for a step the main process never takes.
HANGS = """
    import os
    import time
    import tiny
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class WaitForMain(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if not state.is_world_process_zero and state.global_step == 1:
                while not os.path.exists(f"{args.output_dir}/ready"):  # rank 0 never writes it
                    time.sleep(0.1)

    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(24), tok)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, report_to="none")
    trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=data, processing_class=tok,
                      callbacks=[WaitForMain()])
    trainer.train()
"""

#: A parameter updated in forward from each rank's own batch: the ranks' copies drift apart.
DRIFTS = """
    import torch
    import tiny
    from transformers import BertForSequenceClassification, Trainer, TrainingArguments

    class Centred(BertForSequenceClassification):
        def __init__(self, config):
            super().__init__(config)
            self.centre = torch.nn.Parameter(torch.zeros(config.hidden_size), requires_grad=False)

        def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None):
            outputs = super().forward(input_ids=input_ids, attention_mask=attention_mask,
                                      token_type_ids=token_type_ids, labels=labels, output_hidden_states=True)
            with torch.no_grad():  # a running mean of this rank's batches, kept as a parameter
                self.centre.mul_(0.9).add_(0.1 * outputs.hidden_states[-1][:, 0].mean(0))
            return outputs

    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(24), tok)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, report_to="none")
    trainer = Trainer(model=Centred(tiny.config()), args=args, train_dataset=data, processing_class=tok)
    trainer.train()
"""

#: A callback that saves the config on every rank, not on the main process only.
WRITES_TWICE = """
    import tiny
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Export(TrainerCallback):
        def on_save(self, args, state, control, model=None, **kwargs):
            model.config.save_pretrained(f"{args.output_dir}/export")  # on every rank

    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(24), tok)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, report_to="none")
    trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=data, processing_class=tok,
                      callbacks=[Export()])
    trainer.train()
"""

#: A get_train_dataloader of its own that does not shard: every rank trains on the same rows.
OWN_LOADER = """
    import tiny
    from torch.utils.data import DataLoader
    from transformers import Trainer, TrainingArguments

    class OwnLoader(Trainer):
        def get_train_dataloader(self):  # no DistributedSampler, not prepared by accelerate
            return DataLoader(self.train_dataset.remove_columns([]), batch_size=self.args.train_batch_size,
                              collate_fn=self.data_collator)

    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(24), tok)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, report_to="none")
    trainer = OwnLoader(model=tiny.classifier(), args=args, train_dataset=data, processing_class=tok)
    trainer.train()
"""


def run_distributed(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(
        "--trainer-module=train.py",
        "--trainer-devices=cpu",
        "--trainer-processes=2",
        "--trainer-stages=distributed",
        "-v",
        "-rs",
        "--trainer-report=report.json",
        *args,
    )


def item(pytester: pytest.Pytester, stage: str = "distributed") -> dict:
    report = json.loads((pytester.path / "report.json").read_text())
    return next(found for found in report["items"] if found["stage"] == stage)


def failure(result: pytest.RunResult) -> str:
    """The first line of the distributed item's failure."""
    text = result.stdout.str()
    start = text.index("distributed[cpu] failed: ")
    return text[start:].splitlines()[0]


def test_a_correct_script_passes_with_two_processes(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD)
    result = run_distributed(project)
    assert outcomes(result) == {"distributed[cpu]": "PASSED"}, result.stdout.str()
    notes = item(project)["notes"]
    assert "engine: 2 processes under torch.distributed.run, DDP on gloo, 3 steps" in notes
    assert "distributed evaluation: compute_metrics received 7 predictions for 7 rows" in notes
    assert any(note.startswith("checkpoint reloads to the trained loss") for note in notes)
    assert "distributed evaluation gives the one-process metrics (eval_accuracy)" in notes
    assert not list(project.path.glob("checkpoints*")), "the script's own folder is never written"


def test_one_process_adds_no_distributed_item(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD)
    result = project.runpytest(
        "--trainer-module=train.py", "--trainer-devices=cpu", "--trainer-processes=1", "--trainer-stages=dataset", "-v"
    )
    assert "distributed[" not in result.stdout.str()
    result.assert_outcomes(passed=2)


def test_unused_parameters_with_gradient_checkpointing_are_named(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        """
        import torch
        import tiny
        from transformers import BertForSequenceClassification, Trainer, TrainingArguments

        class Classifier(BertForSequenceClassification):
            def __init__(self, config):
                super().__init__(config)
                self.auxiliary = torch.nn.Linear(4, 4)  # built, never used in forward

        tok = tiny.tokenizer()
        data = tiny.tokenized(tiny.text_dataset(24), tok)
        args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, report_to="none",
                                 gradient_checkpointing=True)
        trainer = Trainer(model=Classifier(tiny.config()), args=args, train_dataset=data, processing_class=tok)
        trainer.train()
    """,
    )
    result = run_distributed(project)
    assert outcomes(result) == {"distributed[cpu]": "FAILED"}
    first = failure(result)
    assert "auxiliary.weight, auxiliary.bias" in first, first
    assert "gradient checkpointing" in first
    assert "ddp_find_unused_parameters=True" in result.stdout.str()


def test_an_iterable_eval_set_split_without_dispatch_counts_rows_twice(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        """
        import tiny
        from transformers import Trainer, TrainingArguments

        tok = tiny.tokenizer()
        train = tiny.tokenized(tiny.text_dataset(16), tok)
        evaluation = tiny.tokenized(tiny.text_dataset(7, seed=1), tok).to_iterable_dataset()

        def accuracy(prediction):
            return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}

        args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, per_device_eval_batch_size=2,
                                 report_to="none", accelerator_config={"dispatch_batches": False})
        trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=train, eval_dataset=evaluation,
                          processing_class=tok, compute_metrics=accuracy)
        trainer.train()
    """,
    )
    result = run_distributed(project)
    assert outcomes(result) == {"distributed[cpu]": "FAILED"}
    assert "compute_metrics received 8 predictions for the 7 rows of the eval split" in failure(result)
    assert "dispatch_batches" in result.stdout.str()


def test_a_stream_with_max_steps_and_a_lora_fine_tune_pass(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        """
        import tiny
        from peft import LoraConfig, get_peft_model
        from transformers import (DataCollatorForLanguageModeling, LlamaConfig, LlamaForCausalLM, Trainer,
                                  TrainingArguments)

        tok = tiny.tokenizer()
        stream = tiny.tokenized(tiny.text_dataset(40), tok).remove_columns(["label"]).to_iterable_dataset()
        config = LlamaConfig(vocab_size=len(tiny.VOCAB), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
        model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, max_steps=20, report_to="none",
                                 learning_rate=1e-3)
        trainer = Trainer(model=model, args=args, train_dataset=stream, processing_class=tok,
                          data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
        trainer.train()
    """,
    )
    result = run_distributed(project)
    assert outcomes(result) == {"distributed[cpu]": "PASSED"}, result.stdout.str()
    assert any(note.startswith("checkpoint reloads to the trained loss") for note in item(project)["notes"])


def test_data_built_differently_in_each_process_fails_first(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        """
        import tiny
        from transformers import Trainer, TrainingArguments

        tok = tiny.tokenizer()
        raw = tiny.text_dataset(40)
        # A set's order: each interpreter its own (with 11 names, two the same by chance about once in 10**7 runs).
        names = list({str(label) for label in raw["label"]} | {f"spare {index}" for index in range(8)})
        label2id = {name: index for index, name in enumerate(names)}
        data = tiny.tokenized(raw.map(lambda row: {"label": label2id[str(row["label"])]}), tok)
        splits = data.train_test_split(test_size=0.25)  # no seed: each process draws its own split
        model = tiny.classifier(num_labels=len(names), label2id=label2id, id2label={i: n for n, i in label2id.items()})
        args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, report_to="none")
        trainer = Trainer(model=model, args=args, train_dataset=splits["train"], eval_dataset=splits["test"],
                          processing_class=tok)
        trainer.train()
    """,
    )
    result = run_distributed(project)
    assert outcomes(result) == {"distributed[cpu]": "FAILED"}
    assert "the 2 processes built different data from the same script (the train split" in failure(result)
    assert "train_test_split(seed=42)" in result.stdout.str()


UNSEEDED_SPLIT = """
    import tiny
    from transformers import Trainer, TrainingArguments

    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(40), tok)
    splits = data.train_test_split(test_size=0.25{seed})  # before the Trainer seeds anything
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, report_to="none")
    trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=splits["train"], eval_dataset=splits["test"],
                      processing_class=tok)
    trainer.train()
"""


@pytest.mark.parametrize(("seed", "outcome"), [("", "FAILED"), (", seed=42", "PASSED")], ids=["unseeded", "seeded"])
def test_each_process_starts_from_its_own_random_state(project: pytest.Pytester, seed: str, outcome: str) -> None:
    """As in a torchrun job, where each process seeds Python's and numpy's generators from the OS: an unseeded split
    made before the Trainer (which seeds them all alike) differs from one process to the next; given its own seed, it
    is the same in every process."""
    write(project, "train.py", UNSEEDED_SPLIT.format(seed=seed))
    result = run_distributed(project)
    assert outcomes(result) == {"distributed[cpu]": outcome}, result.stdout.str()[-3000:]
    if outcome == "FAILED":
        assert "the 2 processes built different data from the same script (the train split" in failure(result)


#: A word-level tokenizer whose vocabulary is made at start-up from a set of words: its ids follow the set's order,
#: which each interpreter's hash seed changes (sorted, every process gets the same ids).
VOCABULARY_AT_START = """
    import tiny
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Trainer, TrainingArguments

    texts = tiny.sentences(40)
    words = {order}(set(" ".join(texts).split()))
    vocab = {{word: index for index, word in enumerate(["[PAD]", "[UNK]", *words])}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]")
    data = tiny.tokenized(tiny.text_dataset(40), tok)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, report_to="none")
    trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=data, processing_class=tok)
    trainer.train()
"""


@pytest.mark.parametrize(("order", "outcome"), [("list", "FAILED"), ("sorted", "PASSED")], ids=["set", "sorted"])
def test_a_vocabulary_made_at_start_up_is_named(project: pytest.Pytester, order: str, outcome: str) -> None:
    write(project, "train.py", VOCABULARY_AT_START.format(order=order))
    result = run_distributed(project)
    assert outcomes(result) == {"distributed[cpu]": outcome}, result.stdout.str()[-3000:]
    if outcome == "FAILED":
        assert "the 2 processes built different tokenizers from the same script (the tokenizer: rank 0 has a " in (
            failure(result)
        )


def test_a_rank_that_hangs_is_named_and_never_hangs_the_session(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        HANGS,
    )
    result = run_distributed(project, "--trainer-timeout=40")
    assert outcomes(result) == {"distributed[cpu]": "FAILED"}
    first = failure(result)
    assert "hung while training step" in first, first
    text = result.stdout.str()
    assert re.search(r"rank 1 waits at:\n\s+\S*train.py:\d+ in on_step_end", text), text


def test_a_dataloader_of_its_own_that_does_not_shard_trains_every_rank_on_the_same_rows(
    project: pytest.Pytester,
) -> None:
    write(
        project,
        "train.py",
        OWN_LOADER,
    )
    result = run_distributed(project)
    assert outcomes(result) == {"distributed[cpu]": "FAILED"}
    assert "every one of the 2 ranks trained on the same rows at each of the 3 micro-batches" in failure(result)


def test_a_rank_that_dies_is_reported(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        """
        import os
        import signal
        import tiny
        from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

        tok = tiny.tokenizer()
        pad = DataCollatorWithPadding(tok)

        def collate(rows):
            if os.environ.get("RANK") == "1":
                os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer does
            return pad(rows)

        data = tiny.tokenized(tiny.text_dataset(24), tok)
        args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, report_to="none")
        trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=data, data_collator=collate)
        trainer.train()
    """,
    )
    result = run_distributed(project)
    assert outcomes(result) == {"distributed[cpu]": "FAILED"}
    assert "rank 1 of 2 died while" in failure(result)


#: A sitecustomize that plants a bug in the plugin's own code inside every rank.
PLANTED_BUG = """
    import os

    if "LOCAL_RANK" in os.environ:  # the ranks, not pytest nor torchrun
        import pytest_trainer.families

        def family_of(trainer):
            raise AttributeError("planted bug")

        pytest_trainer.families.family_of = family_of
"""


def test_a_plugin_bug_inside_a_rank_is_an_internal_error(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(project, "train.py", GOOD)
    (project.path / "ranks").mkdir()
    (project.path / "ranks" / "sitecustomize.py").write_text(textwrap.dedent(PLANTED_BUG))
    monkeypatch.setenv("PYTHONPATH", str(project.path / "ranks"))
    result = run_distributed(project)
    assert outcomes(result) == {"distributed[cpu]": "FAILED"}
    text = result.stdout.str()
    assert "internal error of pytest-trainer in the distributed check (AttributeError: planted bug)" in text
    assert "bug of pytest-trainer, not of your pipeline" in text


FSDP = """
    import tiny
    from transformers import (DataCollatorForLanguageModeling, LlamaConfig, LlamaForCausalLM, Trainer,
                              TrainingArguments)

    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(24), tok).remove_columns(["label"])
    config = LlamaConfig(vocab_size=len(tiny.VOCAB), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
                         tie_word_embeddings=True)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, report_to="none", fsdp=FSDP,
                             fsdp_config={"transformer_layer_cls_to_wrap": [LAYER]})
    trainer = Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=data, processing_class=tok,
                      data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
    trainer.train()
"""


def _fsdp(layer: str) -> str:
    import transformers

    asked = '"full_shard"' if transformers.__version__.startswith("4.") else "True"
    return FSDP.replace("FSDP", asked).replace("LAYER", repr(layer))


def test_fsdp_asked_for_says_what_ran_and_round_trips_the_state_dict(project: pytest.Pytester) -> None:
    write(project, "train.py", _fsdp("LlamaDecoderLayer"))
    result = run_distributed(project)
    assert outcomes(result) == {"distributed[cpu]": "PASSED"}, result.stdout.str()
    notes = item(project)["notes"]
    assert any(
        note.startswith("not exercised: the script asks for FSDP; accelerate sets FSDP up on GPUs only")
        for note in notes
    ), notes
    assert (
        "FSDP: the state dict round-trips through fully_shard on gloo (2 units of LlamaDecoderLayer, sharded "
        "save, full reload)" in notes
    ), notes


def test_fsdp_layer_class_the_model_does_not_have_is_named(project: pytest.Pytester) -> None:
    write(project, "train.py", _fsdp("BertLayer"))
    result = run_distributed(project)
    assert outcomes(result) == {"distributed[cpu]": "FAILED"}
    first = failure(result)
    assert "transformer_layer_cls_to_wrap names BertLayer, which LlamaForCausalLM does not have" in first, first
    assert "transformer_layer_cls_to_wrap=['LlamaDecoderLayer']" in result.stdout.str()
