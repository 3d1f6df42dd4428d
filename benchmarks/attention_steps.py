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
import random
import statistics
import time
from pathlib import Path

BLOCK, HQ, HKV, D, NUM_BLOCKS = 16, 9, 3, 64, 4096
# name -> (new tokens per sequence, tokens per sequence after the step); sequences share no blocks here
SHAPES = {
    "decode, 16 sequences at 150": ([1] * 16, [150] * 16),
    "decode, 32 sequences at 390": ([1] * 32, [390] * 32),
    "prefill of 388": ([388], [388]),
    "31 extends of 20 over 370": ([20] * 31, [390] * 31),
}


def _batch(q_lens: list[int], seq_lens: list[int]):
    import torch

    from batchinfer.engine.attention.base import AttentionMetadata

    free = list(range(1, NUM_BLOCKS))
    random.Random(0).shuffle(free)
    tables, slots = [], []
    for q_len, total in zip(q_lens, seq_lens):
        table = [free.pop() for _ in range(-(-total // BLOCK))]
        tables.append(table)
        slots += [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(total - q_len, total)]
    width, cu = max(map(len, tables)), [0]
    for q_len in q_lens:
        cu.append(cu[-1] + q_len)
    return AttentionMetadata(torch.tensor(slots), torch.tensor(cu, dtype=torch.int32),
                             torch.tensor(seq_lens, dtype=torch.int32),
                             torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
                             max(q_lens), max(seq_lens))


def main() -> None:
    import torch

    from batchinfer.engine.attention.cpu_backend import CpuAttentionBackend
    from batchinfer.engine.attention.torch_backend import TorchAttentionBackend

    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--cache", default=os.environ.get("BATCHINFER_MODEL_CACHE",
                                                         str(Path.home() / ".cache/batchinfer/models")))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    backends = {"torch": TorchAttentionBackend(), "cpu kernel": CpuAttentionBackend(args.cache)}
    k_cache, v_cache = torch.randn(NUM_BLOCKS, BLOCK, HKV, D), torch.randn(NUM_BLOCKS, BLOCK, HKV, D)
    report = {}
    for name, (q_lens, seq_lens) in SHAPES.items():
        meta, n = _batch(q_lens, seq_lens), sum(q_lens)
        q, k, v = torch.randn(n, HQ, D), torch.randn(n, HKV, D), torch.randn(n, HKV, D)
        times: dict[str, list[float]] = {b: [] for b in backends}
        for _ in range(args.repeats + 1):  # the first round warms up and is dropped
            for label, backend in backends.items():
                started = time.perf_counter()
                backend.forward(q, k, v, k_cache, v_cache, meta, D ** -0.5)
                times[label].append(time.perf_counter() - started)
        report[name] = {label: round(statistics.median(t[1:]) * 1e3, 3) for label, t in times.items()}
        print(name, report[name], flush=True)
    print(json.dumps({"threads": torch.get_num_threads(), "ms_per_call": report}))


if __name__ == "__main__":
    main()
