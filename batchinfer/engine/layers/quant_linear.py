"""A linear layer over GGUF's own quantized blocks (Q4_1, Q8_0), without de-quantizing the matrix in memory.

Block formats, as ggml defines them (32 weights along the input dimension per block):
  Q4_1: w = d * q + m, q in [0, 15], d and m fp16 per block (0.625 bytes a weight)
  Q8_0: w = d * q, q in [-127, 127], d fp16 per block (1.06 bytes a weight)
The kernel (quant_kernel.c) wants the output channels in panels of 16, so a weight is repacked once at load:
  Q4_1 qs [N/16, K, 8] uint8, byte j = q[col j] | q[col j + 8] << 4; d, m [N/16, K/32, 16] fp16
  Q8_0 qs [N/16, K, 16] int8; d [N/16, K/32, 16] fp16
It decodes each panel to the exact fp32 weights gguf's dequantize gives, then multiplies in fp32 with one
order of operations per output element whatever the row count: batch-invariant, and equal to F.linear over
the de-quantized matrix up to the summation order. `reference` is that F.linear, for tests.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

PANEL, BLOCK = 16, 32
FORMATS = ("q4_1", "q8_0")


@dataclass
class QuantWeight:
    format: str
    qs: torch.Tensor
    d: torch.Tensor  # fp16
    m: torch.Tensor | None  # fp16, Q4_1 only
    lib: object | None = None  # the kernel library (quant_build.load_kernel); None: the torch reference
    a8: Callable[[torch.Tensor, QuantWeight], torch.Tensor] | None = None  # int8 activations (w4a8_linear.W4A8)

    @property
    def shape(self) -> tuple[int, int]:
        return self.qs.shape[0] * PANEL, self.qs.shape[1]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.a8 is not None:
            return self.a8(x, self)
        if self.lib is None:
            return reference(x, self)
        n, k = self.shape
        dtype = x.dtype
        x = x.to(torch.float32).contiguous()
        lead = x.shape[:-1]
        x = x.reshape(-1, k)
        out = torch.empty(x.shape[0], n, dtype=torch.float32)
        threads = torch.get_num_threads()
        scratch = torch.empty(threads * 2 * k * PANEL, dtype=torch.float32)  # two decoded panels a thread
        if self.format == "q4_1":
            assert self.m is not None
            self.lib.q4_1_linear(x.data_ptr(), x.shape[0], k, self.qs.data_ptr(), self.d.data_ptr(),  # type: ignore[attr-defined]
                                 self.m.data_ptr(), n, out.data_ptr(), scratch.data_ptr(), threads)
        else:
            self.lib.q8_0_linear(x.data_ptr(), x.shape[0], k, self.qs.data_ptr(), self.d.data_ptr(),  # type: ignore[attr-defined]
                                 n, out.data_ptr(), scratch.data_ptr(), threads)
        return out.view(*lead, n).to(dtype)  # fp32 inside; a bf16 engine gets bf16 back

    def tensors(self, name: str) -> dict[str, torch.Tensor]:
        """For a safetensors file: `name.q4_1.qs`, `name.q4_1.d`, ... (from_tensors reads them back)."""
        out = {f"{name}.{self.format}.qs": self.qs, f"{name}.{self.format}.d": self.d}
        return out | ({f"{name}.{self.format}.m": self.m} if self.m is not None else {})

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> dict[str, QuantWeight]:
        names = {key.rsplit(".", 2)[0]: key.rsplit(".", 2)[1] for key in tensors if key.endswith(".qs")}
        return {name: cls(fmt, tensors[f"{name}.{fmt}.qs"], tensors[f"{name}.{fmt}.d"],
                          tensors.get(f"{name}.{fmt}.m")) for name, fmt in names.items()}


def packable(n: int, k: int) -> bool:
    return n % PANEL == 0 and k % BLOCK == 0


def pack_q4_1(q: np.ndarray, d: np.ndarray, m: np.ndarray) -> QuantWeight:
    """q [N, K] uint8 in [0, 15]; d, m [N, K/32] fp16 -> the panel layout."""
    n, k = q.shape
    panels = q.reshape(n // PANEL, PANEL, k).transpose(0, 2, 1)  # [N/16, K, 16]
    qs = panels[..., :8] | (panels[..., 8:] << 4)
    return QuantWeight("q4_1", torch.from_numpy(np.ascontiguousarray(qs, dtype=np.uint8)), _panel_scales(d),
                       _panel_scales(m))


def pack_q8_0(q: np.ndarray, d: np.ndarray) -> QuantWeight:
    """q [N, K] int8; d [N, K/32] fp16 -> the panel layout."""
    n, k = q.shape
    qs = q.reshape(n // PANEL, PANEL, k).transpose(0, 2, 1)
    return QuantWeight("q8_0", torch.from_numpy(np.ascontiguousarray(qs, dtype=np.int8)), _panel_scales(d), None)


def _panel_scales(s: np.ndarray) -> torch.Tensor:
    n, nb = s.shape
    return torch.from_numpy(np.ascontiguousarray(s.reshape(n // PANEL, PANEL, nb).transpose(0, 2, 1),
                                                 dtype=np.float16))


def from_gguf_blocks(kind: str, raw: np.ndarray, n: int, k: int) -> QuantWeight:
    """A GGUF tensor's raw bytes [N, K/32 * block bytes] (ggml's block_q4_1 / block_q8_0) -> the panel layout."""
    blocks = raw.reshape(n, k // BLOCK, -1)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    if kind == "q4_1":
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0]
        nibbles = blocks[..., 4:20]  # byte j: element j (low nibble), element j + 16 (high)
        q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).reshape(n, k)
        return pack_q4_1(q, d, m)
    q8 = blocks[..., 2:34].copy().view(np.int8).reshape(n, k)
    return pack_q8_0(q8, d)


def quantize_q8_0(weight: torch.Tensor) -> QuantWeight:
    """ggml's reference Q8_0 quantization of a dense [N, K] matrix: d = amax / 127 per block, q = round(w / d)."""
    n, k = weight.shape
    w = weight.detach().float().reshape(n, k // BLOCK, BLOCK)
    d = w.abs().amax(dim=-1) / 127
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    q = torch.round(w * inv[..., None]).clamp(-127, 127).to(torch.int8).reshape(n, k)
    return pack_q8_0(q.numpy(), d.to(torch.float16).numpy())


def dequantize(weight: QuantWeight) -> torch.Tensor:
    """The dense fp32 [N, K] matrix, as gguf's dequantize computes it (d * q, then + m)."""
    p, k = weight.qs.shape[0], weight.qs.shape[1]
    if weight.format == "q4_1":
        assert weight.m is not None
        q = torch.cat([weight.qs & 0x0F, weight.qs >> 4], dim=-1).float()  # [N/16, K, 16]
        w = _expand(weight.d) * q + _expand(weight.m)
    else:
        w = _expand(weight.d) * weight.qs.float()
    return w.transpose(1, 2).reshape(p * PANEL, k)


def _expand(scales: torch.Tensor) -> torch.Tensor:
    return scales.float().repeat_interleave(BLOCK, dim=1)  # [N/16, K/32, 16] -> [N/16, K, 16]


def reference(x: torch.Tensor, weight: QuantWeight) -> torch.Tensor:
    return torch.nn.functional.linear(x.float(), dequantize(weight))
