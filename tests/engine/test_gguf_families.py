"""GGUF files of every family, in their own blocks (weight_format gguf): each tiny checkpoint written as llama.cpp's
converter writes it (gguf_writer.py), the writer pinned by transformers' own GGUF reader, the config the metadata
gives against the checkpoint's, the tokenizer against transformers', and the engine on the Q8_0 file against
transformers fp32 on the checkpoint: vLLM's check_logprobs_close rule on greedy output and the median logits
cosine over every prompt position. A file written wrong on purpose (no q/k permutation, Gemma's norm offset twice,
experts out of order, Phi-3's gate and up swapped) fails that check."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType

from batchinfer.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from batchinfer.engine.gguf.config import hf_config
from batchinfer.engine.gguf.reader import GGUFFile
from batchinfer.engine.gguf.tokenizer import tokenizer_metadata, write_tokenizer
from batchinfer.engine.layers.rope import inverse_frequencies
from batchinfer.engine.loading.light_loader import LightTokenizer
from batchinfer.engine.loading.loader import load_model
from batchinfer.engine.models import model_spec
from batchinfer.engine.quant.kernel import supported
from batchinfer.engine.unsupported import UnsupportedGGUF
from tests.engine.gguf_writer import ARCH, GGUF_OVERRIDES, write_gguf, write_vocab_only
from tests.engine.test_model_families import MAX_NEW_TOKENS, family_prompts, hf_reference, record_logprobs, run_engine
from tests.engine.tiny_families import build_family_checkpoint

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "qwen3-moe", "gemma2", "gemma3", "phi3"]
ROPE_VARIANTS = ["llama-linear", "llama-yarn", "llama3"]
# transformers builds these from a GGUF's config (it maps no head_dim for qwen3, no expert size for qwen3moe, and
# Phi-3 gets a pad id outside the tiny vocabulary): the others are checked by its tensor reader alone
FROM_PRETRAINED = {"llama", "mistral", "qwen2", "gemma2", "gemma3"}
MEDIAN_COSINE = 0.99  # right mappings: >= 0.998 (median over positions); any mistake below: <= 0.81
needs_kernel = pytest.mark.skipif(not supported(), reason="the integer kernel needs AVX2, FMA and F16C")


def checkpoint_and_gguf(family: str, tmp_path, projections=GGMLQuantizationType.Q8_0, mistake: str | None = None):
    folder = build_family_checkpoint(family, tmp_path / family, **GGUF_OVERRIDES.get(family, {}))
    tag = mistake or projections.name
    return folder, write_gguf(folder, tmp_path / f"{family}-{tag}.gguf", family, projections, mistake)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_writer_writes_what_transformers_reads_back_as_the_checkpoint(family, tmp_path):
    """transformers undoes llama.cpp's conventions (q/k permutation, Gemma's 1 + w, stacked experts) its own way;
    reading the F32 file back must give the checkpoint's tensors."""
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, path = checkpoint_and_gguf(family, tmp_path, GGMLQuantizationType.F32)
    want = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    if family in FROM_PRETRAINED:
        got = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32).state_dict()
    else:
        got = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=want)["tensors"]
    tied = want.config.tie_word_embeddings
    for name, tensor in want.state_dict().items():
        if name == "lm_head.weight" and tied and name not in got:
            continue
        read = torch.as_tensor(got[name]).float().reshape(tensor.shape)
        assert torch.allclose(read, tensor, rtol=0, atol=1e-6), name  # Gemma's norms: (w + 1) - 1 in float32


@pytest.mark.parametrize("family", FAMILIES + ROPE_VARIANTS + ["mistral-no-window"])
def test_config_from_the_metadata_runs_as_the_checkpoints_config(family, tmp_path):
    name = family.removesuffix("-no-window")
    overrides = GGUF_OVERRIDES.get(name, {}) | ({"sliding_window": None} if family != name else {})
    folder = build_family_checkpoint(name, tmp_path / name, **overrides)
    path = write_gguf(folder, tmp_path / f"{name}.gguf", name)
    ours = SimpleNamespace(**hf_config(GGUFFile(path)))
    theirs = SimpleNamespace(**json.loads((folder / "config.json").read_text()))
    spec, want = model_spec(ours), model_spec(theirs)
    assert spec.architecture == want.architecture or (family == "mistral-no-window" and spec.architecture == "LlamaForCausalLM")
    for field in ("num_layers", "num_q_heads", "num_kv_heads", "head_dim", "hidden_size", "layer_windows", "layer_rope",
                  "activation", "qkv_bias", "qk_norm", "sandwich_norms", "embed_scale", "attn_softcap", "final_softcap",
                  "moe"):
        assert getattr(spec, field) == getattr(want, field), field
    assert spec.eps == pytest.approx(want.eps, rel=1e-6) and spec.scale == pytest.approx(want.scale)
    for key, params in want.ropes.items():
        got_freq, got_factor = inverse_frequencies(spec.ropes[key], ours, spec.head_dim)
        want_freq, want_factor = inverse_frequencies(params, theirs, want.head_dim)
        assert torch.allclose(got_freq, want_freq, rtol=1e-6) and got_factor == pytest.approx(want_factor), key
    for key in ("vocab_size", "intermediate_size", "max_position_embeddings", "tie_word_embeddings", "bos_token_id",
                "eos_token_id", "moe_intermediate_size"):
        assert getattr(ours, key, None) == getattr(theirs, key, None), key


def closeness(engine: LLMEngine, reference, prompts) -> tuple[list[str], float]:
    """(the prompts that break vLLM's check_logprobs_close rule with top 5, the median logits cosine over every
    position of three prompts)."""
    want_tokens, want_top = hf_reference(reference, prompts, top=5)
    top = record_logprobs(engine, top=5)
    problems = []
    for i, res in enumerate(run_engine(engine, prompts, "g")):
        first = next((s for s, (a, b) in enumerate(zip(res.output_token_ids, want_tokens[i])) if a != b), None)
        if first is not None and (res.output_token_ids[first] not in want_top[i][first]
                                  or want_tokens[i][first] not in top[f"g-{i}"][first]):
            problems.append(res.request_id)
    return problems, _median_cosine(engine, reference, prompts[3:6])


def _median_cosine(engine: LLMEngine, reference, prompts) -> float:
    seen: dict[str, torch.Tensor] = {}
    sample = engine.runner.sampler.sample

    def observed(logits, request_ids, params):
        seen.update(zip(request_ids, logits.float()))
        return sample(logits, request_ids, params)

    engine.runner.sampler.sample = observed  # type: ignore[method-assign]
    cosines = []
    for j, ids in enumerate(prompts):
        engine.generate([GenerationRequest(f"c{j}-{n}", ids[:n], SamplingParams(max_tokens=1, temperature=0))
                         for n in range(1, len(ids) + 1)])
        with torch.inference_mode():
            logits = reference(torch.tensor([ids])).logits[0].float()
        cosines += [float(torch.cosine_similarity(seen[f"c{j}-{n}"], logits[n - 1], dim=0)) for n in range(1, len(ids) + 1)]
    return float(torch.tensor(cosines).median())


def gguf_engine(path, tmp_path) -> LLMEngine:
    config = EngineConfig(dtype="float32", weight_format="gguf", max_num_seqs=4, max_num_batched_tokens=32,
                          kv_cache_bytes=8 << 20)
    return LLMEngine.from_pretrained(str(path), tmp_path / "cache", config)


def reference_model(folder, tmp_path):
    model = load_model(str(folder), tmp_path / "cache").hf_model
    model.config._attn_implementation = "eager"
    return model


@needs_kernel
@pytest.mark.parametrize("family", FAMILIES + ROPE_VARIANTS)
def test_engine_on_the_q8_0_gguf_is_close_to_transformers_fp32(family, tmp_path):
    folder, path = checkpoint_and_gguf(family, tmp_path)
    engine = gguf_engine(path, tmp_path)
    assert engine.config.weight_format == "gguf"
    if family == "qwen3-moe":  # the experts run in their blocks, one packed weight per expert
        assert "layers.0.experts.3.down_proj" in engine.runner.model.quant and engine.runner.model.layers[0].experts_down is None
    problems, median = closeness(engine, reference_model(folder, tmp_path), family_prompts())
    print(f"{family}: median logits cosine {median:.4f}, {MAX_NEW_TOKENS} greedy tokens")
    assert not problems, problems
    assert median >= MEDIAN_COSINE


@needs_kernel
@pytest.mark.parametrize(("family", "mistake"), [("llama", "no_permute"), ("gemma2", "double_norm_offset"),
                                                 ("qwen3-moe", "expert_order"), ("phi3", "swap_gate_up")])
def test_a_wrongly_mapped_file_fails_the_closeness_check(family, mistake, tmp_path):
    folder, path = checkpoint_and_gguf(family, tmp_path, mistake=mistake)
    problems, median = closeness(gguf_engine(path, tmp_path), reference_model(folder, tmp_path), family_prompts())
    print(f"{family} with {mistake}: median logits cosine {median:.4f}, {len(problems)} prompts off the greedy rule")
    assert median < MEDIAN_COSINE


@pytest.mark.parametrize("arch", sorted(set(ARCH.values())))
def test_a_byte_level_vocabulary_encodes_as_the_checkpoints_tokenizer(arch, tmp_path):
    from transformers import AutoTokenizer

    folder = build_family_checkpoint("llama", tmp_path / "tiny")
    path = write_vocab_only(tmp_path / f"{arch}.gguf", arch, "gpt2", folder)
    (tmp_path / "files").mkdir()
    write_tokenizer(GGUFFile(path), tmp_path / "files")
    ours, theirs = LightTokenizer(tmp_path / "files"), AutoTokenizer.from_pretrained(folder)
    for text in ["Hello world!", "<|im_start|>user\nHi<|im_end|>", "  tabs\tand\n\nnewlines ", "数字 123 🎉"]:
        assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False), text
    chat = [{"role": "user", "content": "What is 2+2?"}]
    assert ours.apply_chat_template(chat, add_generation_prompt=True) == \
        theirs.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)


@pytest.mark.parametrize(("arch", "model", "add_bos"), [("llama", "llama", None), ("gemma2", "llama", None),
                                                       ("gemma3", "llama", None), ("phi3", "llama", None),
                                                       ("llama", "llama", False), ("qwen2", "gpt2", True)])
def test_the_tokenizer_from_metadata_encodes_as_transformers_reads_the_file(arch, model, add_bos, tmp_path):
    """Sentencepiece vocabularies (Llama 2, Gemma, Phi-3: their builders differ) and a byte-level one; BOS where the
    file adds it (sentencepiece's default), which tokenizer.json must carry for the engine's tokenizer."""
    from transformers import AutoTokenizer

    folder = build_family_checkpoint("llama", tmp_path / "tiny") if model == "gpt2" else None
    path = write_vocab_only(tmp_path / f"{arch}.gguf", arch, model, folder, add_bos)
    out = tmp_path / "files"
    out.mkdir()
    write_tokenizer(GGUFFile(path), out)
    ours, theirs = LightTokenizer(out), AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in ["hello world", " hello  the world", "hi\nthere"]:
        assert ours.encode(text) == theirs.encode(text), text
        assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False), text
        assert ours.decode(ours.encode(text, add_special_tokens=False)) == theirs.decode(theirs.encode(text, add_special_tokens=False))


@pytest.mark.parametrize(("arch", "model", "add_bos"), [("llama", "llama", None), ("gemma3", "llama", None),
                                                       ("llama", "llama", False), ("qwen2", "gpt2", True),
                                                       ("smollm2", "", None)])
def test_the_tokenizer_metadata_is_what_transformers_reads(arch, model, add_bos, tmp_path):
    """write_tokenizer reads the metadata itself (transformers' reader imports torch) and hands it to transformers'
    converter: the same dictionaries as transformers' get_gguf_tokenizer, on vocab-only files and SmolLM2's."""
    from transformers.integrations.gguf import get_gguf_tokenizer
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING

    from batchinfer.engine.loading.loader import default_model_path

    if arch == "smollm2":
        path = default_model_path()
    else:
        folder = build_family_checkpoint("llama", tmp_path / "tiny") if model == "gpt2" else None
        path = write_vocab_only(tmp_path / f"{arch}.gguf", arch, model, folder, add_bos)
    plain = lambda d: {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in d.items()}  # noqa: E731
    ours, theirs = tokenizer_metadata(GGUFFile(path), GGUF_TOKENIZER_MAPPING), get_gguf_tokenizer(str(path))
    assert ours[0] == theirs[0]
    assert plain(ours[1]) == plain(theirs[1])
    assert ours[2] == theirs[2]


def test_a_phi3_longrope_file_is_refused_in_one_line(tmp_path):
    folder = build_family_checkpoint("phi3", tmp_path / "phi3")
    path = write_gguf(folder, tmp_path / "phi3.gguf", "phi3", extra={"rope_factors_long.weight": np.ones(8, np.float32)})
    with pytest.raises(UnsupportedGGUF, match=r"rope_factors_long\.weight") as err:
        hf_config(GGUFFile(path))
    assert "\n" not in str(err.value)


@needs_kernel
@pytest.mark.parametrize("projections", [GGMLQuantizationType.Q8_0, GGMLQuantizationType.F16])
def test_each_expert_is_packed_from_its_own_rows_of_the_experts_tensor(projections, tmp_path):
    """Quantized experts keep the file's blocks; float ones (an F16 file) become Q8_0 one expert at a time."""
    from gguf import quants
    from safetensors.numpy import load_file

    from batchinfer.engine.gguf.load import load_gguf
    from batchinfer.engine.quant.kernel import TYPES

    folder, path = checkpoint_and_gguf("qwen3-moe", tmp_path, projections)
    model = load_gguf(path, tmp_path / "cache")
    checkpoint = load_file(str(folder / "model.safetensors"))
    for e in range(4):
        for name, hf in (("gate_up_proj", ("gate_proj", "up_proj")), ("down_proj", ("down_proj",))):
            parts = model.quant[f"layers.1.experts.{e}.{name}"].parts
            for w, hf_name in zip(parts, hf):
                got = torch.empty(w.n, w.k)
                w.kernel.lib.dequant_packed(TYPES[w.qtype], w.data.ctypes.data, w.n, w.k, got.data_ptr())
                want = checkpoint[f"model.layers.1.mlp.experts.{e}.{hf_name}.weight"]
                if projections == GGMLQuantizationType.F16:
                    want = want.astype(np.float16).astype(np.float32)
                q8 = quants.dequantize(quants.quantize(want, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0)
                assert w.qtype == "Q8_0" and torch.equal(got, torch.from_numpy(q8)), (e, hf_name)
