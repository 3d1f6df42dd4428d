"""Per-request records and per-run summaries: throughput, latency percentiles, cache hits, memory."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from batchinfer.engine.types import time_per_output_token


@dataclass
class RequestRecord:
    """One request as a system served it; times are wall clock (time.time())."""
    request_id: str
    prompt_tokens: int
    output_tokens: int
    arrival_time: float  # the whole job arrives at once, so this is the run's start
    start_time: float  # when the system began work on this request
    first_token_time: float
    last_token_time: float
    cached_tokens: int = 0  # prompt tokens whose KV was reused rather than computed
    finish_reason: str = "length"
    error: str | None = None

    @property
    def ttft_s(self) -> float:
        return self.first_token_time - self.arrival_time

    @property
    def tpot_s(self) -> float:
        return time_per_output_token(self.first_token_time, self.last_token_time, self.output_tokens)

    @property
    def e2e_s(self) -> float:
        return self.last_token_time - self.arrival_time

    def to_dict(self) -> dict:
        return asdict(self) | {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "e2e_s": self.e2e_s}


@dataclass
class PhaseStats:
    """Seconds and useful FLOPs spent computing prompts (prefill) and generating later tokens (decode)."""
    prefill_s: float
    prefill_flops: float
    decode_s: float
    decode_flops: float
    how: str  # how the split was measured, reported with the figures

    def gflops(self, peak_gflops: float) -> dict:
        pre = self.prefill_flops / self.prefill_s / 1e9 if self.prefill_s > 0 else 0.0
        dec = self.decode_flops / self.decode_s / 1e9 if self.decode_s > 0 else 0.0
        return {"prefill_s": self.prefill_s, "prefill_gflop": self.prefill_flops / 1e9, "prefill_gflops": pre,
                "prefill_pct_peak": 100 * pre / peak_gflops, "decode_s": self.decode_s,
                "decode_gflop": self.decode_flops / 1e9, "decode_gflops": dec,
                "decode_pct_peak": 100 * dec / peak_gflops, "phase_split": self.how}


@dataclass
class RunResult:
    system: str
    workload: str
    wall_s: float
    records: list[RequestRecord]
    phases: PhaseStats | None
    peak_rss_mib: float
    warmup_wall_s: float
    notes: list[str] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(run: RunResult, peak_gflops: float) -> dict:
    ok = [r for r in run.records if r.error is None]
    prompt = sum(r.prompt_tokens for r in ok)
    output = sum(r.output_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    ttft, tpot = [r.ttft_s for r in ok], [r.tpot_s for r in ok if r.output_tokens > 1]
    wall = run.wall_s if run.wall_s > 0 else math.nan
    return {
        "system": run.system, "workload": run.workload, "requests": len(run.records),
        "failures": len(run.records) - len(ok), "wall_s": run.wall_s, "warmup_wall_s": run.warmup_wall_s,
        "prompt_tokens": prompt, "output_tokens": output, "cached_tokens": cached,
        "total_tok_s": (prompt + output) / wall, "output_tok_s": output / wall,
        "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "tpot_p50_s": percentile(tpot, 50), "tpot_p99_s": percentile(tpot, 99),
        "e2e_p50_s": percentile([r.e2e_s for r in ok], 50), "e2e_p99_s": percentile([r.e2e_s for r in ok], 99),
        "prefix_hit_rate": cached / prompt if prompt else 0.0, "peak_rss_mib": run.peak_rss_mib,
    } | (run.phases.gflops(peak_gflops) if run.phases else {})
