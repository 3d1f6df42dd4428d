"""tokenizer.json and tokenizer_config.json (with the chat template) from a GGUF's metadata alone.

transformers' GGUF tokenizer converter builds the vocabulary, merges, pre-tokenizer and decoder per tokenizer type
(byte-level BPE, sentencepiece with Gemma's and Phi-3's variants); the BOS/EOS it adds when the file says so
(`tokenizer.ggml.add_bos_token`, on by default for sentencepiece) lives in its tokenizer class, not in the
backend it returns, so it is written here as the backend's post-processor: the engine reads tokenizer.json alone.
"""
from __future__ import annotations

import json
from pathlib import Path

from .reader import GGUFFile


def write_tokenizer(g: GGUFFile, folder: Path) -> None:
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer  # lazy: transformers, once

    architecture, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(str(g.path))
    tokenizer, extra = convert_gguf_tokenizer(architecture, tokenizer_dict)
    _special_tokens_around(tokenizer, tokenizer_config)
    tokenizer.save(str(folder / "tokenizer.json"), pretty=False)  # 1.6 MB, not 3.5: the cache stays within the file
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config | extra, indent=1))


def _special_tokens_around(tokenizer, config: dict) -> None:
    """BOS before (and EOS after) each sequence where the config adds them, as transformers' LlamaTokenizer does."""
    from tokenizers import processors  # lazy: tokenizers, when a tokenizer loads

    bos = config.get("bos_token") if config.get("add_bos_token") else None
    eos = config.get("eos_token") if config.get("add_eos_token") else None
    if bos is None and eos is None:
        return
    def around(seq: str, type_id: int) -> str:
        return " ".join([*([f"{bos}:{type_id}"] if bos else []), f"${seq}:{type_id}", *([f"{eos}:{type_id}"] if eos else [])])
    tokens = [(t, tokenizer.token_to_id(t)) for t in {bos, eos} - {None}]
    tokenizer.post_processor = processors.TemplateProcessing(single=around("A", 0), pair=f"{around('A', 0)} {around('B', 1)}",
                                                             special_tokens=tokens)
