"""Helpers for tests/e2e/test_asked.py: `chat.py`, tiny chat models with Llama-3, Qwen and Gemma style templates."""

#: A module the chat scripts import: word-level tokenizers on tiny's vocabulary with each family's special tokens and
#: chat template ({% generation %} around the assistant's answer and its end of turn), and a tiny Llama whose
#: generation config stops where that family's does.
CHAT = '''
"""Tiny chat models: a Llama from a config, and tokenizers whose chat templates follow three model families."""
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import tiny

LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\\\n\\\\n' }}"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + '<|eot_id|>' }}{% endgeneration %}"
    "{% else %}{{ m['content'] + '<|eot_id|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\\\n\\\\n' }}{% endif %}"
)
QWEN = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ '<|im_start|>assistant\\\\n' }}{% generation %}"
    "{% if m.reasoning_content %}{{ '<think> ' + m.reasoning_content + ' </think> ' }}{% endif %}"
    "{% for call in m.tool_calls or [] %}{{ '<tool_call> ' + call.function.name + ' </tool_call> ' }}{% endfor %}"
    "{{ m['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\\\n' }}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\\\\n' + m['content'] + '<|im_end|>\\\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\\\n' }}{% endif %}"
)
GEMMA = (
    "{{ bos_token }}{% for m in messages %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "{{ '<start_of_turn>' + role + '\\\\n' }}{% if m['role'] == 'assistant' %}{% generation %}"
    "{{ m['content'] + '<end_of_turn>' }}{% endgeneration %}{{ '\\\\n' }}"
    "{% else %}{{ m['content'] + '<end_of_turn>\\\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\\\n' }}{% endif %}"
)
#: Per family: its special tokens, bos, eos (the tokenizer's), pad, the tokens generation stops at, its template.
STYLES = {
    "llama3": (["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                "<|finetune_right_pad_id|>"], "<|begin_of_text|>", "<|eot_id|>", "<|finetune_right_pad_id|>",
               ["<|eot_id|>", "<|end_of_text|>"], LLAMA3),
    "qwen": (["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"],
             None, "<|im_end|>",
             "<|endoftext|>", ["<|im_end|>", "<|endoftext|>"], QWEN),
    "gemma": (["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"], "<bos>", "<eos>", "<pad>",
              ["<eos>", "<end_of_turn>"], GEMMA),
}
ROLES = ["system", "user", "assistant", "model", "tool", "lookup"]


def tokenizer(style, adds_bos=False):
    """A word-level tokenizer of the style's special tokens and template (`adds_bos`: it adds the bos itself when
    it tokenizes, as Llama 3's does)."""
    special, bos, eos, pad, _, template = STYLES[style]
    vocab = {token: index for index, token in enumerate(["[UNK]", *special, *ROLES, *tiny.WORDS])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    if adds_bos:
        core.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    made = PreTrainedTokenizerFast(tokenizer_object=core, model_max_length=256, unk_token="[UNK]", bos_token=bos,
                                   eos_token=eos, pad_token=pad, additional_special_tokens=special)
    made.chat_template = template
    return made


def model(tok, style):
    """A tiny Llama on the tokenizer's vocabulary, whose generation stops where the style's does."""
    config = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    built = LlamaForCausalLM(config)
    built.generation_config.eos_token_id = tok.convert_tokens_to_ids(STYLES[style][4])
    return built


def conversations(count=32, seed=0, reasoning=False, system=False, tools=False):
    """Single-turn conversations of tiny's words: the answer is the question's last three words reversed (after a
    system prompt, with `system`; after a call of the tool `lookup` and its answer, with `tools`)."""
    rows = []
    for question in tiny.sentences(count, seed=seed, shortest=3, longest=10):
        answer = {"role": "assistant", "content": " ".join(question.split()[::-1][:3])}
        if reasoning:
            answer["reasoning_content"] = " ".join(question.split()[:2])
        start = [{"role": "system", "content": "the small cat"}] if system else []
        called = [{"role": "assistant", "content": "", "tool_calls": [
                      {"type": "function", "function": {"name": "lookup", "arguments": {"word": question.split()[0]}}}]},
                  {"role": "tool", "content": question.split()[-1]}] if tools else []
        rows.append([*start, {"role": "user", "content": question}, *called, answer])
    return rows
'''

#: TRL's SFTTrainer on a messages column, the assistant-only loss: the correct recipe of each style.
SFT = """
    import chat
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tok = chat.tokenizer({style!r})
    {change}
    data = Dataset.from_dict({{"messages": chat.conversations(reasoning={reasoning}, system={system}, tools={tools})}})
    args = SFTConfig(output_dir="out", assistant_only_loss=True, max_length={max_length}, bf16=False,
                     per_device_train_batch_size=4, report_to=[]{args})
    trainer = SFTTrainer(chat.model(tok, {style!r}), args=args, train_dataset=data, processing_class=tok)
    trainer.train()
"""


def sft(
    style: str,
    change: str = "",
    reasoning: bool = False,
    max_length: int = 64,
    args: str = "",
    system: bool = False,
    tools: bool = False,
) -> str:
    return SFT.format(
        style=style,
        change=change or "pass",
        reasoning=reasoning,
        max_length=max_length,
        args=f", {args}" if args else "",
        system=system,
        tools=tools,
    )


#: The plain Trainer on conversations rendered to text by the template and tokenized again, full-sequence loss.
RENDERED = """
    import chat
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    tok = chat.tokenizer("llama3", adds_bos=True)
    data = Dataset.from_dict({{"messages": chat.conversations()}})
    data = data.map(lambda row: tok(tok.apply_chat_template({system}row["messages"], tokenize=False){tokenize}))
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, report_to=[], bf16=False)
    trainer = Trainer(model=chat.model(tok, "llama3"), args=args, train_dataset=data, processing_class=tok,
                      data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
    trainer.train()
"""
