"""Token classification: word labels on the tokens of their words, read back through the tokenizer's word_ids()
(`dataset`). A WordPiece tokenizer trained here splits most words into several tokens."""

from __future__ import annotations

import pytest
from pipeline_runs import failures, run_script, write

SCRIPT = """
    import random
    from datasets import Dataset
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import (BertConfig, BertForTokenClassification, DataCollatorForTokenClassification,
                              PreTrainedTokenizerFast, Trainer, TrainingArguments)

    STEMS = ["walk", "talk", "jump", "play", "read", "sing", "paint", "build", "cook", "swim"]
    ENDS = ["", "ing", "er", "ed", "s"]
    rng = random.Random(0)
    sentences = [[{word} for _ in range(rng.randint(4, 9))] for index in range(64)]
    tags = [[len(word) % 3 for word in sentence] for sentence in sentences]

    core = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    core.normalizer = normalizers.BertNormalizer(lowercase=True)
    core.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    words = [stem + end for stem in STEMS for end in ENDS]
    core.train_from_iterator([" ".join(words) + " -"] * 4, trainers.WordPieceTrainer(
        vocab_size=70, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    core.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", core.token_to_id("[CLS]")), ("[SEP]", core.token_to_id("[SEP]"))])
    from tokenizers import decoders
    core.decoder = decoders.WordPiece()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                  sep_token="[SEP]", mask_token="[MASK]")

    def align(batch):
        encoded = tok(batch["words"], is_split_into_words=True, truncation=True)
        labels = []
        for row, word_tags in enumerate(batch["tags"]):
            word_ids, previous, row_labels = encoded.word_ids(row), None, []
            for word in word_ids:
                if word is None:
                    row_labels.append(-100)
                elif {condition}:
                    row_labels.append(word_tags[word])
                else:
                    row_labels.append(-100)
                previous = word
            labels.append(row_labels)
        encoded["labels"] = labels
        {by_position}
        return encoded

    data = Dataset.from_dict({{"words": sentences, "tags": tags}}).map(align, batched=True,
                                                                     remove_columns=["words", "tags"])
    config = BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, num_labels=3, pad_token_id=tok.pad_token_id)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
    trainer = Trainer(model=BertForTokenClassification(config), args=args, train_dataset=data, processing_class=tok,
                      data_collator=DataCollatorForTokenClassification(tok))
    trainer.train()
"""


#: Every row's words split into sub-words, or only every fourth row's (the others' words are single letters, one token
#: each): only rows with a split word can show tags written in turn, since elsewhere token i is word i.
#: Or words joined by hyphens, which the tokenizer's pre-tokenizer splits, so the row read back as text holds more
#: words than the script gave it: the words the script's map() dropped are read instead.
WORD = "rng.choice(STEMS) + rng.choice(ENDS)"
SPLIT_WORDS = {
    "every-row": WORD,
    "a-quarter-of-the-rows": f'({WORD} if index % 4 == 0 else rng.choice("abcdegklmnoprs"))',
    "hyphenated-words": f'{WORD} + "-" + rng.choice(STEMS)',
}


@pytest.mark.parametrize(
    "condition",
    ["word != previous", "True"],
    ids=["first-sub-word", "every-sub-word"],
)
@pytest.mark.parametrize("word", SPLIT_WORDS.values(), ids=SPLIT_WORDS.keys())
def test_labels_given_through_word_ids_pass(project: pytest.Pytester, condition: str, word: str) -> None:
    write(project, "train.py", SCRIPT.format(condition=condition, by_position="", word=word))
    assert failures(run_script(project, "--trainer-stages=dataset")) == []


def test_labels_on_the_later_sub_words_of_each_word_fail_dataset(project: pytest.Pytester) -> None:
    write(project, "train.py", SCRIPT.format(condition="word == previous", by_position="", word=WORD))  # inverted
    result = run_script(project, "--trainer-stages=dataset")
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: in * of the * words of several tokens (of the first 64 rows of the training "
            "dataset), the word's first token is -100 while a later one carries a label (row *",
            "*fix: give each token its word's label through the encoding's word_ids()*",
        ]
    )


#: The word tags written into the token positions after [CLS] in turn, word_ids() unused.
BY_POSITION = (
    'encoded["labels"] = [[-100] + list(word_tags) + [-100] * (len(encoded["input_ids"][row]) - len(word_tags) - 1) '
    'for row, word_tags in enumerate(batch["tags"])]'
)


@pytest.mark.parametrize("word", SPLIT_WORDS.values(), ids=SPLIT_WORDS.keys())
def test_word_tags_written_into_token_positions_fail_dataset(project: pytest.Pytester, word: str) -> None:
    write(project, "train.py", SCRIPT.format(condition="word != previous", by_position=BY_POSITION, word=word))
    result = run_script(project, "--trainer-stages=dataset")
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: in * of the * rows read back with a word of several tokens (of the first 64 of "
            "the training dataset), each word's label sits on the row's tokens in turn, not on its words' tokens*",
            "*fix: give each token its word's label through the encoding's word_ids()*",
        ]
    )
