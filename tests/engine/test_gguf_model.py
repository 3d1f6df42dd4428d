"""A GGUF loaded in its own blocks (weight_format gguf): what the reader, the config, the tokenizer and the repack
make of the shipped SmolLM2 file against gguf's and transformers' own readings of it; the one-line refusals; and
the model's greedy output checked the vLLM way (check_logprobs_close) against transformers fp32."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

from greedy_closeness import LogitsRecorder, greedy_closeness

from batchinfer.engine import EngineConfig, LLMEngine
from batchinfer.engine.gguf.config import hf_config
from batchinfer.engine.gguf.load import gguf_choice, load_gguf
from batchinfer.engine.gguf.reader import GGUFFile
from batchinfer.engine.loading.light_loader import LightTokenizer
from batchinfer.engine.loading.loader import default_model_path
from batchinfer.engine.quant.kernel import TYPES
from batchinfer.engine.unsupported import UnsupportedGGUF

MAX_NEW_TOKENS = 12  # as conftest.MAX_NEW_TOKENS, the length of hf_reference


def test_the_reader_sees_what_ggufs_reader_sees():
    ours, theirs = GGUFFile(default_model_path()), GGUFReader(default_model_path())
    assert set(ours.metadata) == {k for k in theirs.fields if not k.startswith("GGUF.")}
    field = theirs.fields["tokenizer.ggml.tokens"]
    assert ours.metadata["tokenizer.ggml.tokens"] == [bytes(field.parts[i]).decode() for i in field.data]
    assert ours.metadata["llama.embedding_length"] == 576
    for t in theirs.tensors:
        info = ours.tensors[t.name]
        assert (info.type, info.shape, info.nbytes) == (t.tensor_type.name, tuple(int(d) for d in reversed(t.shape)),
                                                        t.n_bytes)
        assert np.array_equal(ours.raw(t.name), np.asarray(t.data).reshape(-1).view(np.uint8))


def test_config_and_tokenizer_are_transformers_readings_of_the_file(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    path = default_model_path()
    config = hf_config(GGUFFile(path))
    reference = AutoConfig.from_pretrained(str(tmp_path.parent), gguf_file=path)
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "rms_norm_eps", "max_position_embeddings", "vocab_size", "tie_word_embeddings"):
        assert config[key] == getattr(reference, key, None), key
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": reference.rope_parameters["rope_theta"]}
    model = load_gguf(default_model_path(), tmp_path)
    ours, theirs = LightTokenizer(model.folder), AutoTokenizer.from_pretrained(str(tmp_path.parent), gguf_file=path)
    for text in ["Hello world!", "<|im_start|>user\nHi<|im_end|>", "  tabs\tand\n\nnewlines ", "数字 123456 🎉"]:
        assert ours.encode(text) == theirs.encode(text), text
    chat = [{"role": "user", "content": "What is 2+2?"}]
    assert ours.apply_chat_template(chat, add_generation_prompt=True) == \
        theirs.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)


def test_repacked_projections_are_the_checkpoints_rows(tmp_path, loaded_model):
    """llama.cpp permutes q and k rows for its RoPE; the repack restores the checkpoint's order (a wrong order would
    still run, with scrambled attention)."""
    model = load_gguf(default_model_path(), tmp_path)
    attention = loaded_model.hf_model.model.layers[3].self_attn
    want = torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight]).float()
    parts = []
    for w in model.quant["layers.3.qkv_proj"].parts:
        out = torch.empty(w.n, w.k)
        w.kernel.lib.dequant_packed(TYPES[w.qtype], w.data.ctypes.data, w.n, w.k, out.data_ptr())
        parts.append(out)
    assert torch.equal(torch.cat(parts), want)


def _tiny_gguf(path, arch: str = "llama", kind=GGMLQuantizationType.Q4_K):
    """A 2-layer GGUF with SmolLM2's tokenizer metadata and one tensor (blk.1.attn_v) of block type `kind`."""
    from benchmarks.gguf_model import _copy_tokenizer

    writer = GGUFWriter(str(path), arch)
    for key, value in (("block_count", 2), ("context_length", 512), ("embedding_length", 256),
                       ("feed_forward_length", 512), ("attention.head_count", 4), ("attention.head_count_kv", 2)):
        writer.add_uint32(f"{arch}.{key}", value)
    _copy_tokenizer(GGUFReader(default_model_path()), writer)
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (49152, 256), "output_norm.weight": (256,)}
    for i in range(2):
        shapes |= {f"blk.{i}.attn_norm.weight": (256,), f"blk.{i}.ffn_norm.weight": (256,),
                   f"blk.{i}.attn_q.weight": (256, 256), f"blk.{i}.attn_k.weight": (128, 256),
                   f"blk.{i}.attn_v.weight": (128, 256), f"blk.{i}.attn_output.weight": (256, 256),
                   f"blk.{i}.ffn_gate.weight": (512, 256), f"blk.{i}.ffn_up.weight": (512, 256),
                   f"blk.{i}.ffn_down.weight": (256, 512)}
    for name, shape in shapes.items():
        if name == "blk.1.attn_v.weight" and kind != GGMLQuantizationType.F32:
            size = {GGMLQuantizationType.Q4_K: 144, GGMLQuantizationType.IQ4_NL: 18}[kind]
            per = 256 if kind == GGMLQuantizationType.Q4_K else 32
            writer.add_tensor(name, rng.integers(0, 16, size=(shape[0], shape[1] // per * size), dtype=np.uint8),
                              raw_dtype=kind)
        else:
            writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_an_unknown_block_type_is_refused_in_one_line_naming_the_tensor(tmp_path):
    path = _tiny_gguf(tmp_path / "iq.gguf", kind=GGMLQuantizationType.IQ4_NL)
    with pytest.raises(UnsupportedGGUF) as err:
        gguf_choice(path, "auto", str(tmp_path))
    message = str(err.value)
    assert "blk.1.attn_v.weight is IQ4_NL" in message and "\n" not in message


def test_an_unknown_architecture_is_refused_in_one_line(tmp_path):
    path = _tiny_gguf(tmp_path / "arch.gguf", arch="mamba")
    with pytest.raises(UnsupportedGGUF, match="architecture 'mamba' is not supported"):
        gguf_choice(path, "gguf", str(tmp_path))


def test_float_projections_run_dense_under_auto_and_as_q8_0_blocks_when_gguf_is_asked(tmp_path):
    path = _tiny_gguf(tmp_path / "f32.gguf", kind=GGMLQuantizationType.F32)
    assert gguf_choice(path, "auto", str(tmp_path))[0] == "dense"
    model = load_gguf(path, tmp_path)
    assert {w.qtype for s in model.quant.values() for w in s.parts} == {"Q8_0"}


def test_gguf_greedy_is_close_to_transformers_fp32(gguf_model, loaded_model, prompt_token_ids, hf_reference):
    """int8 activations are llama.cpp's arithmetic, not transformers' (benchmarks/fidelity.py measures agreement
    with llama.cpp); against fp32 they must pass vLLM's closeness rule on every prompt."""
    engine = LLMEngine(gguf_model, EngineConfig(max_num_seqs=32))
    engine.runner.sampler = LogitsRecorder()
    exact, problems = greedy_closeness(engine, loaded_model, prompt_token_ids, hf_reference, MAX_NEW_TOKENS)
    print(f"\ngguf (int8 activations) exact match with transformers fp32: {exact}/{len(prompt_token_ids)} prompts")
    assert not problems, problems


def test_a_first_load_repacks_while_another_process_still_writes_the_small_files(tmp_path, model_cache):
    """On a first run the CLI converts the tokenizer under the small files' lock; the engine process repacks the
    weights beside the folder meanwhile, not after, and moves them in once the small files are there."""
    import fcntl
    import shutil
    import threading
    import time
    from pathlib import Path

    from batchinfer.engine.gguf.files import cache_folder

    cache = tmp_path / "cache"
    if (Path(model_cache) / "kernels").exists():  # this machine's kernels, not a gcc run per test
        shutil.copytree(Path(model_cache) / "kernels", cache / "kernels")
    folder = cache_folder(Path(default_model_path()), cache)
    folder.parent.mkdir(parents=True)
    loaded: list = []
    with open(folder.parent / f".{folder.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process converting the tokenizer
        load = threading.Thread(target=lambda: loaded.append(load_gguf(default_model_path(), cache)))
        load.start()
        beside = folder.parent / f".{folder.name}.packed-{os.getpid()}"
        deadline = time.time() + 60
        while not beside.exists() and time.time() < deadline and load.is_alive():
            time.sleep(0.05)
        assert beside.exists() and not folder.exists()  # repacked, whole (renamed into place), the lock still held
        assert load.is_alive()  # now waiting for the small files
    load.join(300)
    assert loaded and (folder / "weights.packed").exists() and (folder / "config.json").exists()
    assert not beside.exists() and loaded[0].folder == folder
