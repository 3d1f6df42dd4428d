"""A 1B-class Llama GGUF for the benches: random weights (normal, std 0.02) written with `gguf` as F16, SmolLM2's
tokenizer and chat template copied from the shipped file, then quantized by llama.cpp's own quantizer
(`llama_model_quantize` from llama-cpp-python, `make llamacpp`) to the types people download.

    batchinfer bench make-model --out ~/models --types Q4_K_M,Q8_0

Sizes default to the issue's model: hidden 2048, 16 layers, 32 query / 8 key-value heads, ffn 8192, vocab 49152.
"""
from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import typer

FTYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_M", "Q4_K_S", "Q4_K_M", "Q5_K_M", "Q6_K")


@dataclass(frozen=True)
class Shape:
    hidden: int = 2048
    layers: int = 16
    heads: int = 32
    kv_heads: int = 8
    ffn: int = 8192
    context: int = 8192


def make_models(out: Path, types: list[str], shape: Shape = Shape(), seed: int = 0) -> list[Path]:
    """The F16 file (made once) and one quantized file per type; existing files are kept."""
    out.mkdir(parents=True, exist_ok=True)
    name = f"llama-{shape.hidden}h{shape.layers}l"
    f16 = out / f"{name}-F16.gguf"
    if not f16.exists():
        write_f16(f16, shape, seed)
    made = [f16]
    for ftype in types:
        target = out / f"{name}-{ftype}.gguf"
        if not target.exists():
            quantize(f16, target, ftype)
        made.append(target)
    return made


def write_f16(path: Path, shape: Shape, seed: int) -> None:
    import gguf

    from batchinfer.engine.loading.loader import default_model_path

    source = gguf.GGUFReader(default_model_path())
    writer = gguf.GGUFWriter(str(path) + ".tmp", "llama")
    writer.add_name("random llama for benches")
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(100000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(shape.hidden // shape.heads)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    _copy_tokenizer(source, writer)
    rng = np.random.default_rng(seed)
    vocab = len(source.fields["tokenizer.ggml.tokens"].data)
    head = shape.hidden // shape.heads
    for tensor_name, dims in _tensors(shape, vocab, head):
        if tensor_name.endswith("norm.weight"):
            writer.add_tensor(tensor_name, np.ones(dims, dtype=np.float32))
        else:
            writer.add_tensor(tensor_name, (rng.standard_normal(dims, dtype=np.float32) * 0.02).astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    Path(str(path) + ".tmp").rename(path)


def _tensors(shape: Shape, vocab: int, head: int):
    yield "token_embd.weight", (vocab, shape.hidden)
    yield "output_norm.weight", (shape.hidden,)
    for i in range(shape.layers):
        yield f"blk.{i}.attn_norm.weight", (shape.hidden,)
        yield f"blk.{i}.attn_q.weight", (shape.heads * head, shape.hidden)
        yield f"blk.{i}.attn_k.weight", (shape.kv_heads * head, shape.hidden)
        yield f"blk.{i}.attn_v.weight", (shape.kv_heads * head, shape.hidden)
        yield f"blk.{i}.attn_output.weight", (shape.hidden, shape.heads * head)
        yield f"blk.{i}.ffn_norm.weight", (shape.hidden,)
        yield f"blk.{i}.ffn_gate.weight", (shape.ffn, shape.hidden)
        yield f"blk.{i}.ffn_up.weight", (shape.ffn, shape.hidden)
        yield f"blk.{i}.ffn_down.weight", (shape.hidden, shape.ffn)


def _copy_tokenizer(source, writer) -> None:
    import gguf

    for key, field in source.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            values = [bytes(field.parts[i]).decode("utf-8") if sub == gguf.GGUFValueType.STRING
                      else field.parts[i].tolist()[0] for i in field.data]
            writer.add_array(key, values)
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_string(key, bytes(field.parts[field.data[0]]).decode("utf-8"))
        elif kind == gguf.GGUFValueType.BOOL:
            writer.add_bool(key, bool(field.parts[field.data[0]][0]))
        else:
            writer.add_uint32(key, int(field.parts[field.data[0]][0]))


def quantize(source: Path, target: Path, ftype: str) -> float:
    """llama.cpp's quantizer on source; the seconds it took."""
    import llama_cpp

    if ftype not in FTYPES:
        raise ValueError(f"unknown type {ftype!r}; one of {', '.join(FTYPES)}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = 2
    started = time.time()
    tmp = str(target) + ".tmp"
    rc = llama_cpp.llama_model_quantize(str(source).encode(), tmp.encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize {ftype} failed ({rc})")
    Path(tmp).rename(target)
    return time.time() - started


def bench_make_model_command(
    out: str = typer.Option(str(Path.home() / "models"), "--out", help="folder for the files"),
    types: str = typer.Option("Q4_K_M,Q8_0", "--types", help=f"comma-separated, of {', '.join(FTYPES)}"),
    layers: int = typer.Option(Shape.layers, help="decoder layers (16: the 1B-class model)"),
    seed: int = typer.Option(0, help="the weights' random seed"),
) -> None:
    """Write the 1B-class random Llama GGUF (F16) and llama.cpp's quantizations of it."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise typer.BadParameter("llama.cpp's quantizer is not installed: make llamacpp") from None
    for path in make_models(Path(out).expanduser(), [t.strip() for t in types.split(",") if t.strip()],
                            Shape(layers=layers), seed):
        typer.echo(f"{path} ({path.stat().st_size / 2**20:.0f} MiB)")


def make_safetensors(out: Path, shape: Shape = Shape(), dtype: str = "bfloat16", seed: int = 0) -> Path:
    """The same shape as a Hugging Face folder (random weights, std 0.02, SmolLM2's tokenizer) in `dtype`: the
    bf16/fp16 checkpoints people download, for the dense, q8_0-at-load and bf16 comparisons."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from batchinfer.engine.loading.loader import default_model_path, model_files_dir
    from batchinfer.settings import get_settings

    folder = out / f"llama-{shape.hidden}h{shape.layers}l-{dtype}"
    if (folder / "model.safetensors").exists():
        return folder
    tokenizer = model_files_dir(default_model_path(), get_settings().model_cache)
    config = LlamaConfig(hidden_size=shape.hidden, intermediate_size=shape.ffn, num_hidden_layers=shape.layers,
                         num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads, vocab_size=49152,
                         max_position_embeddings=shape.context, rms_norm_eps=1e-5,
                         rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, initializer_range=0.02)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((tokenizer / name).read_bytes())
    return folder
