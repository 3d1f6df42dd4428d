"""activation_format "int8" (layers/w4a8_linear.py): Q4_1 weights times activations quantized per row and per
32-block. The kernel against the same quantized arithmetic in float64 (tight: only fp32 rounding of the per-block
combine differs), against F.linear over the de-quantized weights (loose: int8 activations lose up to half a step,
amax / 254, per element), bitwise batch invariance, and the real model's greedy output against transformers
fp32 with the rule the gguf weights pass (greedy_closeness.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import MAX_NEW_TOKENS, model_cache_dir
from greedy_closeness import LogitsRecorder, greedy_closeness

from tests.engine import invariance_cases

from batchinfer.engine import EngineConfig, LLMEngine
from batchinfer.engine.layers import quant_linear as ql
from batchinfer.engine.layers import w4a8_linear as a8
from batchinfer.engine.layers.quant_build import cpu_supported, load_kernel, load_w4a8_kernel
from batchinfer.engine.loader import load_model_light
pytestmark = pytest.mark.skipif(not cpu_supported(), reason="the quantized kernels need AVX2, FMA and F16C")


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("kernels"))
    return load_kernel(cache), load_w4a8_kernel(cache)


def q4_1_weight(libs, n: int, k: int, seed: int = 0) -> ql.QuantWeight:
    rng = np.random.default_rng(seed)
    d = (rng.random((n, k // 32)) * 0.02).astype(np.float16)
    m = (-rng.random((n, k // 32)) * 0.1).astype(np.float16)
    w = ql.pack_q4_1(rng.integers(0, 16, (n, k), dtype=np.uint8), d, m)
    w.lib = libs[0]
    return a8.attach({"w": w}, libs[1])["w"]


def activations(rows: int, k: int, seed: int = 1) -> torch.Tensor:
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(seed))
    x[0, :32] = 0  # an all-zero block: dx = 0, qx = 0
    x[-1, 5] = 40.0  # an outlier: its block's other elements round to few steps
    return x


@pytest.mark.fast
def test_rows_quantize_as_ggml_q8_1(libs):
    x = activations(5, 96)
    qx, scales = torch.empty(5, 96, dtype=torch.int8), torch.empty(2, 5, 3)
    libs[1].q8_rows(x.data_ptr(), 5, 96, qx.data_ptr(), scales[0].data_ptr(), scales[1].data_ptr())
    want_q, want_dx, want_sx = a8.quantize_rows(x)
    assert torch.equal(qx.long(), want_q) and torch.equal(scales[0], want_dx)
    assert torch.equal(scales[1], want_dx * want_sx.float())
    assert qx.abs().max() == 127 and torch.equal(qx[0, :32], torch.zeros(32, dtype=torch.int8))


@pytest.mark.fast
@pytest.mark.parametrize("n,k,rows", [(96, 160, 13), (48, 576, 1), (32, 64, 37)])
def test_kernel_equals_the_quantized_arithmetic_in_float64(libs, n, k, rows):
    w = q4_1_weight(libs, n, k)
    x = activations(rows, k)
    want = a8.emulate(x, w)
    torch.testing.assert_close(w(x).double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.fast
def test_kernel_is_near_the_fp32_product_over_the_dequantized_weights(libs):
    # per element |x - dx qx| <= dx / 2 = amax / 254: over K = 576 random terms the sum's relative error is ~1%
    w = q4_1_weight(libs, 96, 576)
    x = torch.randn(16, 576, generator=torch.Generator().manual_seed(5))
    ref = ql.reference(x, w)
    assert (w(x) - ref).norm() / ref.norm() < 0.02


@pytest.mark.fast
def test_each_row_is_bitwise_the_same_whatever_its_batch(libs):
    w = q4_1_weight(libs, 96, 160)
    x = activations(37, 160, seed=6)
    alone = torch.cat([w(x[i:i + 1]) for i in range(37)])
    for rows in (1, 3, 16, 37):
        assert torch.equal(w(x[:rows]), alone[:rows]), f"{rows} rows"
    assert torch.equal(w(x[5:21]), alone[5:21])  # rows in other tiles than when they came first


@pytest.mark.fast
def test_attach_leaves_q8_0_and_the_given_weights_alone(libs):
    q4 = ql.pack_q4_1(np.zeros((16, 32), np.uint8), np.ones((16, 1), np.float16), np.zeros((16, 1), np.float16))
    q8 = ql.quantize_q8_0(torch.randn(16, 32))
    out = a8.attach({"a": q4, "b": q8}, libs[1])
    assert out["a"].a8 is not None and q4.a8 is None and out["b"] is q8 and out["a"].qs is q4.qs


@pytest.mark.fast
def test_config_refuses_int8_activations_it_cannot_run():
    with pytest.raises(ValueError, match="activation_format must be one of"):
        EngineConfig(activation_format="int4")
    with pytest.raises(ValueError, match="activation_format runs on CPU only"):
        EngineConfig(activation_format="int8", device="meta")
    with pytest.raises(ValueError, match="activation_format needs weight_format gguf"):
        EngineConfig(activation_format="int8", weight_format="dense")
    assert EngineConfig().activation_format == "float32"
    assert EngineConfig(activation_format="int8").weight_format == "auto"


def test_an_auto_format_that_loaded_dense_weights_is_refused():
    loaded = load_model_light(None, model_cache_dir(), torch.float32, "dense")
    with pytest.raises(ValueError, match="needs weight_format gguf, but the loaded model holds 'dense'"):
        LLMEngine(loaded, EngineConfig(activation_format="int8"))


def test_int8_activations_greedy_is_close_to_transformers_fp32(loaded_model, prompt_token_ids, hf_reference):
    loaded = load_model_light(None, model_cache_dir(), torch.float32, "gguf")
    engine = LLMEngine(loaded, EngineConfig(max_num_seqs=32, activation_format="int8", cache_dir=model_cache_dir()))
    assert engine.weights_note.endswith(", activations int8")
    assert engine.runner.model.quant["layers.0.down_proj"].a8 is not None
    assert engine.runner.model.quant["lm_head"].a8 is None  # the tied Q8_0 head keeps fp32 activations
    assert loaded.quant is not None and loaded.quant["layers.0.down_proj"].a8 is None
    engine.runner.sampler = LogitsRecorder()
    exact, problems = greedy_closeness(engine, loaded_model, prompt_token_ids, hf_reference, MAX_NEW_TOKENS)
    print(f"\nint8 activations, exact match with transformers fp32: {exact}/{len(prompt_token_ids)} prompts")
    assert not problems, problems


def test_the_engine_with_int8_activations_is_batch_invariant():
    """test_batch_invariance.py's arrangements (a batch of 64, reverse order, prefix cache cold and warm,
    preemption) with int8 activations: every request bitwise its run alone."""
    found = invariance_cases.arrangements(invariance_cases.load("gguf"), "float32", activations="int8")
    assert found["preemptions"]["count"] > 0
    assert set(invariance_cases.report(found).values()) == {"24/24 bitwise (tokens 24/24)"}, invariance_cases.report(found)
