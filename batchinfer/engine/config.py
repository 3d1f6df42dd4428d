"""EngineConfig: every knob of the engine in one dataclass that validates itself."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .machine.dtype import auto_dtype
from .options import ATTENTION_BACKENDS, DTYPE_ALIASES, POOLINGS, WEIGHT_FORMATS
from .options import DTYPES as DTYPE_NAMES
from .types import EngineDescription

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


@dataclass
class EngineConfig:
    block_size: int = 16
    kv_cache_bytes: int | None = None  # wins over kv_cache_fraction when set
    kv_cache_fraction: float = 0.05  # of total memory (host RAM on CPU, device memory on GPU)
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048  # token budget per step; longer prompts are prefilled in chunks
    enable_prefix_caching: bool = True
    attention_backend: str = "auto"
    dtype: str = "float32"  # or "bfloat16", "float16", "auto" (resolved here: see dtype.py)
    device: str = "cpu"
    max_model_len: int | None = None  # None: the model's context length
    starvation_steps: int = 32  # a waiting request skipped this many steps jumps the prefix-reuse order
    pooling: str = "auto"  # an embed request's pooling: "last" token (decoder embedders), "mean" of the prompt, or
    # "auto": what the model's files say (pooling_config.py), else last
    dtype_reason: str = "asked"  # why this dtype: "asked", or auto's reason (dtype.py)
    # "dense": de-quantized weights in `dtype`; "gguf": the GGUF's own blocks with int8 activations (llama.cpp's
    # arithmetic, engine/quant/); "q8_0": any checkpoint quantized to Q8_0 at load, the same kernel; "auto": "gguf"
    # on CPU for a GGUF whose projections are quantized (the CPU has avx2, fma and f16c), else dense
    # (gguf/load.gguf_choice); LLMEngine sets what the loaded model holds
    weight_format: str = "auto"
    weight_format_reason: str = "asked"  # why this weight format: "asked", or auto's reason
    # where the engine keeps what it measures of this machine (the invariance probe's row pad, probe_cache.py);
    # None: measure at every start. LLMEngine.from_pretrained sets the model cache.
    cache_dir: str | None = None
    max_loras: int = 8  # LoRA adapters held loaded at once (least recently used evicted), and running in one step
    # False: a result whose text is its output ids decoded comes with text_pending instead, for the caller to decode
    # (the engine process's parent holds the tokenizer already: this process then never reads tokenizer.json
    # unless a request needs it here: stop strings, logprobs' bytes, a grammar)
    detokenize: bool = True

    def __post_init__(self):
        try:
            torch.device(self.device)
        except RuntimeError as exc:
            raise ValueError(f"EngineConfig.device: invalid device {self.device!r}") from exc
        _check(self.block_size >= 1, "block_size", self.block_size, "must be >= 1")
        _check(self.kv_cache_bytes is None or self.kv_cache_bytes > 0, "kv_cache_bytes", self.kv_cache_bytes, "must be > 0")
        _check(0 < self.kv_cache_fraction <= 1, "kv_cache_fraction", self.kv_cache_fraction, "must be in (0, 1]")
        _check(self.max_num_seqs >= 1, "max_num_seqs", self.max_num_seqs, "must be >= 1")
        _check(self.max_num_batched_tokens >= 1, "max_num_batched_tokens", self.max_num_batched_tokens, "must be >= 1")
        _check(self.attention_backend in ATTENTION_BACKENDS, "attention_backend", self.attention_backend,
               f"must be one of {ATTENTION_BACKENDS}")
        self.dtype = DTYPE_ALIASES.get(self.dtype, self.dtype)
        if self.dtype == "auto":
            self.dtype, self.dtype_reason = auto_dtype(self.device)
        _check(self.dtype in DTYPES, "dtype", self.dtype, f"must be one of {tuple(DTYPES)}")
        _check(self.max_model_len is None or self.max_model_len >= 1, "max_model_len", self.max_model_len, "must be >= 1")
        _check(self.max_loras >= 1, "max_loras", self.max_loras, "must be >= 1")
        _check(self.starvation_steps >= 1, "starvation_steps", self.starvation_steps, "must be >= 1")
        _check(self.pooling in POOLINGS, "pooling", self.pooling, f"must be one of {POOLINGS}")
        _check(self.weight_format in WEIGHT_FORMATS, "weight_format", self.weight_format,
               f"must be one of {WEIGHT_FORMATS}")
        on_cpu = torch.device(self.device).type == "cpu"
        _check(self.weight_format in ("auto", "dense") or on_cpu, "weight_format", self.weight_format,
               "runs on CPU only")
        if self.weight_format == "auto" and not on_cpu:
            self.weight_format, self.weight_format_reason = "dense", f"auto: {torch.device(self.device).type}"

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def description(self) -> EngineDescription:
        """What this config runs, as a record (each output line gets its fields)."""
        return EngineDescription(self.dtype, self.dtype_reason, self.weight_format, self.weight_format_reason)

    @property
    def dtype_note(self) -> str:
        """What start-up prints: `float32 (auto: no avx512_bf16 or amx_bf16)`."""
        return self.description.dtype_note

    @property
    def weights_note(self) -> str:
        """What start-up prints beside the dtype: `gguf (auto: the GGUF's own blocks, ... (Q4_K/Q6_K))`."""
        return self.description.weights_note or ""  # a config always names a weight format

    def kv_budget_bytes(self) -> int:
        if self.kv_cache_bytes is not None:
            return self.kv_cache_bytes
        return int(_total_memory_bytes(torch.device(self.device)) * self.kv_cache_fraction)


def _check(ok: bool, name: str, value, why: str) -> None:
    if not ok:
        raise ValueError(f"EngineConfig.{name} {why}, got {value!r}")


def _total_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
