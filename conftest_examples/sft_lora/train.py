"""Fine-tune a tiny Qwen2-style chat model with TRL's SFTTrainer and a LoRA adapter (assistant-only loss).

The byte-level BPE tokenizer is trained on the conversations when the script starts and carries a
ChatML chat template whose ``{% generation %}`` markers tell TRL which tokens are the assistant's:
only those are trained (``assistant_only_loss=True``). The model is built from a ``Qwen2Config`` (no
download); PEFT wraps it with LoRA adapters on the attention projections. ``SFTConfig`` keeps TRL's
default ``bf16=True``, the recipe as it would run on a GPU.
Run directly with ``python train.py`` or test it with
``pytest --trainer-module=conftest_examples/sft_lora/train.py``.
"""

from pathlib import Path

from datasets import load_dataset
from peft import LoraConfig
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from trl import SFTConfig, SFTTrainer

DATA_DIR = Path(__file__).parent / "data"
MAX_POSITIONS = 256
START, END, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer(conversations):
    """A byte-level BPE tokenizer trained on the conversations, with a ChatML template, wrapped for transformers."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    texts = [turn["content"] for conversation in conversations for turn in conversation]
    core.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=[PAD, START, END],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        model_max_length=MAX_POSITIONS,
        eos_token=END,  # the end of each turn: the model must learn to write it, so it is not the pad token
        pad_token=PAD,
        additional_special_tokens=[START],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def main():
    raw = load_dataset(
        "json",
        data_files={"train": str(DATA_DIR / "train.jsonl"), "validation": str(DATA_DIR / "validation.jsonl")},
    )
    tokenizer = build_tokenizer(raw["train"]["messages"])
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config)

    args = SFTConfig(
        output_dir="sft-lora-tiny-qwen2",
        assistant_only_loss=True,
        max_length=128,
        learning_rate=2e-3,
        num_train_epochs=5,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=16,
        eval_strategy="epoch",
        save_strategy="no",
        report_to="none",
    )
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")

    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=raw["train"],
        eval_dataset=raw["validation"],
        processing_class=tokenizer,
        peft_config=lora,
    )
    trainer.train()


if __name__ == "__main__":
    main()
