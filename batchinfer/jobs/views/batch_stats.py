"""Latency percentiles and a tokens/s series of an ended batch, read once from its output's `metrics`."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

from batchinfer.storage import Storage

MAX_BUCKETS = 60


@dataclass
class BatchStats:
    requests: int = 0
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p99_s: float | None = None
    bucket_s: float = 1.0
    tokens_per_s: list[list[float]] = field(default_factory=list)  # [[unix time, completion tokens/s], ...]

    def to_dict(self) -> dict:
        return asdict(self)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of unsorted values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _series(done: list[tuple[float, int]]) -> tuple[float, list[list[float]]]:
    """Completion tokens per second, bucketed by when each request finished (its last token)."""
    if not done:
        return 1.0, []
    start, end = min(t for t, _ in done), max(t for t, _ in done)
    bucket = max(1.0, math.ceil((end - start + 1) / MAX_BUCKETS))
    sums = [0] * (int((end - start) // bucket) + 1)
    for t, tokens in done:
        sums[int((t - start) // bucket)] += tokens
    return bucket, [[start + i * bucket, s / bucket] for i, s in enumerate(sums)]


def batch_stats(storage: Storage, output_key: str) -> BatchStats:
    ttft, tpot, done = [], [], []
    with storage.open_read(output_key) as stream:
        for raw in stream:
            line = json.loads(raw)
            metrics, body = line.get("metrics") or {}, (line.get("response") or {}).get("body") or {}
            if "ttft_s" in metrics:
                ttft.append(metrics["ttft_s"])
            if metrics.get("tpot_s"):  # one-token answers have no time per output token
                tpot.append(metrics["tpot_s"])
            if body.get("created"):
                done.append((float(body["created"]), (body.get("usage") or {}).get("completion_tokens", 0)))
    bucket, series = _series(done)
    return BatchStats(len(done), percentile(ttft, 50), percentile(ttft, 99), percentile(tpot, 50),
                      percentile(tpot, 99), bucket, series)
