"""A tiny model folder for the fast tier: a real byte-level BPE tokenizer (the `tokenizers` library, trained in
milliseconds on a few sentences), a ChatML template and a config.json, but no weights.

Validation, submission, planning and dispatch read only these files (jobs/intake/tokenizer.py loads a folder's
tokenizer.json with LightTokenizer), so job-system tests run on it without the model. The special tokens keep
SmolLM2's ids (<|endoftext|> 0, <|im_start|> 1, <|im_end|> 2) and its context length.
"""
from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MAX_POSITION_EMBEDDINGS = 8192
VOCAB_SIZE = 400
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "Once upon a time there was a small batch of requests.",
    "hello there, hi, the same prefix again and again",
    "Summarise the invoice in one line. What is being sold?",
    "You are a helpful assistant. Answer the question briefly.",
]


def build_tiny_model(folder: Path) -> Path:
    """Write tokenizer.json, tokenizer_config.json, chat_template.jinja and config.json into folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>", "unk_token": "<|endoftext|>"}))
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "llama", "max_position_embeddings": MAX_POSITION_EMBEDDINGS, "vocab_size": tokenizer.get_vocab_size()}))
    return folder
