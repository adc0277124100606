"""An encoder-decoder's classification head (BART's, T5's) is a classifier of class ids, not a seq2seq model.

Its labels are checked against the head's width like any text classifier's; rows cut or repeated by the
properties keep their end-of-sequence token, which these heads read their prediction from.
"""

from __future__ import annotations

import pytest
from pipeline_runs import ITEMS, failures, outcomes, run_script, write

BART = """
    import tiny
    from transformers import BartConfig, BartForSequenceClassification, Trainer, TrainingArguments

    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(48, classes=3), tok)
    config = BartConfig(vocab_size=len(tiny.VOCAB), d_model=16, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                        max_position_embeddings=64, num_labels=3, pad_token_id=tok.pad_token_id,
                        eos_token_id=tok.sep_token_id, bos_token_id=tok.cls_token_id,
                        decoder_start_token_id=tok.sep_token_id)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, learning_rate=1e-3, report_to=[])
    trainer = Trainer(model=BartForSequenceClassification(config), args=args, train_dataset=data, eval_dataset=data,
                      processing_class=tok)
    trainer.train()
"""


def test_a_bart_classifier_passes_every_item(project: pytest.Pytester) -> None:
    write(project, "train.py", BART)
    result = run_script(project)
    assert failures(result) == [], result.stdout.str()[-4000:]
    statuses = outcomes(result)
    assert statuses.pop("targets[cpu]") == "SKIPPED"  # no causal-LM supervision: a text classifier
    assert statuses == {f"{item}[cpu]": "PASSED" for item in ITEMS if item != "targets"}
    result.stdout.fnmatch_lines(["*text classification: no causal-LM supervision*"])


def test_a_bart_classifier_with_more_classes_than_outputs_fails_dataset(project: pytest.Pytester) -> None:
    write(project, "train.py", BART.replace("num_labels=3", "num_labels=2"))
    result = run_script(project)
    assert "dataset[cpu]" in failures(result)
    result.stdout.fnmatch_lines(
        [
            "*dataset[[]cpu[]] failed: labels range 0..2 (3 classes) but the model has 2 outputs*",
            "*fix: pass num_labels=3 when building the model, e.g. BartConfig(..., num_labels=3)",
        ]
    )
