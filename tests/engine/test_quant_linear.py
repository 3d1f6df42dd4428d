"""The quantized linear (layers/quant_linear.py): the C kernel against the torch reference, GGUF's block
bytes read as gguf's own dequantize reads them, and every row's result independent of the batch."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from batchinfer.engine import EngineConfig
from batchinfer.engine.layers import quant_linear as ql
from batchinfer.engine.layers.quant_build import QuantKernelUnavailable, cpu_supported, load_kernel
from batchinfer.engine.native_build import avx512_supported

pytestmark = [pytest.mark.fast,
              pytest.mark.skipif(not cpu_supported(), reason="the quantized kernel needs AVX2, FMA and F16C")]


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    return load_kernel(str(tmp_path_factory.mktemp("kernels")))


def random_q4_1(n: int, k: int, seed: int = 0) -> ql.QuantWeight:
    rng = np.random.default_rng(seed)
    d = (rng.random((n, k // 32)) * 0.02).astype(np.float16)
    m = (-rng.random((n, k // 32)) * 0.1).astype(np.float16)
    return ql.pack_q4_1(rng.integers(0, 16, (n, k), dtype=np.uint8), d, m)


def weights(kernel) -> dict[str, ql.QuantWeight]:
    out = {"q4_1": random_q4_1(96, 160), "q8_0": ql.quantize_q8_0(torch.randn(64, 96, generator=torch.Generator().manual_seed(1)))}
    for w in out.values():
        w.lib = kernel
    return out


@pytest.mark.parametrize("fmt", ql.FORMATS)
def test_kernel_equals_linear_over_the_dequantized_matrix(kernel, fmt):
    w = weights(kernel)[fmt]
    x = torch.randn(13, w.shape[1], generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(w(x), ql.reference(x, w), rtol=1e-5, atol=1e-4)
    assert w(x.bfloat16()).dtype == torch.bfloat16  # a bf16 engine gets its dtype back


@pytest.mark.parametrize("fmt", ql.FORMATS)
def test_each_row_is_bitwise_the_same_whatever_the_row_count(kernel, fmt):
    w = weights(kernel)[fmt]
    x = torch.randn(40, w.shape[1], generator=torch.Generator().manual_seed(3))
    alone = torch.cat([w(x[i:i + 1]) for i in range(40)])
    for rows in range(1, 41):
        assert torch.equal(w(x[:rows]), alone[:rows]), f"{rows} rows"
    assert torch.equal(w(x[7:19]), alone[7:19])  # and whatever rows sit beside it


@pytest.mark.skipif(not avx512_supported(), reason="this CPU has no AVX-512: only the AVX2 build runs here")
@pytest.mark.parametrize("fmt", ql.FORMATS)
def test_the_avx512_build_gives_the_avx2_builds_bits(tmp_path_factory, fmt):
    # Workers on AVX2 and AVX-512 CPUs must answer alike: every row count up to 40 covers both paths (<= 8 rows
    # decode in registers, more go through the scratch panels) and every row tile's tail; K as the model's, and
    # 10 or 7 panels, so that each thread's run ends in every panel group's tail (1-4 panels at once).
    cache = str(tmp_path_factory.mktemp("isa"))
    w = random_q4_1(160, 576, seed=5) if fmt == "q4_1" else ql.quantize_q8_0(torch.randn(112, 1536))
    x = torch.randn(40, w.shape[1], generator=torch.Generator().manual_seed(6))
    avx2, avx512 = (dataclasses.replace(w, lib=load_kernel(cache, isa)) for isa in ("avx2", "avx512"))
    for rows in range(1, 41):
        assert torch.equal(avx2(x[:rows]), avx512(x[:rows])), f"{rows} rows"


@pytest.mark.skipif(not avx512_supported(), reason="this CPU has no AVX-512: only the AVX2 build runs here")
def test_a_compiler_without_avx512_falls_back_to_the_avx2_build(tmp_path, monkeypatch):
    cc = tmp_path / "cc"  # a real compiler that refuses -mavx512f, as an old gcc would
    cc.write_text('#!/bin/sh\ncase "$*" in *-mavx512f*) echo "unknown option" >&2; exit 1;; esac\nexec gcc "$@"\n')
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    lib = load_kernel(str(tmp_path / "cache"))
    assert Path(lib._name).name.startswith("quant_kernel-")  # the AVX2 build, not quant_kernel_avx512-
    with pytest.raises(QuantKernelUnavailable, match="AVX-512"):  # asked for by name, it says why
        load_kernel(str(tmp_path / "cache"), "avx512")


@pytest.mark.parametrize("kind,qtype", [("q4_1", "Q4_1"), ("q8_0", "Q8_0")])
def test_gguf_block_bytes_decode_as_gguf_dequantizes_them(kind, qtype):
    import gguf

    n, k = 32, 64
    rng = np.random.default_rng(4)
    dense = rng.standard_normal((n, k)).astype(np.float32)
    qt = gguf.GGMLQuantizationType[qtype]
    raw = gguf.quantize(dense, qt)  # [n, k / 32 * block bytes], as the file stores it
    packed = ql.from_gguf_blocks(kind, raw, n, k)
    assert packed.format == kind and packed.shape == (n, k)
    assert torch.equal(ql.dequantize(packed), torch.from_numpy(gguf.dequantize(raw, qt)))


def test_weight_format_is_checked_by_name():
    with pytest.raises(ValueError, match="weight_format"):
        EngineConfig(weight_format="q4_k")
    assert EngineConfig(weight_format="auto", device="meta").weight_format == "dense"  # quantized runs on CPU only
