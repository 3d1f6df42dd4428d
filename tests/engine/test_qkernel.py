"""The integer kernel (engine/quant/) on every GGUF block type it reads, on small random tensors:
its de-quantization against gguf's numpy dequantize bit for bit, the packed layout losing nothing, every path
(scalar reference, AVX2, AVX-512 VNNI, its vpmulld twin, AMX) giving the same bits at every row count, and its dot
products against a float64 reference of the quantized arithmetic."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from batchinfer.engine.quant.kernel import BLOCK_BYTES, REFERENCE, SUPER, TYPES, load_kernel, load_packer
from batchinfer.engine.quant.packed import PackedWeight, StackedWeight, dequantize_rows, packed_size, quantize, repack
from benchmarks.support.qblocks import packed, random_blocks

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    return load_kernel(str(tmp_path_factory.mktemp("qkernel")))


def emulate(kernel, weight: PackedWeight, raw: np.ndarray, x: torch.Tensor) -> torch.Tensor:
    """The kernel's arithmetic in float64: the same int8 activations, per block (or super-block) sum(w q) d_x.
    Q4_1/Q5_1 take their min as llama.cpp does, m_w * s_x with s_x the Q8_1 block's fp16 d * sum(q)."""
    acts = quantize(kernel, weight.qtype, x)
    n, k, sb = weight.n, weight.k, SUPER[weight.qtype]
    w = torch.from_numpy(quants.dequantize(raw, GGMLQuantizationType[weight.qtype]).reshape(n, k)).double()
    q = acts.q[:acts.rows].double().reshape(acts.rows, -1, sb)
    if weight.qtype not in ("Q4_1", "Q5_1"):
        return torch.einsum("mbk,nbk,mb->mn", q, w.reshape(n, -1, sb), acts.d.double())
    blocks = raw.reshape(n, -1, BLOCK_BYTES[weight.qtype])
    d = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64))
    m = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64))
    u = torch.round((w.reshape(n, -1, sb) - m[..., None]) / d[..., None])
    return (torch.einsum("mbk,nbk,nb,mb->mn", q, u, d, acts.d.double())
            + torch.einsum("nb,mb->mn", m, acts.s.double()))


@pytest.mark.parametrize("qtype", list(TYPES))
def test_dequantized_rows_are_ggufs_bit_for_bit(kernel, qtype):
    n, k = 20, 512
    raw = random_blocks(qtype, n, k)
    want = quants.dequantize(raw, GGMLQuantizationType[qtype]).reshape(n, k)
    got = dequantize_rows(kernel, qtype, raw, n, k, torch.tensor([3, 0, 19, 3]))
    assert np.array_equal(got.numpy().view(np.uint32), want[[3, 0, 19, 3]].view(np.uint32))


@pytest.mark.parametrize("qtype", list(TYPES))
def test_the_packed_layout_keeps_every_weight_and_its_row_order(kernel, qtype):
    n, k = 40, 512  # 40: the last panel of 16 is half padding
    raw = random_blocks(qtype, n, k, seed=1)
    rows = np.random.default_rng(2).permutation(n)
    out = np.zeros(packed_size(kernel, qtype, n, k), dtype=np.uint8)
    repack(kernel, qtype, raw, n, k, out, rows)
    back = torch.empty(n, k)
    kernel.lib.dequant_packed(TYPES[qtype], out.ctypes.data, n, k, back.data_ptr())
    want = quants.dequantize(raw, GGMLQuantizationType[qtype]).reshape(n, k)[rows]
    assert np.array_equal(back.numpy(), want)


@pytest.mark.parametrize("qtype", list(TYPES))
def test_packed_blocks_take_the_files_own_bytes(kernel, qtype):
    n, k = 48, 1024  # whole panels: the model cache is no larger than the GGUF
    assert packed_size(kernel, qtype, n, k) == n * k // SUPER[qtype] * BLOCK_BYTES[qtype]


@pytest.mark.parametrize("qtype", list(TYPES))
def test_every_path_and_row_count_gives_the_same_bits(kernel, qtype):
    n, k = 40, 512
    raw = random_blocks(qtype, n, k, seed=3)
    weight = packed(kernel, qtype, raw, n, k)
    rows = 300  # past one AMX call's 256 rows
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(4))
    acts = quantize(kernel, qtype, x)

    def gemm(path: int, rows: int) -> torch.Tensor:
        y = torch.full((rows, n + 3), float("nan"))  # rows 3 wider than n: ldy != n, and nothing past n written
        kernel.lib.gemm(TYPES[qtype], acts.q.data_ptr(), acts.d.data_ptr(), acts.s.data_ptr(), acts.bsum.data_ptr(),
                        rows, k, weight.data.ctypes.data, n, y.data_ptr(), n + 3, path, 2)
        assert torch.isnan(y[:, n:]).all()
        return y[:, :n]

    outs = {path: gemm(path, rows) for path in kernel.paths}
    for path, y in outs.items():
        assert torch.equal(y, outs[REFERENCE]), f"path {path} differs from the scalar reference"
        for few in range(1, 8):  # each count a row tile's rest can take (the AVX2 path's tiles are 6 rows)
            assert torch.equal(gemm(path, few), outs[REFERENCE][:few]), f"path {path}, {few} rows"
    for rows in (1, 2, 5, 15, 16, 17, 23):  # a row's result whatever rows share its call (and whichever path runs them)
        assert torch.equal(weight(x[:rows]), outs[kernel.path][:rows])
    assert torch.equal(weight(x[20:23]), outs[kernel.path][20:23])
    assert torch.equal(weight(x[250:290]), outs[kernel.path][250:290])  # decoded a chunk at a time
    assert torch.equal(weight(x[100:245]), outs[kernel.path][100:245])  # a range decoded whole


@pytest.mark.parametrize("qtype", list(TYPES))
def test_dot_products_match_a_float64_reference_of_the_quantized_arithmetic(kernel, qtype):
    n, k = 32, 1024
    raw = random_blocks(qtype, n, k, seed=5)
    weight = packed(kernel, qtype, raw, n, k)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(6))
    want = emulate(kernel, weight, raw, x)
    got = weight(x).double()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    exact = x.double() @ torch.from_numpy(quants.dequantize(raw, GGMLQuantizationType[qtype]).reshape(n, k)).double().T
    assert (got - exact).abs().max() < 0.03 * exact.abs().max()  # int8 activations: about 1% of the largest output


def test_a_build_of_some_types_gives_their_bits_and_refuses_the_others(kernel, tmp_path, monkeypatch):
    """A model's load builds only its own types (-DQK_TYPES): those give the full build's bits; another type is
    refused in Python, and in C it falls back to the scalar reference (still the same bits)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user"))  # no kernels built at install: the subset builds
    some = load_kernel(str(tmp_path), frozenset({"Q4_K"}))
    assert Path(some.lib._name).parent == tmp_path / "kernels"
    n, k = 40, 512
    x = torch.randn(33, k, generator=torch.Generator().manual_seed(5))
    raw = random_blocks("Q4_K", n, k, seed=6)
    assert torch.equal(packed(some, "Q4_K", raw, n, k)(x), packed(kernel, "Q4_K", raw, n, k)(x))
    raw6 = random_blocks("Q6_K", n, k, seed=7)
    with pytest.raises(ValueError, match="built for Q4_K, not Q6_K"):
        packed(some, "Q6_K", raw6, n, k)(x)
    acts = quantize(some, "Q6_K", x)
    y = torch.empty(33, n)
    weight = packed(some, "Q6_K", raw6, n, k)
    some.lib.gemm(TYPES["Q6_K"], acts.q.data_ptr(), acts.d.data_ptr(), acts.s.data_ptr(), acts.bsum.data_ptr(), 33, k,
                  weight.data.ctypes.data, n, y.data_ptr(), n, some.path, 1)
    assert torch.equal(y, packed(kernel, "Q6_K", raw6, n, k)(x))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_rows_apart_are_read_in_place_with_the_bits_of_their_copy(kernel, qtype):
    """A gated MLP's product is a strided half of gate_up: the projection reads its rows where they are."""
    n, k = 32, 512
    weight = packed(kernel, qtype, random_blocks(qtype, n, k, seed=8), n, k)
    wide = torch.randn(7, 2 * k, generator=torch.Generator().manual_seed(9))
    half = wide[:, :k]
    assert not half.is_contiguous()
    assert torch.equal(weight(half), weight(half.contiguous()))


def test_the_repack_library_packs_the_kernels_bytes(kernel, tmp_path, monkeypatch):
    """A first load repacks with qrepack.c's library while the kernel compiles: the same bytes as the kernel's, in
    a build of every type and in one of a model's types (the others in its generic copy)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user"))  # no kernels built at install: both build
    for packer in (load_packer(str(tmp_path)), load_packer(str(tmp_path), frozenset({"Q4_K"}))):
        for qtype in ("Q4_K", "Q6_K", "Q8_0"):
            raw = random_blocks(qtype, 40, 512, seed=11)
            size = packed_size(kernel, qtype, 40, 512)
            assert packed_size(packer, qtype, 40, 512) == size
            ours, theirs = np.zeros(size, np.uint8), np.ones(size, np.uint8)
            repack(kernel, qtype, raw, 40, 512, ours)
            repack(packer, qtype, raw, 40, 512, theirs)
            assert np.array_equal(ours, theirs), qtype


def test_a_stacked_projection_gives_each_parts_bits_in_its_columns_whatever_the_rows(kernel):
    """StackedWeight runs its parts in one call (qkernel.c's linear): x quantized once per scheme into a scratch
    kept between calls. Mixed schemes (Q8_K and Q8_0/Q8_1), calls that grow the scratch and shrink again, and a
    strided x: each part's columns hold the bits of that part run alone, through quantize and gemm."""
    k = 512
    parts = [packed(kernel, qtype, random_blocks(qtype, n, k, seed=i), n, k)
             for i, (qtype, n) in enumerate((("Q4_K", 40), ("Q8_0", 24), ("Q6_K", 16), ("Q4_1", 8)))]
    stacked = StackedWeight(parts)
    wide = torch.randn(300, 2 * k, generator=torch.Generator().manual_seed(8))
    for rows in (3, 300, 17, 1, 64):
        x = wide[:rows, :k]  # rows 2k floats apart
        alone = []
        for part in parts:
            y = torch.empty(rows, part.n)
            part.matmul(quantize(kernel, part.qtype, x.contiguous()), y.data_ptr(), part.n, 2)
            alone.append(y)
        assert torch.equal(stacked(x), torch.cat(alone, dim=1)), f"{rows} rows"
    assert stacked(wide[:0, :k]).shape == (0, stacked.n)  # no rows: an empty output, not a MemoryError
