"""A tiny HF checkpoint (tiny_families.py) written as a GGUF the way llama.cpp's convert_hf_to_gguf.py writes it:
its architecture's metadata keys, names from gguf's TensorNameMap, experts stacked into 3-D tensors, Llama's q/k
rows permuted for llama.cpp's RoPE, Gemma's norms stored as 1 + w, projections as Q8_0 blocks (gguf.quants,
ggml's reference quantizer) and norms, biases and routers F32; the tokenizer as a `gpt2` (byte-level BPE) vocabulary.

One deviation, named where it is made: a Mistral window is written as `llama.attention.sliding_window` (the
converter drops it; the engine slides where a file says so). `mistake` writes the file wrong on purpose (the
tests show the engine's check catches each one).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

# tiny_families name -> llama.cpp architecture
ARCH = {"llama": "llama", "llama-linear": "llama", "llama-yarn": "llama", "llama3": "llama", "mistral": "llama",
        "qwen2": "qwen2", "qwen3": "qwen3", "qwen3-moe": "qwen3moe", "gemma2": "gemma2", "gemma3": "gemma3",
        "phi3": "phi3"}
# what a GGUF can say of each tiny checkpoint: llama.cpp keeps no query_pre_attn_scalar (head_dim but for the 27B
# models), Gemma 3's pattern only as every n-th layer global (6), and no dense layers among qwen3moe's experts
GGUF_OVERRIDES = {"gemma2": dict(query_pre_attn_scalar=16),
                  "gemma3": dict(query_pre_attn_scalar=16, num_hidden_layers=6, layer_types=None),
                  "qwen3-moe": dict(mlp_only_layers=[])}
MISTAKES = ("no_permute", "double_norm_offset", "expert_order", "swap_gate_up")  # `extra`: tensors added as they are


def write_gguf(folder: Path, path: Path, family: str, projections: GGMLQuantizationType = GGMLQuantizationType.Q8_0,
               mistake: str | None = None, extra: dict[str, np.ndarray] | None = None) -> Path:
    arch = ARCH[family]
    config = json.loads((folder / "config.json").read_text())
    writer = GGUFWriter(str(path), arch)
    _metadata(writer, arch, config, family)
    _tokenizer(writer, folder, config["vocab_size"])
    for name, array in [*_tensors(arch, config, _checkpoint(folder), mistake), *_rope_freqs(config), *(extra or {}).items()]:
        kind = _kind(name, array, projections)
        if kind == GGMLQuantizationType.F32:
            writer.add_tensor(name, array.astype(np.float32))
        else:
            writer.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _checkpoint(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return {name: t.astype(np.float32) for name, t in load_file(str(folder / "model.safetensors")).items()}


def _kind(name: str, array: np.ndarray, projections: GGMLQuantizationType) -> GGMLQuantizationType:
    """The converter's rule: 1-D tensors, norms, routers and anything not a .weight stay F32."""
    if array.ndim <= 1 or name.endswith("_norm.weight") or ".ffn_gate_inp." in name or not name.endswith(".weight"):
        return GGMLQuantizationType.F32
    return projections


def _tensors(arch: str, config: dict, state: dict[str, np.ndarray], mistake: str | None):
    names = gguf.get_tensor_name_map(_model_arch(arch), config["num_hidden_layers"])
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    for hf_name, array in _stack_experts(state, mistake).items():
        if arch.startswith("gemma") and hf_name == "lm_head.weight":
            continue  # the converter skips Gemma's head: always the embedding
        if arch == "llama" and mistake != "no_permute" and re.search(r"\.(q|k)_proj\.", hf_name):
            array = _permute(array, heads, heads if ".q_proj." in hf_name else kv_heads)
        if arch.startswith("gemma") and hf_name.endswith("norm.weight"):
            array = array + (2.0 if mistake == "double_norm_offset" else 1.0)
        if mistake == "swap_gate_up" and hf_name.endswith(".gate_up_proj.weight"):
            half = array.shape[0] // 2
            array = np.concatenate([array[half:], array[:half]])
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, f"gguf has no name for {hf_name} in {arch}"
        yield name, np.ascontiguousarray(array)


def _rope_freqs(config: dict):
    """LlamaModel.generate_extra_tensors: Llama 3's RoPE scaling as one factor per frequency (rope_freqs)."""
    params = config.get("rope_parameters") or {}
    if params.get("rope_type") != "llama3":
        return
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    freqs = 1.0 / (params["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    old, low, high, factor = (params["original_max_position_embeddings"], params["low_freq_factor"],
                              params["high_freq_factor"], params["factor"])
    factors = []
    for wavelen in 2 * np.pi / freqs:
        smooth = (old / wavelen - low) / (high - low)
        factors.append(1.0 if wavelen < old / high else factor if wavelen > old / low else 1 / ((1 - smooth) / factor + smooth))
    yield "rope_freqs.weight", np.array(factors, dtype=np.float32)


def _model_arch(arch: str) -> gguf.MODEL_ARCH:
    return next(key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == arch)


def _stack_experts(state: dict[str, np.ndarray], mistake: str | None) -> dict[str, np.ndarray]:
    """model.layers.{i}.mlp.experts.{e}.{w}.weight -> model.layers.{i}.mlp.experts.{w}.weight [experts, rows, cols],
    as the converter merges them (Qwen2MoeModel.modify_tensors)."""
    out, experts = {}, {}
    for name, array in state.items():
        m = re.fullmatch(r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(\w+)\.weight", name)
        if m is None:
            out[name] = array
        else:
            experts.setdefault(f"{m[1]}.{m[3]}.weight", {})[int(m[2])] = array
    for name, by_expert in experts.items():
        order = sorted(by_expert, reverse=mistake == "expert_order")
        out[name] = np.stack([by_expert[e] for e in order])
    return out


def _permute(w: np.ndarray, n_head: int, n_head_kv: int) -> np.ndarray:
    """LlamaModel.permute: each head's rows from (half, pair) to (pair, half) order, llama.cpp's RoPE layout."""
    heads = n_head_kv if n_head != n_head_kv else n_head
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _metadata(writer: GGUFWriter, arch: str, config: dict, family: str) -> None:
    rope = config.get("rope_parameters") or {}
    full = rope.get("full_attention", rope)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if config.get("head_dim") is not None:
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    if arch != "gemma2":  # Gemma2Model writes no RoPE keys (llama.cpp's default base, 10000)
        writer.add_rope_freq_base(full.get("rope_theta", 10000.0))
        _rope_scaling(writer, full)
    if arch == "llama":
        writer.add_vocab_size(config["vocab_size"])
        writer.add_rope_dimension_count(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
        if family == "mistral" and config.get("sliding_window"):
            writer.add_sliding_window(config["sliding_window"])  # the deviation: the converter drops it
    if arch == "qwen3moe":
        writer.add_expert_count(config.get("num_local_experts") or config["num_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
        writer.add_sliding_window(config["sliding_window"])
    if arch == "gemma3":
        if config.get("final_logit_softcapping"):
            writer.add_final_logit_softcapping(config["final_logit_softcapping"])
        writer.add_sliding_window(config["sliding_window"])
        if "rope_theta" in rope.get("sliding_attention", {}):
            writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    if arch == "phi3":
        writer.add_rope_dimension_count(config["hidden_size"] // config["num_attention_heads"])
        writer.add_sliding_window(config.get("sliding_window") or 0)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)


def _rope_scaling(writer: GGUFWriter, params: dict) -> None:
    """TextModel.set_gguf_parameters: linear and YaRN factors (Llama 3's become a rope_freqs tensor, not written here)."""
    kind, factor = params.get("rope_type"), params.get("factor")
    if kind == "linear" and factor is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(factor)
    elif kind == "yarn" and factor is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(factor)
        writer.add_rope_scaling_orig_ctx_len(params["original_max_position_embeddings"])


def _tokenizer(writer: GGUFWriter, folder: Path, size: int | None = None) -> int:
    """The byte-level BPE as _set_vocab_gpt2 writes it: tokens by id (ids the tokenizer lacks up to the model's vocab_size
    as unused [PAD{id}]), special ones as control, merges, the special ids and the chat template."""
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    special = {t["id"]: t["content"] for t in tokenizer["added_tokens"]}
    vocab = {i: token for token, i in tokenizer["model"]["vocab"].items()} | special
    kinds = {i: gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in vocab}
    size = size or len(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([vocab.get(i, f"[PAD{i}]") for i in range(size)])
    writer.add_token_types([kinds.get(i, gguf.TokenType.UNUSED) for i in range(size)])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]])
    config = json.loads((folder / "tokenizer_config.json").read_text())
    ids = {token: i for i, token in vocab.items()}
    writer.add_bos_token_id(ids[config["bos_token"]])
    writer.add_eos_token_id(ids[config["eos_token"]])
    writer.add_chat_template((folder / "chat_template.jinja").read_text())
    return size


SENTENCEPIECE_PIECES = ["▁", "h", "e", "l", "o", "w", "r", "d", "t", "▁h", "▁w", "he", "ll", "▁he", "llo", "▁hello", "or",
                        "▁wor", "ld", "▁world", "▁the"]


def write_vocab_only(path: Path, arch: str, tokenizer_model: str, folder: Path | None = None, add_bos: bool | None = None) -> Path:
    """A GGUF with a vocabulary and one tensor: the tiny checkpoint's byte-level BPE (`gpt2`), or a small
    sentencepiece vocabulary (`llama`: unknown, control, 256 byte tokens, scored pieces) as Llama 2, Gemma and
    Phi-3 files carry."""
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    if tokenizer_model == "gpt2":
        assert folder is not None
        size = _tokenizer(writer, folder)
    else:
        tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + SENTENCEPIECE_PIECES
        kinds = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_types(kinds + [gguf.TokenType.NORMAL] * len(SENTENCEPIECE_PIECES))
        writer.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(SENTENCEPIECE_PIECES))])
        writer.add_unk_token_id(0)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_chat_template("{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}")
        size = len(tokens)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    writer.add_tensor("token_embd.weight", np.zeros((size, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
