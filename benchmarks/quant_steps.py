"""The projections of one engine step (every layer's qkv/o/gate_up/down and the LM head), dense fp32 against the
GGUF's own Q4_1/Q8_0 blocks (weight_format "gguf", the AVX2 build and, where the CPU has it, the AVX-512 one),
at the row counts of decode and prefill steps.

`python -m benchmarks.quant_steps [--repeats 5]`: the two formats alternate per repeat, so a loaded machine
slows both alike; p50 per row count. Attention, norms and sampling are the same in both and left out.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROWS = (1, 8, 32, 64, 512)


def _apply(builds: dict, name: str, x):
    return builds[name](x)


def main() -> None:
    import torch
    import torch.nn.functional as F

    from batchinfer.engine.layers.quant_build import load_kernel
    from batchinfer.engine.loader import load_model_light
    from batchinfer.engine.native_build import avx512_supported

    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    parser.add_argument("--cache", default=os.environ.get("BATCHINFER_MODEL_CACHE",
                                                         str(Path.home() / ".cache/batchinfer/models")))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model_light(None, args.cache, torch.float32, "gguf")
    assert loaded.weights is not None and loaded.quant is not None
    dense = {name: loaded.weights.get(name, loaded.weights["embed"]) if name == "lm_head" else loaded.weights[name]
             for name in loaded.quant}
    formats: dict[str, Callable[[str, torch.Tensor], torch.Tensor]] = {"dense fp32": lambda name, x: F.linear(x, dense[name])}
    for isa in ("avx2", "avx512") if avx512_supported() else ("avx2",):  # the two builds give the same bits
        builds = {name: dataclasses.replace(w, lib=load_kernel(args.cache, isa)) for name, w in loaded.quant.items()}
        formats[f"gguf {isa}"] = partial(_apply, builds)
    by_rows: dict[int, dict[str, float]] = {}
    with torch.inference_mode():
        for rows in map(int, args.rows.split(",")):
            xs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in dense.values()}
            wall: dict[str, list[float]] = {f: [] for f in formats}
            cpu: dict[str, list[float]] = {f: [] for f in formats}
            for _ in range(args.repeats):
                for fmt, linear in formats.items():
                    started, cpu_started = time.perf_counter(), time.process_time()
                    for name, w in dense.items():
                        linear(name, xs[w.shape[1]])
                    wall[fmt].append(time.perf_counter() - started)
                    cpu[fmt].append(time.process_time() - cpu_started)
            # CPU time moves less than wall time on a shared machine; both are p50 in ms
            by_rows[rows] = {f"{fmt} {kind}": round(statistics.median(t[fmt]) * 1e3, 1)
                                    for fmt in formats for kind, t in (("wall", wall), ("cpu", cpu))}
            print(rows, by_rows[rows], flush=True)
    print(json.dumps({"threads": torch.get_num_threads(), "rows": by_rows}))


if __name__ == "__main__":
    main()
