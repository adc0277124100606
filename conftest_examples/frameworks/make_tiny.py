"""Build a tiny Qwen2 causal LM, a byte-level BPE tokenizer with a Qwen chat template, and tiny data.

Usage: python make_tiny.py OUT_DIR

OUT_DIR/model/           Qwen2ForCausalLM (hidden 32, 2 layers, 2 heads, 1 kv head) + tokenizer
OUT_DIR/data/sft.jsonl   alpaca rows (instruction / input / output), 40 rows
OUT_DIR/data/chat.jsonl  messages rows (role / content), 40 rows
OUT_DIR/data/dpo.jsonl   preference rows, alpaca ranking style (instruction / input / chosen / rejected)
OUT_DIR/data/dpo_swift.jsonl  preference rows, swift style (messages / rejected_response)
OUT_DIR/data/dataset_info.json  LLaMA-Factory's registry of the three LLaMA-Factory files

Plain transformers / tokenizers API only (works on transformers 4.5x and 5.x), no hub access.
"""

import json
import os
import random
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

SUBJECTS = ["the cat", "a dog", "my friend", "the teacher", "a bird", "the farmer", "our team", "the child"]
VERBS = ["likes", "sees", "finds", "wants", "makes", "reads", "paints", "carries"]
OBJECTS = [
    "a red apple",
    "the blue book",
    "warm bread",
    "a small boat",
    "the old map",
    "green tea",
    "a new song",
    "the big box",
]
PLACES = ["in the park", "at home", "by the river", "on the hill", "in the city", "at school"]
COLORS = ["red", "blue", "green", "yellow", "black", "white", "orange", "purple"]
NUMBERS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def sentences(n, seed=0, place=True):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
        s += f" {rng.choice(PLACES)}." if place else "."
        out.append(s[0].upper() + s[1:])
    return out


def build_tokenizer(corpus):
    tok = Tokenizer(models.BPE())
    # Qwen2's own split (transformers 5 loads the folder as Qwen2Tokenizer, which applies it), then bytes
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=512,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tokenizer):
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    return Qwen2ForCausalLM(config)


def make_data(data_dir, n=40, seed=1):
    rng = random.Random(seed)
    sft, chat, dpo, dpo_swift = [], [], [], []
    for i in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        color = rng.choice(COLORS)
        sent = sentences(1, seed=1000 + i, place=False)[0]  # short: every row fits cutoff_len 64
        kind = i % 3
        if kind == 0:
            instruction, inp, output = "Repeat.", sent, sent
        elif kind == 1:
            instruction, inp = f"What is {NUMBERS[a]} plus {NUMBERS[b]}?", ""
            output = f"It is {a + b + 2}."
        else:
            thing = rng.choice(["ball", "hat", "cup"])
            instruction, inp, output = f"Name a thing that is {color}.", "", f"A {color} {thing}."
        rejected = "I do not know."
        sft.append({"instruction": instruction, "input": inp, "output": output})
        user = instruction if not inp else f"{instruction}\n{inp}"
        chat.append(
            {
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": user},
                    {"role": "assistant", "content": output},
                ]
            }
        )
        dpo.append({"instruction": instruction, "input": inp, "chosen": output, "rejected": rejected})
        dpo_swift.append(
            {
                "messages": [
                    {"role": "user", "content": user},
                    {"role": "assistant", "content": output},
                ],
                "rejected_response": rejected,
            }
        )

    def dump(name, rows):
        with open(os.path.join(data_dir, name), "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")

    dump("sft.jsonl", sft)
    dump("chat.jsonl", chat)
    dump("dpo.jsonl", dpo)
    dump("dpo_swift.jsonl", dpo_swift)
    info = {
        "tiny_sft": {"file_name": "sft.jsonl"},
        "tiny_chat": {
            "file_name": "chat.jsonl",
            "formatting": "sharegpt",
            "columns": {"messages": "messages", "system": "system"},
            "tags": {
                "role_tag": "role",
                "content_tag": "content",
                "user_tag": "user",
                "assistant_tag": "assistant",
                "system_tag": "system",
            },
        },
        "tiny_dpo": {
            "file_name": "dpo.jsonl",
            "ranking": True,
            "columns": {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"},
        },
    }
    with open(os.path.join(data_dir, "dataset_info.json"), "w") as f:
        json.dump(info, f, indent=2)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python make_tiny.py OUT_DIR")
    out = sys.argv[1]
    model_dir, data_dir = os.path.join(out, "model"), os.path.join(out, "data")
    os.makedirs(model_dir, exist_ok=True)
    os.makedirs(data_dir, exist_ok=True)
    corpus = sentences(300) + [f"{x} {c} {y}" for x in NUMBERS for c in COLORS for y in ("ball", "hat", "cup")]
    corpus += [
        "Repeat.",
        "What is plus",
        "It is",
        "Name a thing that is",
        "I do not know.",
        "system user assistant",
    ] + [str(i) for i in range(20)]
    # the default system prompts of Qwen templates (LLaMA-Factory's qwen, swift's qwen), so that rows fit cutoff_len 64
    corpus += [
        "You are a helpful assistant.",
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
        "system\nYou are a helpful assistant.\nuser\n",
        "\nassistant\n",
    ] * 40
    tokenizer = build_tokenizer(corpus)
    model = build_model(tokenizer)
    model.generation_config.eos_token_id = model.config.eos_token_id
    model.generation_config.pad_token_id = model.config.pad_token_id
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    make_data(data_dir)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {model_dir} ({n_params} params, vocab {len(tokenizer)}); data: {data_dir}")


if __name__ == "__main__":
    main()
