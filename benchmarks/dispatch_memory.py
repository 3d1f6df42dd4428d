"""What a dispatch round holds, in one process (tracemalloc): the pending records as dispatch parses them, their
PendingRequests, and the plan's peak (the prefix tree), on synthetic prepared lines shaped like the 200 MB bench
file (~600 tokens each after one of 4 system prompts). The plan digest tells whether two trees plan alike.

    PYTHONPATH=<tree> python -m benchmarks.dispatch_memory [N]
"""
from __future__ import annotations

import gc
import hashlib
import random
import sys
import time
import tracemalloc

from batchinfer.engine.types import SamplingParams
from batchinfer.jobs.records import PreparedRequest
from batchinfer.planner import PlannerConfig, plan_units

MIB = 2**20


def prepared_lines(n: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    systems = [[rng.randrange(300, 49152) for _ in range(45)] for _ in range(4)]
    return [PreparedRequest(i, "/v1/chat/completions", "m",
                            systems[i % 4] + [rng.randrange(300, 49152) for _ in range(rng.randrange(560, 640))],
                            SamplingParams(max_tokens=1, temperature=0)).to_json() for i in range(n)]


def main(n: int) -> None:
    lines = prepared_lines(n)
    gc.collect()

    def parse(raw: bytes) -> PreparedRequest:
        return PreparedRequest.from_json(raw).compact()

    tracemalloc.start()
    cpu = time.process_time()
    prepared = {("j", k): parse(raw) for k, raw in enumerate(lines)}
    records = tracemalloc.get_traced_memory()[0]
    pending = [prepared[k].to_pending("j") for k in sorted(prepared)]
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    units = plan_units(pending, PlannerConfig(max_requests_per_unit=64, unit_growth=4))
    peak = tracemalloc.get_traced_memory()[1]
    cpu = time.process_time() - cpu
    digest = hashlib.sha1(repr([(u.prefix_key, u.shared_prefix_len, u.expected_cached_tokens,
                                 [r.index for r in u.requests]) for u in units]).encode()).hexdigest()[:12]
    print(f"{n} records: {records / MIB:.0f} MiB; their PendingRequests +{(held - records) / MIB:.0f} MiB; "
          f"plan peak +{(peak - held) / MIB:.0f} MiB; {len(units)} units, plan {digest}; "
          f"CPU {cpu:.1f} s (under tracemalloc)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 25000)
