"""What the model is trained on, beside what it will be asked at inference.

The silent bugs of LLM fine-tuning share one shape: the rows the model learns from differ from the prompt it
will be given (a second BOS, another system prompt or header), its answers end on a token generation does not
stop at (or on none), truncation cuts what matters, or the template drops part of the stored answer (its
reasoning, its tool calls). `view` builds one picture of the sampled training rows, as the Trainer's collator
feeds them, beside the stored conversation, the tokenizer's chat template and the model's generation settings;
`checks` reads it. Nothing here trains or changes the model.
"""
