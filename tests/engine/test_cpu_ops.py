"""The quantized models' norms and activation in C (layers/cpu_ops.c) against float64 references, the same bits
on AVX2 and AVX-512, and a row's bits the same alone and in any batch (a batch large enough to split its rows
over the threads included); the residual add exactly torch's."""
from __future__ import annotations

import pytest
import torch

from batchinfer.engine.layers.cpu_ops import CpuOps, TorchOps, decoder_ops, load_ops
from batchinfer.engine.machine.native_build import avx512_supported, cpu_supported

pytestmark = [pytest.mark.fast,
              pytest.mark.skipif(not cpu_supported(), reason="the CPU kernels need avx2, fma and f16c")]
WIDTHS = [576, 40, 7, 2048]  # whole 16-lane vectors, and tails of 8 and of fewer


@pytest.fixture(scope="module")
def ops(tmp_path_factory) -> dict[str, CpuOps]:
    lib = load_ops(str(tmp_path_factory.mktemp("cache")))
    return {"best": CpuOps(0, 1e-5, lib), "avx2": CpuOps(0, 1e-5, lib, avx2_only=True)}


def norm_ref(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return (x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + eps) * w.double()).float()


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    g, u = gate_up.double().chunk(2, dim=-1)
    return (g * torch.sigmoid(g) * u).float()


@pytest.mark.parametrize("h", WIDTHS)
@pytest.mark.parametrize("which", ["best", "avx2"])
def test_rms_norm_matches_a_float64_reference(ops, which, h):
    gen = torch.Generator().manual_seed(h)
    x, w = torch.randn(9, h, generator=gen) * 3, torch.rand(h, generator=gen) + 0.5
    got = ops[which].norm(x, w)
    torch.testing.assert_close(got, norm_ref(x, w, 1e-5), rtol=4e-6, atol=1e-6)
    assert ops[which].norm(x, None) is x  # no weight: no norm (the sandwich norms a family lacks)


@pytest.mark.parametrize("which", ["best", "avx2"])
def test_add_norm_adds_in_place_with_torchs_bits_then_norms(ops, which):
    gen = torch.Generator().manual_seed(1)
    hidden, y, w = torch.randn(5, 40, generator=gen), torch.randn(5, 40, generator=gen), torch.rand(40, generator=gen)
    expected = hidden + y
    out = ops[which].add_norm(hidden, y, w)
    assert torch.equal(hidden, expected)
    torch.testing.assert_close(out, norm_ref(expected, w, 1e-5), rtol=4e-6, atol=1e-6)
    assert ops[which].add_norm(hidden, y, None) is hidden and torch.equal(hidden, expected + y)


@pytest.mark.parametrize("inter", [1536, 40, 7])
@pytest.mark.parametrize("which", ["best", "avx2"])
def test_silu_mul_matches_a_float64_reference_in_place(ops, which, inter):
    gen = torch.Generator().manual_seed(inter)
    gate_up = torch.randn(6, 2 * inter, generator=gen) * 6
    gate_up[0, :4] = torch.tensor([-200.0, 200.0, 0.0, -0.0])  # past exp's range both ways, and zeros
    expected = silu_mul_ref(gate_up)
    got = ops[which].gated(gate_up, "silu")
    assert got.data_ptr() == gate_up.data_ptr()  # the gate's half, overwritten: no temporary
    torch.testing.assert_close(got, expected, rtol=2e-6, atol=1e-30)
    assert torch.isfinite(got).all()


@pytest.mark.skipif(not avx512_supported(), reason="compares the AVX-512 build with the AVX2 one")
@pytest.mark.parametrize("h", WIDTHS)
def test_the_avx2_and_avx512_builds_give_the_same_bits(ops, h):
    gen = torch.Generator().manual_seed(h + 7)
    x, w = torch.randn(33, h, generator=gen), torch.rand(h, generator=gen)
    gate_up = torch.randn(33, 2 * h, generator=gen) * 4
    assert torch.equal(ops["best"].norm(x, w), ops["avx2"].norm(x, w))
    assert torch.equal(ops["best"].gated(gate_up.clone(), "silu"), ops["avx2"].gated(gate_up.clone(), "silu"))


@pytest.mark.parametrize("which", ["best", "avx2"])
def test_a_row_gets_the_same_bits_alone_and_in_a_batch_split_over_threads(ops, which):
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(300, 576, generator=gen), torch.rand(576, generator=gen)  # 172,800 values: split
    gate_up = torch.randn(300, 2 * 576, generator=gen)
    rows = [0, 151, 299]
    batch_norm, batch_silu = ops[which].norm(x, w), ops[which].gated(gate_up.clone(), "silu")
    for r in rows:
        assert torch.equal(ops[which].norm(x[r:r + 1], w), batch_norm[r:r + 1])
        assert torch.equal(ops[which].gated(gate_up[r:r + 1].clone(), "silu"), batch_silu[r:r + 1])


def test_other_activations_and_strided_inputs_take_torchs_form(ops):
    gen = torch.Generator().manual_seed(5)
    gate_up = torch.randn(4, 64, generator=gen)
    assert torch.equal(ops["best"].gated(gate_up.clone(), "gelu_tanh"), TorchOps(0, 1e-5).gated(gate_up.clone(), "gelu_tanh"))
    strided = torch.randn(64, 4, generator=gen).t()
    assert torch.equal(ops["best"].gated(strided.clone(), "silu"), TorchOps(0, 1e-5).gated(strided.clone(), "silu"))


def test_only_a_quantized_float32_model_on_the_cpu_takes_the_c_ops(tmp_path):
    cpu = torch.device("cpu")
    assert type(decoder_ops(64, 1e-5, True, cpu, torch.float32, str(tmp_path))) is CpuOps
    assert type(decoder_ops(64, 1e-5, False, cpu, torch.float32, str(tmp_path))) is TorchOps  # dense: transformers' bits
    assert type(decoder_ops(64, 1e-5, True, cpu, torch.bfloat16, str(tmp_path))) is TorchOps
