"""Tiny random checkpoints of every family the engine runs, written by transformers from a small config.

Each is a real Hugging Face folder (config.json, model.safetensors, generation_config.json) with the tiny
byte-level tokenizer of tests/tiny_model.py. Weights are random with a fixed seed and a wide init, so greedy
choices are clear-cut rather than near-ties of a near-uniform distribution.
"""
from __future__ import annotations

from pathlib import Path

from tests.tiny_model import build_tiny_model

WINDOW = 16  # shorter than most test prompts
COMMON = dict(vocab_size=400, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
              initializer_range=0.3, tie_word_embeddings=False)
GEMMA = dict(head_dim=16, query_pre_attn_scalar=24, sliding_window=WINDOW, hidden_activation="gelu_pytorch_tanh",
             tie_word_embeddings=True)

# name -> (config class, model class, config fields beyond COMMON)
FAMILIES: dict[str, tuple[str, str, dict]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "llama-linear": ("LlamaConfig", "LlamaForCausalLM",
                     dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})),
    "llama-dynamic": ("LlamaConfig", "LlamaForCausalLM",
                      dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})),
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(rope_parameters={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128, "rope_theta": 10000.0})),
    "llama-yarn": ("LlamaConfig", "LlamaForCausalLM", dict(rope_parameters={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "rope_theta": 10000.0})),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=WINDOW, head_dim=16)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32)),
    "qwen3-moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True, head_dim=16,
        num_hidden_layers=3, mlp_only_layers=[1])),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        GEMMA, attn_logit_softcapping=5.0, final_logit_softcapping=3.0)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        GEMMA, num_hidden_layers=3, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}})),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
}


def build_family_checkpoint(name: str, folder: Path, dtype: str = "float32", max_shard_size: str | None = None,
                            **overrides) -> Path:
    """Write the tiny checkpoint of family `name` into folder (fixed seed: the same weights every time)."""
    import torch
    import transformers

    config_class, model_class, fields = FAMILIES[name]
    build_tiny_model(folder)  # the tokenizer files; save_pretrained then writes the real config.json
    config = getattr(transformers, config_class)(**(COMMON | fields | overrides))
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).to(getattr(torch, dtype))
    model.save_pretrained(folder, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    return folder
