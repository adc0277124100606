"""Helpers for tests/e2e/test_tasks.py: `lm.py`, a tiny causal LM and its tokenizer, written beside the TRL scripts."""

#: A module the TRL scripts import: a Llama built from a config on tiny's vocabulary, and a tokenizer without
#: the [CLS]/[SEP] template (TRL adds the special tokens it needs itself).
LM = '''
"""A tiny causal LM (Llama from a config) and a WordLevel tokenizer with pad, bos and eos tokens."""
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import tiny


def tokenizer():
    core = Tokenizer(models.WordLevel(tiny.VOCAB, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, model_max_length=64, pad_token="[PAD]",
                                   unk_token="[UNK]", bos_token="[CLS]", eos_token="[SEP]")


def model(vocab_size=len(tiny.VOCAB)):
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=tiny.VOCAB["[PAD]"], bos_token_id=tiny.VOCAB["[CLS]"],
                         eos_token_id=tiny.VOCAB["[SEP]"])
    return LlamaForCausalLM(config)


def peaked():
    """A policy whose next-token choice is sharp, as a pretrained model's is: its output weights drawn large."""
    import torch

    built = model()
    torch.nn.init.normal_(built.lm_head.weight, std=5.0)
    return built
'''
