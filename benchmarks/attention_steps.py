"""One layer's attention at the shapes of the whole-process workloads (SmolLM2: 9 query heads, 3 KV heads,
head_dim 64, 16-token blocks shuffled over the cache), the torch backend (chunked.py) against the CPU kernel
(cpu_kernel.c).

`python -m benchmarks.attention_steps [--repeats 21]`: the two backends alternate per repeat, so a loaded
machine slows both alike; p50 in ms per call. The new K/V are stored in both (part of the call).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

BLOCK, HKV, GROUP, D = 16, 3, 3, 64
# name -> (cached tokens per sequence, new tokens per sequence); sequences share no blocks here
SHAPES = {
    "decode, 16 sequences at 150": ([149] * 16, [1] * 16),
    "decode, 32 sequences at 390": ([389] * 32, [1] * 32),
    "prefill of 388": ([0], [388]),
    "31 extends of 20 over 370": ([370] * 31, [20] * 31),
}


def main() -> None:
    import torch

    from batchinfer.engine.attention.cpu_backend import CpuAttentionBackend
    from batchinfer.engine.attention.torch_backend import TorchAttentionBackend
    from benchmarks.support.paged_batch import PagedBatch

    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--cache", default=os.environ.get("BATCHINFER_MODEL_CACHE",
                                                         str(Path.home() / ".cache/batchinfer/models")))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    backends = {"torch": TorchAttentionBackend(), "cpu kernel": CpuAttentionBackend(args.cache)}
    report = {}
    for name, (prefixes, q_lens) in SHAPES.items():
        batch = PagedBatch(prefixes, q_lens, BLOCK, HKV, GROUP, D, torch.float32)
        times: dict[str, list[float]] = {b: [] for b in backends}
        for _ in range(args.repeats + 1):  # the first round warms up and is dropped
            for label, backend in backends.items():
                started = time.perf_counter()
                backend.forward(batch.q, batch.k, batch.v, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
                times[label].append(time.perf_counter() - started)
        report[name] = {label: round(statistics.median(t[1:]) * 1e3, 3) for label, t in times.items()}
        print(name, report[name], flush=True)
    print(json.dumps({"threads": torch.get_num_threads(), "ms_per_call": report}))


if __name__ == "__main__":
    main()
