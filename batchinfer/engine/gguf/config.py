"""A GGUF file's metadata as the config.json its family would have (what ModelSpec and the engine read).

llama.cpp names every value `{architecture}.{key}`; each family here maps its architecture to the transformers
class and says what else it sets. An architecture not listed is refused at load in one line.
"""
from __future__ import annotations

from typing import Any

from ..unsupported import UnsupportedGGUF
from .reader import GGUFFile

ARCHITECTURES = {"llama": "LlamaForCausalLM"}


def hf_config(g: GGUFFile) -> dict[str, Any]:
    arch = g.architecture
    if arch not in ARCHITECTURES:
        raise UnsupportedGGUF(f"{g.path.name}: GGUF architecture {arch!r} is not supported (supported: "
                              f"{', '.join(sorted(ARCHITECTURES))})")
    heads = int(g.arch_value("attention.head_count"))
    hidden = int(g.arch_value("embedding_length"))
    tokens = g.metadata.get("tokenizer.ggml.tokens", ())
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": int(g.arch_value("feed_forward_length")),
        "num_hidden_layers": int(g.arch_value("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(g.arch_value("attention.head_count_kv", heads)),
        "head_dim": int(g.arch_value("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(g.arch_value("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(g.arch_value("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(g.arch_value("context_length", 4096)),
        "vocab_size": int(g.arch_value("vocab_size", len(tokens))),
        "tie_word_embeddings": "output.weight" not in g.tensors,
        "hidden_act": "silu",
    }
    for key, name in (("bos_token_id", "tokenizer.ggml.bos_token_id"), ("eos_token_id", "tokenizer.ggml.eos_token_id")):
        if name in g.metadata:
            config[key] = int(g.metadata[name])
    if "rope_freqs.weight" in g.tensors:
        raise UnsupportedGGUF(f"{g.path.name}: per-dimension RoPE frequencies (rope_freqs.weight, Llama 3.1 scaling) "
                              "are not supported yet")
    return config
