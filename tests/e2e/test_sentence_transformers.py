"""sentence-transformers as a trainer family: its trainers feed every column, its collator (or its loss, for a
cross-encoder) tokenizes each text column, and its loss decides what a label is. Correct bi-encoder and cross-encoder
pipelines pass every item that applies; a dataset whose columns or labels do not fit the loss, and texts repeated
within a batch under an in-batch-negatives loss, fail `dataset` with the cause.

Each broken form was first run without the plugin (sentence-transformers 6.2, transformers 5.24, torch 2.13, CPU):
training runs on every one of them without an error.
"""

from __future__ import annotations

import json

import pytest
from pipeline_runs import failures, outcomes, run_script, write

# sentence-transformers 6 (on transformers 5) arranges its modules by model kind; on transformers 4.57 pip installs 5.x.
pytest.importorskip("sentence_transformers.sentence_transformer", reason="these scripts use sentence-transformers 6")
from sentence_transformers.cross_encoder import CrossEncoderTrainer  # noqa: F401
from sentence_transformers.sentence_transformer import SentenceTransformerTrainer  # noqa: F401

# The trainers are imported here, before pytester's in-process runs, for the reason conftest gives.

ST = '''
"""Tiny sentence-transformers models: the tiny BERT of `tiny`, saved to a folder, as a bi-encoder or a cross-encoder."""
import os

import tiny
from sentence_transformers.cross_encoder import CrossEncoder
from sentence_transformers.sentence_transformer import SentenceTransformer
from sentence_transformers.sentence_transformer import modules
from transformers import BertForSequenceClassification, BertModel

TOPICS = tiny.WORDS[2:]


def saved(kind, folder):
    if not os.path.isdir(folder):
        model = kind(tiny.config(num_labels=1))
        model.save_pretrained(folder)
        tiny.tokenizer().save_pretrained(folder)
    return folder


def bi_encoder(max_seq_length=32):
    transformer = modules.Transformer(saved(BertModel, "tiny-bert"), max_seq_length=max_seq_length)
    pooling = modules.Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
    return SentenceTransformer(modules=[transformer, pooling], device="cpu")


def cross_encoder():
    return CrossEncoder(saved(BertForSequenceClassification, "tiny-bert-ce"), num_labels=1, max_length=32,
                        device="cpu")


def triplets(count=32):
    rows = {"anchor": [], "positive": [], "negative": []}
    for index in range(count):
        topic, other = TOPICS[index % len(TOPICS)], TOPICS[(index + 5) % len(TOPICS)]
        rows["anchor"].append(f"the {topic} {tiny.WORDS[index % 4]} sat")
        rows["positive"].append(f"a {topic} ran on the mat {index}")
        rows["negative"].append(f"a {other} flew under the log {index}")
    return rows


def pairs(count=32):
    rows = {"query": [], "answer": [], "label": []}
    for index in range(count // 2):
        topic, other = TOPICS[index % len(TOPICS)], TOPICS[(index + 5) % len(TOPICS)]
        rows["query"] += [f"the {topic} sat {index}"] * 2
        rows["answer"] += [f"a {topic} ran on the mat", f"a {other} flew under the log"]
        rows["label"] += [1.0, 0.0]
    return rows
'''

BI_ENCODER = """
    import st
    from datasets import Dataset
    from sentence_transformers.sentence_transformer import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.evaluation import TripletEvaluator
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    model = st.bi_encoder()
    train, test = Dataset.from_dict(st.triplets(32)), Dataset.from_dict(st.triplets(8))
    evaluator = TripletEvaluator(anchors=test["anchor"], positives=test["positive"], negatives=test["negative"], name="dev")
    args = SentenceTransformerTrainingArguments(output_dir="out", per_device_train_batch_size=8, learning_rate=1e-3,
                                                report_to="none", batch_sampler="no_duplicates", max_steps=2)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train, eval_dataset=test,
                                         loss=MultipleNegativesRankingLoss(model), evaluator=evaluator)
    trainer.train()
"""

CROSS_ENCODER = """
    import st
    from datasets import Dataset
    from sentence_transformers.cross_encoder import CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    model = st.cross_encoder()
    train, test = Dataset.from_dict(st.pairs(32)), Dataset.from_dict(st.pairs(8))
    args = CrossEncoderTrainingArguments(output_dir="out", per_device_train_batch_size=8, learning_rate=1e-3,
                                         report_to="none", max_steps=2)
    trainer = CrossEncoderTrainer(model=model, args=args, train_dataset=train, eval_dataset=test,
                                  loss=BinaryCrossEntropyLoss(model))
    trainer.train()
"""

#: Every CPU item that checks a sentence-transformers pipeline; targets, labels and lengths skip with the reason (no
#: causal-LM supervision; the loss decides what a label is; the library tokenizes and cuts the texts itself).
CHECKED = (
    "dataset",
    "collate",
    "forward",
    "backward",
    "step",
    "overfit",
    "save",
    "eval",
    "precision",
    "memory",
    "padding",
)


def run(project: pytest.Pytester, source: str, *args: str) -> tuple[pytest.RunResult, dict[str, dict]]:
    project.makepyfile(st=ST)
    write(project, "train.py", source)
    result = run_script(project, "--trainer-report=report.json", *args)
    report = json.loads((project.path / "report.json").read_text())["items"]
    return result, {item["stage"]: item for item in report if item["device"] == "cpu"}


def test_a_bi_encoder_with_in_batch_negatives_and_an_evaluator_passes(project: pytest.Pytester) -> None:
    result, report = run(project, BI_ENCODER)
    assert failures(result) == [], result.stdout.str()[-4000:]
    assert {item: outcome for item, outcome in outcomes(result).items() if outcome == "PASSED"} == {
        f"{stage}[cpu]": "PASSED" for stage in CHECKED
    }
    assert report["save"]["notes"][0].endswith("SentenceTransformer(folder) reloads it to the same loss and weights")
    assert "modules.json" in report["save"]["notes"][0]
    assert "evaluator_dev_cosine_accuracy" in report["eval"]["figures"], report["eval"]


def test_an_evaluator_that_crashes_fails_eval(project: pytest.Pytester) -> None:
    """The trainer runs its evaluator at each evaluation: one of the user's own that crashes would stop the run there."""
    broken = BI_ENCODER.replace(
        "evaluator = TripletEvaluator(",
        "from sentence_transformers.sentence_transformer.evaluation import SentenceEvaluator\n\n\n"
        "    class Spread(SentenceEvaluator):\n"
        "        def __call__(self, model, output_path=None, epoch=-1, steps=-1):\n"
        "            embeddings = model.encode(test['anchor'], convert_to_tensor=True)\n"
        "            return {'spread': float(embeddings.std(dim=0)[embeddings.shape[1]])}\n\n\n"
        "    evaluator = Spread() or TripletEvaluator(",
    )
    assert broken.count("class Spread") == 1
    result, _ = run(project, broken, "--trainer-stages=load,eval")
    assert failures(result) == ["eval[cpu]"], result.stdout.str()[-4000:]
    result.stdout.fnmatch_lines(["*eval[[]cpu[]] failed: the trainer's evaluator (Spread) raised IndexError*"])


def test_a_cross_encoder_reranker_passes(project: pytest.Pytester) -> None:
    result, report = run(project, CROSS_ENCODER)
    assert failures(result) == [], result.stdout.str()[-4000:]
    assert {item: outcome for item, outcome in outcomes(result).items() if outcome == "PASSED"} == {
        f"{stage}[cpu]": "PASSED" for stage in CHECKED
    }
    assert report["save"]["notes"][0].endswith("CrossEncoder(folder) reloads it to the same loss and weights")


def test_graded_relevance_under_binary_cross_entropy_fails_dataset(project: pytest.Pytester) -> None:
    """Relevance graded 0 to 3 given to BinaryCrossEntropyLoss, whose targets are probabilities."""
    graded = CROSS_ENCODER.replace(
        "train, test = Dataset.from_dict(st.pairs(32)), Dataset.from_dict(st.pairs(8))",
        "rows = st.pairs(32)\n    rows['label'] = [float(i % 4) for i in range(32)]\n"
        "    train, test = Dataset.from_dict(rows), Dataset.from_dict(st.pairs(8))",
    )
    assert graded != CROSS_ENCODER
    result, _ = run(project, graded, "--trainer-stages=load,dataset,forward")
    assert failures(result) == ["dataset[cpu]"], result.stdout.str()[-4000:]
    assert outcomes(result)["forward[cpu]"] == "PASSED"  # training runs: the finding blocks nothing
    result.stdout.fnmatch_lines(
        [
            "*dataset[[]cpu[]] failed: BinaryCrossEntropyLoss takes labels from 0 to 1 (binary cross-entropy takes targets "
            "between 0 and 1), but the training dataset's 'label' runs from 0 to 3 (16 rows outside; the first is row 2, "
            "'label' 2)*",
            "*fix: scale 'label' into range*",
        ]
    )


def test_a_pair_loss_given_triplets_fails_dataset(project: pytest.Pytester) -> None:
    """CoSENTLoss scores the first two columns against the label: a third text column is encoded for nothing."""
    cosent = BI_ENCODER.replace("MultipleNegativesRankingLoss", "CoSENTLoss")
    result, _ = run(project, cosent, "--trainer-stages=load,dataset")
    assert failures(result) == ["dataset[cpu]"], result.stdout.str()[-4000:]
    result.stdout.fnmatch_lines(
        [
            "*dataset[[]cpu[]] failed: CoSENTLoss takes exactly 2 text columns, but the training dataset feeds 3 text "
            "columns (anchor, positive, negative)*",
        ]
    )


#: Each anchor text written four times, with a positive of its own: a natural shape of mined pairs.
REPEATED_ANCHORS = BI_ENCODER.replace(
    "train, test = Dataset.from_dict(st.triplets(32)), Dataset.from_dict(st.triplets(8))",
    "rows = st.triplets(32)\n    rows['anchor'] = [rows['anchor'][i // 4] for i in range(32)]\n"
    "    train, test = Dataset.from_dict(rows), Dataset.from_dict(st.triplets(8))",
)


def test_texts_repeated_within_batches_under_in_batch_negatives_fail_dataset(project: pytest.Pytester) -> None:
    repeated = REPEATED_ANCHORS.replace(' batch_sampler="no_duplicates",', "")
    assert "rows['anchor'] = " in repeated and "no_duplicates" not in repeated
    result, _ = run(project, repeated, "--trainer-stages=load,dataset")
    assert failures(result) == ["dataset[cpu]"], result.stdout.str()[-4000:]
    result.stdout.fnmatch_lines(
        [
            "*dataset[[]cpu[]] failed: * of 32 training rows share a text with another row of their batch "
            "(MultipleNegativesRankingLoss takes each other row of a batch as a negative)*",
            "*fix: batch with batch_sampler=BatchSamplers.NO_DUPLICATES*",
        ]
    )


def test_repeated_texts_with_the_no_duplicates_sampler_pass(project: pytest.Pytester) -> None:
    assert 'batch_sampler="no_duplicates"' in REPEATED_ANCHORS
    result, _ = run(project, REPEATED_ANCHORS, "--trainer-stages=load,dataset")
    assert failures(result) == [], result.stdout.str()[-4000:]


def test_a_learning_rate_of_zero_fails_step(project: pytest.Pytester) -> None:
    frozen = CROSS_ENCODER.replace("learning_rate=1e-3", "learning_rate=0.0")
    result, _ = run(project, frozen, "--trainer-stages=load,step")
    assert failures(result) == ["step[cpu]"], result.stdout.str()[-4000:]
    result.stdout.fnmatch_lines(
        ["*step[[]cpu[]] failed: the learning rate is 0, so no optimizer step can change the weights"]
    )


def test_a_pooling_that_averages_the_padding_fails_padding(project: pytest.Pytester) -> None:
    """A pooling module of the user's own that averages every position, padding included: a text's embedding then
    depends on the longest text of its batch, at inference as in training."""
    mean_of_every_token = BI_ENCODER.replace(
        "model = st.bi_encoder()",
        "import torch\n\n\n    class MeanOfEveryToken(torch.nn.Module):\n"
        "        def forward(self, features):\n"
        "            features['sentence_embedding'] = features['token_embeddings'].mean(dim=1)\n"
        "            return features\n\n\n"
        "    from sentence_transformers.sentence_transformer import SentenceTransformer\n"
        "    model = SentenceTransformer(modules=[st.bi_encoder()[0], MeanOfEveryToken()], device='cpu')",
    )
    assert mean_of_every_token.count("MeanOfEveryToken") == 2
    result, _ = run(project, mean_of_every_token, "--trainer-stages=load,padding")
    assert failures(result) == ["padding[cpu]"], result.stdout.str()[-4000:]
    result.stdout.fnmatch_lines(
        [
            "*padding[[]cpu[]] failed: the embedding of * changes by * (relative) when it is encoded beside a longer text "
            "and so padded: the model reads the padding*",
            "*fix: pool over the real tokens only, with features[[]'attention_mask'[]]*",
        ]
    )
