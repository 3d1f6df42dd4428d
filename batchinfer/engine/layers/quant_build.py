"""The quantized kernel (quant_kernel.c), built and cached by native_build, with its C signatures."""
from __future__ import annotations

import ctypes
import logging
from functools import lru_cache
from pathlib import Path

from ..native_build import AVX2, AVX512, CPU_FLAGS, NativeKernelUnavailable, avx512_supported, build_library, cpu_supported

SOURCE = Path(__file__).with_name("quant_kernel.c")
AVX512_SOURCE = Path(__file__).with_name("quant_kernel_avx512.c")  # the same bits, 16 lanes an instruction
W4A8_SOURCE = Path(__file__).with_name("w4a8_kernel.c")
QuantKernelUnavailable = NativeKernelUnavailable
log = logging.getLogger(__name__)

__all__ = ["CPU_FLAGS", "QuantKernelUnavailable", "cpu_supported", "kernel_isa", "load_kernel", "load_w4a8_kernel"]


def kernel_isa() -> str:
    return "avx512" if avx512_supported() else "avx2"


@lru_cache(maxsize=2)
def load_kernel(cache_dir: str, isa: str | None = None) -> ctypes.CDLL:
    """The quantized kernel for this CPU (`isa` None), or the "avx2" / "avx512" build (tests compare them)."""
    lib = None
    if (isa or kernel_isa()) == "avx512":
        try:
            lib = build_library(AVX512_SOURCE, cache_dir, "quantized kernel (AVX-512)", AVX512)
        except NativeKernelUnavailable as exc:
            if isa:
                raise
            log.warning("%s; running the AVX2 build (the same results)", exc)  # e.g. a compiler without AVX-512
    if lib is None:
        lib = build_library(SOURCE, cache_dir, "quantized kernel", AVX2)
    i64, ptr, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.q4_1_linear.argtypes = [ptr, i64, i64, ptr, ptr, ptr, i64, ptr, ptr, c_int]
    lib.q8_0_linear.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, ptr, c_int]
    lib.q4_1_linear.restype = lib.q8_0_linear.restype = None
    return lib


@lru_cache(maxsize=1)
def load_w4a8_kernel(cache_dir: str) -> ctypes.CDLL:
    """The Q4_1 x int8-activation kernel (w4a8_kernel.c)."""
    lib = build_library(W4A8_SOURCE, cache_dir, "int8-activation kernel")
    i64, ptr, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.w4a8_linear.argtypes = [ptr, i64, i64, ptr, ptr, ptr, i64, ptr, ptr, ptr, ptr, c_int]
    lib.q8_rows.argtypes = [ptr, i64, i64, ptr, ptr, ptr]
    lib.w4a8_linear.restype = lib.q8_rows.restype = None
    return lib
