"""Random GGUF blocks of every type the integer kernel reads, and their packed weight: what the kernel's tests
(tests/engine/test_qkernel.py) and its benchmark (benchmarks/qkernel_gemm.py) run on."""
from __future__ import annotations

import numpy as np

from batchinfer.engine.quant.kernel import BLOCK_BYTES, SUPER, Kernel
from batchinfer.engine.quant.packed import PackedWeight, packed_size, repack

# where each type keeps its fp16 scales (d, and dmin or m): set to sane values, the rest of a block is random bytes
SCALE_OFFSETS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82),
                 "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_blocks(qtype: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    nb = k // SUPER[qtype]
    raw = rng.integers(0, 256, size=(n, nb, BLOCK_BYTES[qtype]), dtype=np.uint8)
    for i, off in enumerate(SCALE_OFFSETS[qtype]):
        scale = rng.uniform(1e-3, 2e-2, size=(n, nb)) * (rng.choice([-1, 1], size=(n, nb)) if i == 1 else 1)
        raw[..., off:off + 2] = scale.astype(np.float16).view(np.uint8).reshape(n, nb, 2)
    return raw.reshape(n, nb * BLOCK_BYTES[qtype])


def packed(kernel: Kernel, qtype: str, raw: np.ndarray, n: int, k: int) -> PackedWeight:
    out = np.zeros(packed_size(kernel, qtype, n, k), dtype=np.uint8)
    repack(kernel, qtype, raw, n, k, out)
    return PackedWeight(qtype, n, k, out, kernel)
