"""Q4_1 weights times int8 activations (EngineConfig.activation_format "int8"): llama.cpp's Q4_1 x Q8_1 arithmetic.

Each row is quantized per 32-block along K (dx = amax / 127, qx = round(x / dx), sx = sum(qx), as ggml's
quantize_row_q8_1), each block's dot product is an integer sum, and the blocks combine in fp32 in one fixed order:
  y = sum_b [ float(sum_k q_w qx) * (d_w * dx) + m_w * (dx * sx) ]
A row's quantization depends on that row alone, so the result is batch-invariant; it is not the fp32 answer
(the activations lose ~1% per element), which is why this path is opt-in.
Layout (w4a8_kernel.c): the Q4_1 panel's nibbles regrouped per 4 k, [N/16, K/4, 8, 4] bytes, byte (c, i) =
q[c][k + i] | q[c + 8][k + i] << 4: the same bytes as QuantWeight's [N/16, K, 8], transposed within each 4 k.
`emulate` is the same arithmetic in float64, for tests.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .quant_linear import BLOCK, PANEL, QuantWeight


@dataclass
class W4A8:
    qs: torch.Tensor  # [N/16, K/4, 8, 4] uint8
    lib: object  # the kernel library (quant_build.load_w4a8_kernel)

    def __call__(self, x: torch.Tensor, weight: QuantWeight) -> torch.Tensor:
        n, k = weight.shape
        dtype, lead = x.dtype, x.shape[:-1]
        x = x.to(torch.float32).contiguous().reshape(-1, k)
        rows = x.shape[0]
        out = torch.empty(rows, n, dtype=torch.float32)
        qx = torch.empty(rows, k, dtype=torch.int8)
        scales = torch.empty(2, rows, k // BLOCK, dtype=torch.float32)  # dx, dx * sx
        assert weight.m is not None
        self.lib.w4a8_linear(x.data_ptr(), rows, k, self.qs.data_ptr(), weight.d.data_ptr(),  # type: ignore[attr-defined]
                             weight.m.data_ptr(), n, out.data_ptr(), qx.data_ptr(), scales[0].data_ptr(),
                             scales[1].data_ptr(), torch.get_num_threads())
        return out.view(*lead, n).to(dtype)


def repack(weight: QuantWeight) -> torch.Tensor:
    """QuantWeight's Q4_1 panels [N/16, K, 8] -> [N/16, K/4, 8, 4] (each channel's 4 k adjacent)."""
    p, k = weight.qs.shape[0], weight.qs.shape[1]
    return weight.qs.reshape(p, k // 4, 4, 8).transpose(2, 3).contiguous()


def attach(weights: dict[str, QuantWeight], lib) -> dict[str, QuantWeight]:
    """Copies that run every Q4_1 weight with int8 activations (Q8_0 ones keep the fp32 kernel); the tensors are
    shared, the given weights unchanged (another engine may run them with fp32 activations)."""
    return {name: replace(w, a8=W4A8(repack(w), lib)) if w.format == "q4_1" else w for name, w in weights.items()}


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ggml's Q8_1 of each row in fp32: (qx [M, K] int, dx [M, K/32], sx [M, K/32] int)."""
    m, k = x.shape
    blocks = x.float().reshape(m, k // BLOCK, BLOCK)
    dx = blocks.abs().amax(dim=-1) / 127
    inv = torch.where(dx != 0, 1 / dx, torch.zeros_like(dx))
    qx = torch.round(blocks * inv[..., None])  # ties to even, as the kernel's _mm256_round_ps
    return qx.reshape(m, k).long(), dx, qx.sum(dim=-1).long()


def emulate(x: torch.Tensor, weight: QuantWeight) -> torch.Tensor:
    """The kernel's arithmetic in float64 (its fp32 roundings of d_w * dx and dx * sx kept): [M, N] float64."""
    assert weight.m is not None
    qx, dx, sx = quantize_rows(x)
    m, k = qx.shape
    p = weight.qs.shape[0]
    q = torch.cat([weight.qs & 0x0F, weight.qs >> 4], dim=-1).long()  # [N/16, K, 16]
    q = q.permute(0, 2, 1).reshape(p * PANEL, k // BLOCK, BLOCK)  # [N, K/32, 32]
    isum = torch.einsum("mbk,nbk->mnb", qx.reshape(m, k // BLOCK, BLOCK).double(), q.double())
    d = weight.d.float().permute(0, 2, 1).reshape(p * PANEL, k // BLOCK)  # [N, K/32]
    mw = weight.m.float().permute(0, 2, 1).reshape(p * PANEL, k // BLOCK)
    scale = (d[None] * dx[:, None]).double()  # fp32 products, as the kernel's _mm256_mul_ps
    offset = mw[None].double() * (dx * sx.float())[:, None].double()
    return (isum * scale + offset).sum(dim=-1)
