"""The windowed and soft-capped families on the Triton backend (interpreted on CPU) give transformers' greedy
tokens: Mistral (every layer slides) and Gemma 2 (sliding and global layers, capped scores and logits)."""
import pytest

from batchinfer.engine import EngineConfig, LLMEngine
from batchinfer.engine.loading.loader import load_model
from tests.engine.test_model_families import family_prompts, hf_reference, run_engine
from tests.engine.tiny_families import build_family_checkpoint
from tests.triton_attention.conftest import DEVICE


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_triton_backend_runs_windowed_and_softcapped_families_exactly(family, tmp_path):
    folder = build_family_checkpoint(family, tmp_path / family)
    prompts = family_prompts()[2:8]  # 17 to 70 tokens against a window of 16, two sharing a cached prefix
    reference = load_model(str(folder), tmp_path / "cache").hf_model
    reference.config._attn_implementation = "eager"
    want, _ = hf_reference(reference, prompts)
    config = EngineConfig(attention_backend="triton", max_num_seqs=4, max_num_batched_tokens=32,
                          kv_cache_bytes=8 << 20, device=DEVICE)
    engine = LLMEngine.from_pretrained(str(folder), tmp_path / "cache", config)
    assert [r.output_token_ids for r in run_engine(engine, prompts, "triton")] == want
