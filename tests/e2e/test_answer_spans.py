"""Extractive question answering: the answer spans against the answers (`dataset`). A span pointing into the question,
every answer marked "no answer", or spans that read otherwise than the answer text still in the data."""

from __future__ import annotations

import pytest
from conftest import failures, run_script, write

SCRIPT = """
    import tiny
    from datasets import Dataset
    from transformers import BertForQuestionAnswering, Trainer, TrainingArguments

    tok = tiny.tokenizer()
    questions = tiny.sentences(32, seed=5, shortest=3, longest=6)
    contexts = tiny.sentences(32, seed=6, shortest=5, longest=10)
    answers = [context.split()[2] for context in contexts]
    encoded = tok(questions, contexts, truncation=True, return_token_type_ids=True)
    starts = []
    for row, question in enumerate(questions):
        context_start = len(question.split()) + 2  # [CLS] question [SEP]
        starts.append({start})
    ends = list(starts)
    {edit}
    data = Dataset.from_dict({{**encoded, "start_positions": starts, "end_positions": ends,
                               "answers": [{{"text": [answer], "answer_start": [0]}} for answer in answers]}})
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
    trainer = Trainer(model=BertForQuestionAnswering(tiny.config(num_labels=2)), args=args, train_dataset=data,
                      processing_class=tok)
    trainer.train()
"""
#: The answer, the third word of the context.
RIGHT = "context_start + 2"


def run(project: pytest.Pytester, start: str = RIGHT, edit: str = "") -> pytest.RunResult:
    write(project, "train.py", SCRIPT.format(start=start, edit=edit or "pass"))
    return run_script(project, "--trainer-stages=dataset")


def test_spans_on_the_answer_in_the_context_pass(project: pytest.Pytester) -> None:
    assert failures(run(project)) == []


def test_spans_in_the_question_fail_dataset(project: pytest.Pytester) -> None:
    result = run(project, start="1")  # the question's first token: offsets taken in the question
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: the answer spans of 32 of the 32 answered rows of the training dataset lie in "
            "the question (token_type_ids 0), not in the context: row 0 points at 1..1 *",
            "*fix: find the answer among the context's tokens (sequence_ids(i) == 1 of the encoding)*",
        ]
    )


def test_every_answer_marked_no_answer_fails_dataset(project: pytest.Pytester) -> None:
    result = run(project, start="0")
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(["*every one of the 32 training answers is at position 0, the 'no answer' convention*"])


def test_a_few_answers_cut_by_truncation_pass(project: pytest.Pytester) -> None:
    assert failures(run(project, edit="starts[3] = ends[3] = 0")) == []


def test_spans_off_by_one_from_the_answer_text_fail_dataset(project: pytest.Pytester) -> None:
    result = run(project, start="context_start + 3")
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: the answer spans of * of the 32 answered rows of the training dataset read "
            "otherwise than their answer text in 'answers': row 0 points at *",
            "*fix: compute start_positions and end_positions from the answer's character offsets*",
        ]
    )
