"""dtype "auto": a dtype other than float32 only where it is batch-invariant, passes the fidelity rule and
measured faster; float32 everywhere else, with the reason.

On CPU, bf16 runs natively only with the AMX or AVX512-BF16 flags in /proc/cpuinfo; without them it is
emulated and slower, so auto is float32 there. With them it is float32 too: measured on an avx512_bf16 EPYC
(2026-12-04), bf16 is batch-invariant and within vLLM's check_logprobs_close rule, and faster, but it changes
greedy answers of the README sample (3 of 8, "What is the capital of France?" among them), so it is not the
float32 reference's answer. `--dtype bfloat16` still asks for it, batch-invariant (invariance.py).
On CUDA auto is bfloat16: on an H200 (2026-12-04, tests/engine/gpu_invariance.py) bf16 gave every request
bitwise its run-alone output in every arrangement, and float32 did not (same tokens, but 1-5 of 24 logprobs
bitwise equal: cuBLAS picks its fp32 kernels by row count past the probe's reach), so float32 there would break
the invariance guarantee the engine makes.
"""
from __future__ import annotations

import torch

from .cpuinfo import cpu_flags

BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


def auto_dtype(device: str) -> tuple[str, str]:
    """The dtype auto resolves to on this device, and why (printed at start-up, recorded with each job)."""
    kind = torch.device(device).type
    if kind == "cuda":
        return "bfloat16", "auto: batch-invariant on cuda, float32 is not"
    if kind == "cpu" and not cpu_has_native_bf16():
        return "float32", "auto: no avx512_bf16 or amx_bf16"
    if kind == "cpu":
        return "float32", "auto: bf16 native, but its greedy answers differ from float32's"
    return "float32", f"auto: {kind}"


def cpu_has_native_bf16() -> bool:
    return any(flag in cpu_flags() for flag in BF16_CPU_FLAGS)
