"""dtype "auto": bf16 where the hardware runs it natively and it measured faster, fp32 elsewhere.

On CPU, native means the AMX or AVX512-BF16 flags in /proc/cpuinfo: oneDNN then runs bf16 F.linear
at 1.5-10x fp32 from 4 rows up (docs/benchmarks.md, "dtype"). Without them bf16 is emulated and slower.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


def auto_dtype(device: str) -> str:
    kind = torch.device(device).type
    if kind == "cuda":
        return "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float32"
    if kind == "cpu":
        return "bfloat16" if cpu_has_native_bf16() else "float32"
    return "float32"


@lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return any(flag in flags for flag in BF16_CPU_FLAGS)
