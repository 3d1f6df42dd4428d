"""The integer kernel's GEMM alone, on the 1B-class model's projection shapes: G multiply-adds/s per block type and
row count, with the CPU's fastest path and 2 threads. Given two built kernel libraries (`--so A --so B`, e.g. one
built from a stash of the change), it times both alternately in one process, best of 5 rounds each, checks that
they give the same bits, and prints B's speed over A's: a VM whose speed drifts by 20% between minutes still
compares them fairly. `--cold` runs each call on the next of enough copies of the weight to exceed the L3 (as the
engine's steps read every layer's weights from memory), not on one copy that stays in cache.

    python -m benchmarks.qkernel_gemm                                       # this tree's kernel
    python -m benchmarks.qkernel_gemm --so before/qkernel-X.so --so after/qkernel-Y.so --rows 16,620 --cold
    python -m benchmarks.qkernel_gemm --path vnni --path vnni-mul --cold    # two paths of this tree's kernel
"""
from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from concurrent.futures import Future

import torch

from batchinfer.engine.machine.heap import keep_freed_memory
from batchinfer.engine.quant import kernel as qkernel
from batchinfer.engine.quant.packed import PackedWeight

from .support.qblocks import packed, random_blocks

# (block type, N, K): qkv and gate_up at hidden 2048, down_proj at ffn 8192, Q6_K and Q8_0 at down's shape
SHAPES = [("Q4_K", 3072, 2048), ("Q4_K", 16384, 2048), ("Q4_K", 2048, 8192), ("Q6_K", 2048, 8192),
          ("Q8_0", 2048, 8192)]


PATHS = {"avx2": qkernel.AVX2, "vnni": qkernel.VNNI, "vnni-mul": qkernel.VNNI_MUL}


def kernel_from(so: str | None) -> qkernel.Kernel:
    if so is None:
        return qkernel.load_kernel(tempfile.mkdtemp(prefix="qkernel-bench-"))
    built: Future = Future()
    built.set_result(so)
    qkernel.start_build = lambda *a, **k: built  # load_kernel's ctypes set-up, on this file
    return qkernel.load_kernel.__wrapped__(so)


COLD_BYTES = 96 << 20  # copies of a weight in all: beyond any L3 of these machines


def best_seconds(weights: list[list[PackedWeight]], x: torch.Tensor, reps: int, rounds: int = 5) -> list[float]:
    """weights[i]: kernel i's copies of one weight, called in turn."""
    best = [float("inf")] * len(weights)
    for _ in range(rounds):
        for i, copies in enumerate(weights):
            reps_i = -(-reps // len(copies)) * len(copies)
            start = time.perf_counter()
            for j in range(reps_i):
                copies[j % len(copies)](x)
            best[i] = min(best[i], (time.perf_counter() - start) / reps_i)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--so", action="append", help="a built kernel library (twice: compare them)")
    parser.add_argument("--rows", default="1,16,620")
    parser.add_argument("--cold", action="store_true", help="weights read from memory, not from the caches")
    parser.add_argument("--types", help="block types at down_proj's shape instead (e.g. Q2_K,Q3_K,Q5_K)")
    parser.add_argument("--path", action="append", choices=sorted(PATHS),
                        help="another path than the CPU's best (avx2 on a VNNI CPU); twice: compare them")
    args = parser.parse_args()
    torch.set_num_threads(2)
    keep_freed_memory()  # as the engine does: a call's output comes from the heap, not fresh pages
    kernels = [kernel_from(so) for so in (args.so or [None])]
    if args.path:
        kernels = [dataclasses.replace(kern, path=PATHS[p]) for kern in kernels for p in args.path]
    print(f"path: {kernels[0].name}")
    shapes = [(t, 2048, 8192) for t in args.types.split(",")] if args.types else SHAPES
    for qtype, n, k in shapes:
        raw = random_blocks(qtype, n, k)
        copies = -(-COLD_BYTES // raw.nbytes) if args.cold else 1
        weights = [[packed(kern, qtype, raw, n, k) for _ in range(copies)] for kern in kernels]
        cells = []
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
            outs = [w[0](x) for w in weights]
            if any(not torch.equal(outs[0], o) for o in outs[1:]):
                raise SystemExit(f"{qtype} {n}x{k} at {rows} rows: the kernels' outputs differ")
            best = best_seconds(weights, x, reps=max(2, int(1e9 / (rows * n * k))))
            speeds = " vs ".join(f"{rows * n * k / s / 1e9:.0f}" for s in best)
            cells.append(f"{rows} rows {speeds} G" + (f" ({best[0] / best[1]:.2f}x)" if len(best) == 2 else ""))
        print(f"{qtype} {n}x{k}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
