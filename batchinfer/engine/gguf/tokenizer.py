"""tokenizer.json and tokenizer_config.json (with the chat template) from a GGUF's metadata alone.

transformers' GGUF tokenizer converter builds the vocabulary, merges, pre-tokenizer and decoder per tokenizer type
(byte-level BPE, sentencepiece with Gemma's and Phi-3's variants); the BOS/EOS it adds when the file says so
(`tokenizer.ggml.add_bos_token`, on by default for sentencepiece) lives in its tokenizer class, not in the
backend it returns, so it is written here as the backend's post-processor: the engine reads tokenizer.json alone.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .reader import GGUFFile

# tokenizer_config's special tokens, by the metadata key of their ids (as transformers' get_gguf_tokenizer)
SPECIAL_TOKENS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                  "pad_token": "padding_token_id"}


def write_tokenizer(g: GGUFFile, folder: Path) -> None:
    # the converter's module alone (it imports no torch): its package's reader imports torch and maps the file again,
    # 1.3 s of CPU in a first run's CLI, which otherwise never imports torch
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (  # lazy: transformers, once
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    architecture, tokenizer_dict, tokenizer_config = tokenizer_metadata(g, GGUF_TOKENIZER_MAPPING)
    tokenizer, extra = convert_gguf_tokenizer(architecture, tokenizer_dict)
    _special_tokens_around(tokenizer, tokenizer_config)
    tokenizer.save(str(folder / "tokenizer.json"), pretty=False)  # 1.6 MB, not 3.5: the cache stays within the file
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config | extra, indent=1))


def tokenizer_metadata(g: GGUFFile, mapping: dict[str, dict[str, str]]) -> tuple[str, dict, dict]:
    """transformers' get_gguf_tokenizer from our reader's metadata: (architecture, tokenizer_dict, tokenizer_config)
    under its names (`mapping`, its GGUF_TOKENIZER_MAPPING), arrays as lists (tested against it)."""
    meta = g.metadata
    grouped = {group: {name: _plain(meta[f"tokenizer.{key}"]) for key, name in renames.items() if f"tokenizer.{key}" in meta}
               for group, renames in mapping.items()}
    tokenizer, config = grouped["tokenizer"], grouped["tokenizer_config"]
    if tokenizer.get("tokenizer_type") == "llama":  # llama.cpp adds BOS to a sentencepiece vocabulary by default
        config.setdefault("add_bos_token", True)
    elif tokenizer.get("tokenizer_type") == "gemma4":  # its chat template writes <bos> itself
        config["add_bos_token"] = False
    for name, key in SPECIAL_TOKENS.items():
        token_id = meta.get(f"tokenizer.ggml.{key}")
        config[name] = tokenizer["tokens"][token_id] if token_id is not None else None
    return g.architecture, tokenizer, config


def _plain(value):
    """Arrays as lists (a vocabulary decoded once), as transformers' reader gives them."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    return list(value) if isinstance(value, Sequence) and not isinstance(value, str) else value


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
