"""Extractive question answering: the answer spans against the answers (`dataset`). A span pointing into the question,
every answer marked "no answer", or spans that read otherwise than the answer text still in the data."""

from __future__ import annotations

import pytest
from pipeline_runs import failures, run_script, write

SCRIPT = """
    import tiny
    from datasets import Dataset
    from transformers import BertForQuestionAnswering, Trainer, TrainingArguments

    tok = tiny.tokenizer()
    questions = tiny.sentences(32, seed=5, shortest=3, longest=5)
    contexts = tiny.sentences(32, seed=6, shortest=8, longest=12)
    answers = [context.split()[2] for context in contexts]
    encoded = tok(questions, contexts, truncation=True, return_token_type_ids={types})
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


#: The context first, then the question, as some scripts pair them (truncation="only_first").
CONTEXT_FIRST = SCRIPT.replace("tok(questions, contexts,", "tok(contexts, questions,").replace(
    "context_start = len(question.split()) + 2  # [CLS] question [SEP]", "context_start = 1  # [CLS] context"
)


def run(project: pytest.Pytester, start: str = RIGHT, edit: str = "", types: bool = True) -> pytest.RunResult:
    write(project, "train.py", SCRIPT.format(start=start, edit=edit or "pass", types=types))
    return run_script(project, "--trainer-stages=dataset")


def test_spans_on_the_answer_in_the_context_pass(project: pytest.Pytester) -> None:
    assert failures(run(project)) == []


@pytest.mark.parametrize("types", [True, False], ids=["token-type-ids", "separators"])
def test_spans_in_the_question_fail_dataset(project: pytest.Pytester, types: bool) -> None:
    result = run(project, start="1", types=types)  # the question's first token: offsets taken in the question
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: the answer spans of 32 of the 32 answered rows read (of the training dataset) lie in "
            "the question (the first sequence of each pair, the shorter), not in the context: row 0 points at 1..1 *",
            "*fix: find the answer among the context's tokens*",
        ]
    )


def test_spans_in_a_context_given_first_pass(project: pytest.Pytester) -> None:
    write(project, "train.py", CONTEXT_FIRST.format(start=RIGHT, edit="pass", types=True))
    assert failures(run_script(project, "--trainer-stages=dataset")) == []
    write(project, "train.py", CONTEXT_FIRST.format(start="len(contexts[row].split()) + 2", edit="pass", types=True))
    result = run_script(project, "--trainer-stages=dataset")  # now the question's first token
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(["*lie in the question (the second sequence of each pair, the shorter)*"])


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
            "dataset[[]cpu[]] failed: the answer spans of * of the 32 answered rows read (of the training dataset) read "
            "otherwise than their answer text in 'answers' (the first one's is *): row 0 points at *",
            "*fix: compute start_positions and end_positions from the answer's character offsets*",
        ]
    )


#: As the question-answering guide writes it: the positions made by map() from the question, context and answers, which
#: it drops (remove_columns), the name rebound.
MAPPED = """
    import tiny
    from datasets import Dataset
    from transformers import BertForQuestionAnswering, Trainer, TrainingArguments

    tok = tiny.tokenizer()
    questions = tiny.sentences(32, seed=5, shortest={shortest}, longest={longest})
    contexts = tiny.sentences(32, seed=6, shortest=8, longest=12)
    data = Dataset.from_dict({{"question": questions, "context": contexts,
                              "answers": [{{"text": [context.split()[2]], "answer_start": [0]}} for context in contexts]}})

    def preprocess(batch):
        encoded = tok(batch["question"], batch["context"], truncation=True)
        starts = []
        for question in batch["question"]:
            context_start = len(question.split()) + 2  # [CLS] question [SEP]
            starts.append({start})
        encoded["start_positions"], encoded["end_positions"] = starts, list(starts)
        return encoded

    data = data.map(preprocess, batched=True, remove_columns=data.column_names)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
    trainer = Trainer(model=BertForQuestionAnswering(tiny.config(num_labels=2)), args=args, train_dataset=data,
                      processing_class=tok)
    trainer.train()
"""


def test_spans_a_token_off_fail_dataset_where_map_dropped_the_answers(project: pytest.Pytester) -> None:
    write(project, "train.py", MAPPED.format(start="context_start + 1", shortest=3, longest=5))  # a token before
    result = run_script(project, "--trainer-stages=dataset")
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: the answer spans of 32 of the 32 answered rows read (of the training dataset) read "
            "otherwise than their answer text in 'answers' (the first one's is *): row 0 points at *",
        ]
    )


#: Questions of 3-5 words, or of 16-20, longer than their contexts of 8-12: the question is the sequence that reads as
#: the stored question, not the shorter one.
QUESTIONS = {"short-questions": (3, 5), "questions-longer-than-contexts": (16, 20)}


@pytest.mark.parametrize(("shortest", "longest"), QUESTIONS.values(), ids=QUESTIONS.keys())
def test_spans_on_the_answer_pass_where_map_dropped_the_answers(
    project: pytest.Pytester, shortest: int, longest: int
) -> None:
    write(project, "train.py", MAPPED.format(start=RIGHT, shortest=shortest, longest=longest))
    assert failures(run_script(project, "--trainer-stages=dataset")) == []


@pytest.mark.parametrize(("shortest", "longest"), QUESTIONS.values(), ids=QUESTIONS.keys())
def test_spans_in_the_question_that_reads_as_the_stored_one_fail_dataset(
    project: pytest.Pytester, shortest: int, longest: int
) -> None:
    write(project, "train.py", MAPPED.format(start="1", shortest=shortest, longest=longest))
    result = run_script(project, "--trainer-stages=dataset")
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: the answer spans of 32 of the 32 answered rows read (of the training dataset) lie "
            "in the question (the first sequence of each pair, the one that reads as the stored question), not in the "
            "context*",
        ]
    )
