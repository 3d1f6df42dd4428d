"""The Q4_1 kernels of SmolLM2's four projection shapes: fp32 activations (weight_format "gguf") against int8
activations (activation_format "int8", layers/w4a8_linear.py), in GMAC/s at decode and prefill row counts.

`python -m benchmarks.w4a8_steps [--threads 1] [--repeats 7]`: random Q4_1 weights (the kernels' speed does not
depend on the values); the two kernels alternate per repeat, so a loaded machine slows both alike; best of the
repeats (the least disturbed run) and p50 are printed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
ROWS = (1, 4, 16, 32, 256)


def main() -> None:
    import torch

    from batchinfer.engine.layers.quant_build import load_kernel, load_w4a8_kernel
    from batchinfer.engine.layers.quant_linear import QuantWeight, pack_q4_1
    from batchinfer.engine.layers.w4a8_linear import W4A8, repack

    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cache = os.environ.get("BATCHINFER_MODEL_CACHE", tempfile.gettempdir())
    fp32_lib, a8_lib = load_kernel(cache), load_w4a8_kernel(cache)
    rng = np.random.default_rng(0)
    table = {}
    for shape, (n, k) in SHAPES.items():
        q = rng.integers(0, 16, (n, k), dtype=np.uint8)
        scales = (rng.random((n, k // 32)) * 0.01).astype(np.float16)
        fp32 = pack_q4_1(q, scales, -scales)
        fp32.lib = fp32_lib
        int8 = QuantWeight(fp32.format, fp32.qs, fp32.d, fp32.m, fp32_lib, W4A8(repack(fp32), a8_lib))
        for rows in map(int, args.rows.split(",")):
            x = torch.randn(rows, k)
            calls = max(1, int(2e8 // (rows * n * k)))  # ~0.2 G MAC per timing
            times: dict[str, list[float]] = {"fp32": [], "int8": []}
            for _ in range(args.repeats):
                for name, w in (("fp32", fp32), ("int8", int8)):
                    started = time.perf_counter()
                    for _ in range(calls):
                        w(x)
                    times[name].append((time.perf_counter() - started) / calls)
            gmac = rows * n * k / 1e9
            table[f"{shape} {n}x{k} M={rows}"] = row = {
                f"{name} {kind}": round(gmac / f(t), 1) for name, t in times.items()
                for kind, f in (("best", min), ("p50", statistics.median))}
            row["speedup p50"] = round(row["int8 p50"] / row["fp32 p50"], 2)
            print(f"{shape:8s} {n}x{k} M={rows:4d}", row, flush=True)
    print(json.dumps({"threads": args.threads, "gmac_per_s": table, "load": os.getloadavg()}))


if __name__ == "__main__":
    main()
