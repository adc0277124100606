"""A QLoRA SFT of Qwen2.5 7B Instruct by hub id, as its users write it, for the benchmark of a twin's suite.

Only the checkpoint's config and tokenizer files are in the Hugging Face cache (bench/run.py lays them out from
tests/fixtures/checkpoints): the plugin tests the pipeline on the checkpoint's twin. Chat rows of about 300 tokens,
8 to a batch: each step's logits span Qwen's 152k-token vocabulary.
"""

import torch
from datasets import Dataset
from peft import LoraConfig, prepare_model_for_kbit_training
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
from trl import SFTConfig, SFTTrainer

MODEL = "Qwen/Qwen2.5-7B-Instruct"
tokenizer = AutoTokenizer.from_pretrained(MODEL)
model = AutoModelForCausalLM.from_pretrained(
    MODEL,
    quantization_config=BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_use_double_quant=True,
    ),
    device_map="auto",
    dtype=torch.bfloat16,
)
model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
SENTENCE = "the quick brown fox jumps over the lazy dog . what is the capital of france ? paris is ."
words = SENTENCE.split()
rows = [
    [
        {"role": "user", "content": " ".join(words[i % 7 :] * 12)},
        {"role": "assistant", "content": " ".join(words[: i % 11 + 3] * 8)},
    ]
    for i in range(64)
]
args = SFTConfig(
    output_dir="qlora",
    per_device_train_batch_size=8,
    gradient_accumulation_steps=2,
    learning_rate=2e-4,
    gradient_checkpointing=True,
    max_length=1024,
    report_to="none",
)
lora = LoraConfig(
    r=16,
    lora_alpha=32,
    lora_dropout=0.05,
    task_type="CAUSAL_LM",
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
)
trainer = SFTTrainer(
    model=model,
    args=args,
    train_dataset=Dataset.from_dict({"messages": rows}),
    processing_class=tokenizer,
    peft_config=lora,
)
trainer.train()
