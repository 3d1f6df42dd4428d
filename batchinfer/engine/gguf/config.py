"""A GGUF file's metadata as the config.json its family would have (what ModelSpec and the engine read).

llama.cpp names every value `{architecture}.{key}` (gguf.constants.Keys); the common keys make a Llama-shaped
config, and each architecture's function adds what its family reads, with llama.cpp's defaults where the file
leaves a value out. An architecture not listed is refused at load in one line.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..unsupported import UnsupportedGGUF
from .reader import GGUFFile
from .rope import rope_parameters

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "qwen3moe": "Qwen3MoeForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM",
                 "phi3": "Phi3ForCausalLM"}
MODEL_TYPES = {"qwen3moe": "qwen3_moe", "gemma3": "gemma3_text"}
SLIDING, FULL = "sliding_attention", "full_attention"


def hf_config(g: GGUFFile) -> dict[str, Any]:
    arch = g.architecture
    if arch not in ARCHITECTURES:
        raise UnsupportedGGUF(f"{g.path.name}: GGUF architecture {arch!r} is not supported (supported: "
                              f"{', '.join(sorted(ARCHITECTURES))})")
    config = _common(g, arch)
    return config | FAMILIES[arch](g, config)


def _common(g: GGUFFile, arch: str) -> dict[str, Any]:
    heads, hidden = int(_required(g, "attention.head_count")), int(_required(g, "embedding_length"))
    head_dim = int(g.arch_value("attention.key_length", hidden // heads))
    if int(g.arch_value("rope.dimension_count", head_dim)) != head_dim:
        raise UnsupportedGGUF(f"{g.path.name}: RoPE over {g.arch_value('rope.dimension_count')} of {head_dim} "
                              "dimensions (partial rotary) is not supported")
    if "token_embd.weight" not in g.tensors:
        raise UnsupportedGGUF(f"{g.path.name}: tensor token_embd.weight is missing")
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": MODEL_TYPES.get(arch, arch),
        "hidden_size": hidden,
        "intermediate_size": int(g.arch_value("feed_forward_length", 0)),
        "num_hidden_layers": int(_required(g, "block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(g.arch_value("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(g.arch_value("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_parameters": rope_parameters(g),
        "max_position_embeddings": int(g.arch_value("context_length", 4096)),
        "vocab_size": g.tensors["token_embd.weight"].shape[0],  # the rows the model has (Gemma 3 drops unused ones)
        "tie_word_embeddings": "output.weight" not in g.tensors,
        "hidden_act": "silu",
    }
    for key, name in (("bos_token_id", "tokenizer.ggml.bos_token_id"), ("eos_token_id", "tokenizer.ggml.eos_token_id")):
        if name in g.metadata:
            config[key] = int(g.metadata[name])
    return config


def _required(g: GGUFFile, key: str) -> Any:
    value = g.arch_value(key)
    if value is None:
        raise UnsupportedGGUF(f"{g.path.name}: metadata {g.architecture}.{key} is missing")
    return value


def _llama(g: GGUFFile, config: dict) -> dict:
    """Mistral's files are llama.cpp's `llama`; a window in the metadata makes it Mistral (every layer slides)."""
    window = int(g.arch_value("attention.sliding_window", 0) or 0)
    return {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": window} if window else {}


def _no_differences(g: GGUFFile, config: dict) -> dict:
    return {}


def _qwen3moe(g: GGUFFile, config: dict) -> dict:
    """Experts from the metadata; a layer without a router (ffn_gate_inp) is dense. llama.cpp always renormalises
    the top-k weights unless the file says otherwise."""
    layers = config["num_hidden_layers"]
    return {"num_experts": int(_required(g, "expert_count")), "num_experts_per_tok": int(_required(g, "expert_used_count")),
            "moe_intermediate_size": int(g.arch_value("expert_feed_forward_length", config["intermediate_size"])),
            "norm_topk_prob": bool(g.arch_value("expert_weights_norm", True)), "decoder_sparse_step": 1,
            "mlp_only_layers": [i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" not in g.tensors]}


def _phi3(g: GGUFFile, config: dict) -> dict:
    """A window > 0 slides every layer, as transformers runs Phi-3 (llama.cpp turns Phi-3's window off)."""
    if "rope_factors_long.weight" in g.tensors:
        raise UnsupportedGGUF(f"{g.path.name}: LongRoPE (rope_factors_long.weight, Phi-3 128k) is not supported")
    window = int(g.arch_value("attention.sliding_window", 0) or 0)
    return {"sliding_window": window or None}


# llama.cpp's defaults: the window of Gemma 2, the local:global layer pattern, the 27B layer count whose scores are
# scaled by hidden / heads rather than head_dim (query_pre_attn_scalar is not in the file)
GEMMA = {"gemma2": dict(window=4096, pattern=2, large=46), "gemma3": dict(window=0, pattern=6, large=62)}


def _gemma(g: GGUFFile, config: dict) -> dict:
    """GeGLU, soft-caps, the local/global layer pattern, and for Gemma 3 a local RoPE base (no scaling)."""
    arch, known = g.architecture, GEMMA[g.architecture]
    window = int(g.arch_value("attention.sliding_window", known["window"]) or 0)
    layers = config["num_hidden_layers"]
    types = _layer_types(g, layers, known["pattern"]) if window else [FULL] * layers
    scalar = config["hidden_size"] // config["num_attention_heads"] if layers == known["large"] else config["head_dim"]
    out = {"hidden_activation": "gelu_pytorch_tanh", "hidden_act": "gelu_pytorch_tanh", "query_pre_attn_scalar": scalar,
           "attn_logit_softcapping": g.arch_value("attn_logit_softcapping"),
           "final_logit_softcapping": g.arch_value("final_logit_softcapping"),
           "sliding_window": window or None, "layer_types": types}
    if arch == "gemma3":
        local = {"rope_type": "default", "rope_theta": float(g.arch_value("rope.freq_base_swa", 10000.0))}
        out["rope_parameters"] = {FULL: config["rope_parameters"], SLIDING: local}
    return out


def _layer_types(g: GGUFFile, layers: int, pattern: int) -> list[str]:
    """llama.cpp's sliding_window_pattern: one flag per layer, or every n-th layer global (the last of each n)."""
    value = g.arch_value("attention.sliding_window_pattern", pattern)
    if not isinstance(value, (int, float)):
        return [SLIDING if bool(flag) else FULL for flag in list(value)[:layers]]
    n = int(value)
    return [SLIDING if n == 0 or i % n < n - 1 else FULL for i in range(layers)]


FAMILIES: dict[str, Callable[[GGUFFile, dict], dict]] = {
    "llama": _llama, "qwen2": _no_differences, "qwen3": _no_differences, "qwen3moe": _qwen3moe,
    "gemma2": _gemma, "gemma3": _gemma, "phi3": _phi3}
