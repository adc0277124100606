"""TRL's other preference trainers (KTO; ORPO and CPO, in trl.experimental) load and pass as the preference family.

Their batches hold prompt, chosen and rejected (or completion and a desirability label) token ids that the trainer
builds itself: the stages take their loss and their checkpoint through the trainer, never the model's forward on
columns it does not take.
"""

from __future__ import annotations

import json

import pytest
from pipeline_runs import ITEMS, failures, outcomes, run_script, write
from task_scripts import LM

PAIRS = """
    import lm
    import tiny
    from datasets import Dataset
    from trl.experimental.{module} import {name}Config, {name}Trainer

    prompts = tiny.sentences(32, seed=3, shortest=2, longest=6)
    data = Dataset.from_dict({{"prompt": prompts,
                              "chosen": [" " + " ".join(p.split()[::-1]) for p in prompts],
                              "rejected": [" " + " ".join(sorted(p.split())) for p in prompts]}})
    args = {name}Config(output_dir="out", bf16=False, per_device_train_batch_size=4, max_length=32, report_to=[],
                       learning_rate={rate})
    trainer = {name}Trainer(lm.model(), args=args, train_dataset=data, processing_class=lm.tokenizer())
    trainer.train()
"""

KTO = """
    import copy

    import lm
    import tiny
    from datasets import Dataset
    from trl import KTOConfig, KTOTrainer

    prompts = tiny.sentences(32, seed=3, shortest=2, longest=6)
    data = Dataset.from_dict({"prompt": prompts,
                              "completion": [" " + " ".join(p.split()[::-1]) for p in prompts],
                              "label": [index % 2 == 0 for index in range(32)]})
    model = lm.model()
    args = KTOConfig(output_dir="out", bf16=False, per_device_train_batch_size=4, max_length=32, report_to=[])
    # A model built from a config has no checkpoint for KTOTrainer to load the reference from: pass a copy.
    trainer = KTOTrainer(model, ref_model=copy.deepcopy(model), args=args, train_dataset=data,
                         processing_class=lm.tokenizer())
    trainer.train()
"""

SCRIPTS = {
    "kto": KTO,
    "orpo": PAIRS.format(module="orpo", name="ORPO", rate="5e-5"),
    "cpo": PAIRS.format(module="cpo", name="CPO", rate="5e-5"),
}
#: The items a preference pipeline without an evaluation split skips, and why.
SKIPPED = {
    "eval": "the Trainer has no eval_dataset",
    "labels": "preference pairs have no label column",
    "lengths": "preference pairs are tokenized and padded by the trainer itself",
    "padding": "preference pairs are tokenized and padded by the trainer itself",
}


@pytest.mark.parametrize("trainer", list(SCRIPTS))
def test_a_preference_trainer_passes_every_item_that_applies(project: pytest.Pytester, trainer: str) -> None:
    project.makepyfile(lm=LM)
    write(project, "train.py", SCRIPTS[trainer])
    result = run_script(project, "--trainer-report=report.json", "-W", "ignore::UserWarning")
    assert failures(result) == [], result.stdout.str()[-4000:]
    # KTO's preferences are unpaired (one answer and a label): there is no chosen and rejected pair to compare.
    skipped = {**SKIPPED, "targets": "no chosen and rejected answers side by side"} if trainer == "kto" else SKIPPED
    expected = {f"{item}[cpu]": "SKIPPED" if item in skipped else "PASSED" for item in ITEMS}
    assert outcomes(result) == expected
    report = json.loads((project.path / "report.json").read_text())["items"]
    reasons = {item["stage"]: item["reason"] for item in report if item["outcome"] == "skipped"}
    assert {stage: skipped[stage] in reason for stage, reason in reasons.items()} == dict.fromkeys(skipped, True)
    if trainer != "kto":
        # The script's pairs are the prompt's words reversed against sorted: a few short prompts give the same
        # answer both ways. Pairs with no preference as stored are a note while they are few, not a failure.
        targets = next(item for item in report if item["stage"] == "targets")
        same = int(targets["figures"]["pairs_the_same"])
        assert targets["figures"]["pairs_audited"] == 32 and same < 8, targets
        assert (
            same == 0
            or f"{same} of 32 sampled preference pairs have the same chosen and rejected tokens as stored"
            in targets["notes"]
        ), targets["notes"]
    forward = next(item for item in report if item["stage"] == "forward")
    assert any(note.startswith("preference batch: ") for note in forward["notes"]), forward


def test_an_orpo_script_that_cannot_learn_fails_step(project: pytest.Pytester) -> None:
    project.makepyfile(lm=LM)
    write(project, "train.py", PAIRS.format(module="orpo", name="ORPO", rate="0.0"))
    result = run_script(project)
    assert failures(result) == ["step[cpu]"], result.stdout.str()[-4000:]
    result.stdout.fnmatch_lines(["*step[[]cpu[]] failed: the learning rate is 0*"])
