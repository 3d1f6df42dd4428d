"""Issue 20 on a GPU: invariance_cases' arrangements (alone, batch of 64, reverse, prefix cache cold and warm,
preemption) run on CUDA, per dtype; a run is the device's engine end to end (Triton attention, cuBLAS linears
padded to the start-up probe's row count). Not collected by pytest: the device machine has no copy of the
real model, so the weights are seeded random ones over the packed config and tokenizer.

    python -m benchmarks.gpu_check --pack-model DIR           # here: config and tokenizer, no weights
    python -m tests.engine.gpu_invariance DIR OUT.json [DTYPE ...]   # there; exit 1 when a request differs
"""
from __future__ import annotations

import json
import sys
import time

import torch

from benchmarks.gpu_check import _random_weights_model
from tests.engine import invariance_cases


def main(argv: list[str]) -> int:
    folder, out, dtypes = argv[0], argv[1], argv[2:] or ["float32", "bfloat16"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loaded = _random_weights_model(folder)
    results: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    ok = True
    for dtype in dtypes:
        start = time.perf_counter()
        found = invariance_cases.arrangements(loaded, dtype, device=device)
        lines = invariance_cases.report(found)
        ok &= all(line.startswith(f"{len(found['alone'])}/") for line in lines.values())
        results[dtype] = {"preemptions": found["preemptions"]["count"], "seconds": time.perf_counter() - start} | lines
        print(dtype, json.dumps(results[dtype]), flush=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
