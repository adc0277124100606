"""Train a tiny Llama-style chat model with TRL's GRPOTrainer: sampled answers scored by two reward functions.

Each prompt asks which animal did something in a short sentence; the model samples ``num_generations``
answers per prompt, and two reward functions score them: ``names_the_animal`` (1 when the answer
names the row's ``answer``) and ``short_answer`` (answers of a few words score best). GRPO compares the
answers of one prompt with each other, so a reward must differ between them for anything to train.
The word-level tokenizer is trained on the prompts when the script starts and carries a ChatML-style
chat template; the model is built from a ``LlamaConfig`` (no download). ``GRPOConfig`` keeps TRL's
default ``bf16=True``, the recipe as it would run on a GPU.
Run directly with ``python train.py`` or test it with
``pytest --trainer-module=conftest_examples/grpo/train.py``.
"""

from pathlib import Path

from datasets import load_dataset
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

DATA_DIR = Path(__file__).parent / "data"
START, END, PAD, UNKNOWN = "<|im_start|>", "<|im_end|>", "<|pad|>", "<|unk|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + ' ' + message['content'] + ' <|im_end|> ' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant ' }}{% endif %}"
)


def build_tokenizer(prompts):
    """A word-level tokenizer trained on the prompts, with a ChatML-style template, wrapped for transformers."""
    core = Tokenizer(models.WordLevel(unk_token=UNKNOWN))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    texts = [message["content"] for prompt in prompts for message in prompt] + ["user assistant"]
    core.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=[PAD, UNKNOWN, START, END]))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=END,
        pad_token=PAD,
        unk_token=UNKNOWN,
        additional_special_tokens=[START],
        model_input_names=["input_ids", "attention_mask"],
    )  # what a decoder takes
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def names_the_animal(completions, answer, **kwargs):
    """1 when the answer names the animal of the sentence, else 0."""
    return [
        float(animal in completion[0]["content"].split())
        for completion, animal in zip(completions, answer, strict=True)
    ]


def short_answer(completions, **kwargs):
    """Answers of two words score 1; each word more or less costs a quarter."""
    return [1.0 - abs(len(completion[0]["content"].split()) - 2) / 4 for completion in completions]


def main():
    data = load_dataset("json", data_files={"train": str(DATA_DIR / "train.jsonl")})["train"]
    tokenizer = build_tokenizer(data["prompt"])
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)

    args = GRPOConfig(
        output_dir="grpo-tiny-llama",
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=24,
        learning_rate=1e-4,
        num_train_epochs=1,
        logging_steps=1,
        report_to=[],
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[names_the_animal, short_answer],
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
    )
    trainer.train()


if __name__ == "__main__":
    main()
