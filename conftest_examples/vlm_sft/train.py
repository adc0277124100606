"""Fine-tune a tiny LLaVA-style vision-language model with TRL's SFTTrainer on conversations about images.

Everything is built offline when the script starts: the model from configs (a CLIP vision tower and a Llama
text model joined by LLaVA's projector), a word-level tokenizer holding an ``<image>`` token and a chat template
whose ``{% generation %}`` markers tell TRL which tokens are the assistant's (only those are trained:
``assistant_only_loss=True``, so neither the question nor the image placeholders carry labels), the LLaVA
processor that expands each ``<image>`` into the tokens the vision tower's features fill, and images of coloured
shapes drawn with PIL. The images are stored in a ``datasets.Image`` column (encoded bytes), as a dataset loaded
from the Hub or from files stores them, and decoded when a row is read.
Run directly with ``python train.py`` or test it with
``pytest --trainer-module=conftest_examples/vlm_sft/train.py``.
"""

import random

from datasets import Dataset, Features, Image, List, Value
from PIL import Image as PILImage
from PIL import ImageDraw
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerFast,
)
from trl import SFTConfig, SFTTrainer

try:  # transformers 5: the image processor on PIL and numpy alone (no torchvision)
    from transformers import LlavaImageProcessorPil as ImageProcessor
except ImportError:  # transformers 4
    from transformers import CLIPImageProcessor as ImageProcessor

IMAGE_SIZE, PATCH = 16, 8  # a 2 x 2 grid of patches: each image fills 4 image tokens
COLOURS = ["red", "green", "blue", "yellow"]
SHAPES = ["square", "circle"]
WORDS = [
    "what",
    "is",
    "in",
    "the",
    "picture",
    "a",
    "an",
    "describe",
    "image",
    "shape",
    "colour",
    "of",
    "it",
    "?",
    ".",
    ":",
    "USER",
    "ASSISTANT",
    *COLOURS,
    *SHAPES,
]
SPECIAL = ["<pad>", "<unk>", "<s>", "</s>", "<image>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ 'USER: ' }}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image> ' }}{% else %}{{ part['text'] + ' ' }}{% endif %}"
    "{% endfor %}"
    "{% else %}{{ 'ASSISTANT: ' }}{% generation %}"
    "{% for part in message['content'] %}{{ part['text'] + ' ' }}{% endfor %}{{ '</s>' }}"
    "{% endgeneration %}{{ ' ' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT: ' }}{% endif %}"
)
QUESTIONS = ["what is in the picture ?", "describe the image .", "what shape is it ?"]


def build_processor():
    """A word-level tokenizer with an `<image>` token and a chat template, and LLaVA's processor around it."""
    vocab = {token: index for index, token in enumerate(SPECIAL + WORDS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.add_special_tokens(SPECIAL)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        model_max_length=128,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
    )
    image_processor = ImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, do_convert_rgb=True
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=CHAT_TEMPLATE,
    )


def build_model(tokenizer):
    vision = CLIPVisionConfig(
        image_size=IMAGE_SIZE,
        patch_size=PATCH,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        projection_dim=16,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        projector_hidden_act="gelu",
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlavaForConditionalGeneration(config)
    # LLaVA's recipe: the vision tower stays frozen; the projector and the language model learn.
    model.model.vision_tower.requires_grad_(False)
    return model


def picture(colour, shape):
    image = PILImage.new("RGB", (IMAGE_SIZE * 2, IMAGE_SIZE * 2), "white")
    draw = ImageDraw.Draw(image)
    box = (6, 6, IMAGE_SIZE * 2 - 6, IMAGE_SIZE * 2 - 6)
    (draw.rectangle if shape == "square" else draw.ellipse)(box, fill=colour)
    return image


def conversations(count, seed):
    """Rows of one image and a conversation about it, the image kept in a `datasets.Image` column."""
    rng = random.Random(seed)
    rows = {"images": [], "messages": []}
    for _ in range(count):
        colour, shape = rng.choice(COLOURS), rng.choice(SHAPES)
        rows["images"].append([picture(colour, shape)])
        rows["messages"].append(
            [
                {
                    "role": "user",
                    "content": [{"type": "image", "text": None}, {"type": "text", "text": rng.choice(QUESTIONS)}],
                },
                {"role": "assistant", "content": [{"type": "text", "text": f"a {colour} {shape} ."}]},
            ]
        )
    part = {"type": Value("string"), "text": Value("string")}
    features = Features({"images": List(Image()), "messages": List({"role": Value("string"), "content": List(part)})})
    return Dataset.from_dict(rows, features=features)


def main():
    processor = build_processor()
    model = build_model(processor.tokenizer)
    args = SFTConfig(
        output_dir="vlm-sft-tiny-llava",
        assistant_only_loss=True,
        max_length=None,  # never cut image tokens: a row is as long as its image and conversation
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        num_train_epochs=1,
        bf16=False,
        report_to="none",
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=conversations(64, seed=0),
        eval_dataset=conversations(16, seed=1),
        processing_class=processor,
    )
    trainer.train()


if __name__ == "__main__":
    main()
