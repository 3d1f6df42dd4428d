"""EngineConfig validates itself and names the bad field."""
from __future__ import annotations

import pytest

from batchinfer.engine import EngineConfig

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("field,value", [("block_size", 0), ("kv_cache_fraction", 1.5), ("max_num_seqs", 0),
                                         ("max_num_batched_tokens", 0), ("attention_backend", "flash"),
                                         ("dtype", "int8"), ("kv_cache_bytes", -1)])
def test_invalid_field_is_named_in_the_error(field, value):
    with pytest.raises(ValueError, match=f"EngineConfig.{field}"):
        EngineConfig(**{field: value})


def test_byte_budget_wins_over_fraction():
    assert EngineConfig(kv_cache_bytes=1234, kv_cache_fraction=0.5).kv_budget_bytes() == 1234
    assert EngineConfig(kv_cache_fraction=0.01).kv_budget_bytes() > 0


def test_dtype_auto_resolves_to_float32_on_cpu_and_says_why():
    from batchinfer.engine.machine.dtype import cpu_has_native_bf16

    auto = EngineConfig(dtype="auto")
    assert auto.dtype == "float32"  # bf16 changes greedy answers, even where it is native
    why = "bf16 native, but its greedy answers differ from float32's" if cpu_has_native_bf16() else "no avx512_bf16 or amx_bf16"
    assert auto.dtype_note == f"float32 (auto: {why})"
    assert EngineConfig(dtype="bfloat16").dtype_note == "bfloat16 (asked)"
    assert EngineConfig(dtype="bf16").dtype == "bfloat16" and EngineConfig(dtype="fp32").dtype == "float32"
    assert EngineConfig().dtype == "float32"  # the engine's own default stays exact


def test_weight_format_auto_is_the_default_and_dense_off_cpu():
    assert EngineConfig().weight_format == "auto"  # the loader decides on CPU (gguf/load.gguf_choice)
    meta = EngineConfig(device="meta")
    assert meta.weights_note == "dense (auto: meta)"
    assert EngineConfig(weight_format="dense").weights_note == "dense (asked)"


def test_the_description_is_a_record_and_its_notes_are_for_people():
    described = EngineConfig(weight_format="dense").description
    assert (described.dtype, described.weight_format) == ("float32", "dense")
    assert described.metrics() == {"dtype": "float32", "weight_format": "dense"}
    gguf = EngineConfig(weight_format="gguf").description
    assert gguf.metrics() == {"dtype": "float32", "weight_format": "gguf"}
    assert gguf.weights_note == "gguf (asked)" == EngineConfig(weight_format="gguf").weights_note


def test_the_settings_offer_the_values_the_engine_takes():
    from batchinfer.engine import options
    from batchinfer.settings import Settings

    for value in options.WEIGHT_FORMATS:
        assert Settings(weight_format=value).weight_format == value
    for value in options.SETTING_DTYPES:
        assert EngineConfig(dtype=value).dtype in options.DTYPES
    with pytest.raises(ValueError, match="BATCHINFER_ENGINE must be 'batchinfer', 'hf' or 'null'"):
        Settings(engine="vllm")
