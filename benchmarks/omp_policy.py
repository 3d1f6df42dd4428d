"""OpenMP wait policy against the engine: decode steps at a few batch sizes, and a whole `batchinfer run`, each
policy in its own process (libgomp reads its settings once, when torch loads it), policies alternating per
repeat so a shared machine's load falls on all alike.

`python -m benchmarks.omp_policy [--repeats 3] [--policies spin,passive,default] [--no-run | --no-decode]`

Policies: `default` (libgomp's own, nothing chosen: it spins about 300,000 iterations, then sleeps), `spin`
(OMP_WAIT_POLICY=ACTIVE), `passive` (OMP_WAIT_POLICY=PASSIVE: a thread sleeps as soon as it waits), `one`
(one thread), `spin10k` / `spin100k` (GOMP_SPINCOUNT: spin that many iterations, then sleep). KMP_BLOCKTIME
is Intel OpenMP's; torch's pip wheels use GNU libgomp, so it changes nothing here.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .process import timed

# "default" is libgomp's own: set but empty, so the CLI's choice (batchinfer/cli/openmp.py) stays out
POLICIES = {"default": {"OMP_WAIT_POLICY": ""}, "spin": {"OMP_WAIT_POLICY": "ACTIVE"}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
            "one": {"OMP_NUM_THREADS": "1"}, "spin10k": {"GOMP_SPINCOUNT": "10000"},
            "spin20k": {"GOMP_SPINCOUNT": "20000"},
            "spin100k": {"GOMP_SPINCOUNT": "100000"}}
BATCHES = (1, 8, 32)
SAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sample.jsonl"


def decode_child(batches: tuple[int, ...], tokens: int) -> dict:
    """In the child: per batch size, ms per decode step (wall and CPU) over `tokens` steps after the prefill."""
    import torch

    from batchinfer.engine import EngineConfig, LLMEngine
    from batchinfer.engine.types import GenerationRequest, SamplingParams
    from batchinfer.settings import get_settings

    engine = LLMEngine.from_pretrained(None, str(get_settings().model_cache), EngineConfig(dtype="float32"))
    prompt = engine.tokenizer.encode("Write a long story about a lighthouse keeper and the sea.")
    out: dict[str, object] = {"threads": torch.get_num_threads()}
    for b in batches:
        for i in range(b):
            engine.add_request(GenerationRequest(f"{b}-{i}", prompt + [i], SamplingParams(
                max_tokens=tokens + 1, temperature=0, ignore_eos=True)))
        engine.step()  # the prefill
        wall, cpu = [], []
        while engine.has_unfinished():
            started, cpu_started = time.perf_counter(), time.process_time()
            engine.step()
            wall.append(time.perf_counter() - started)
            cpu.append(time.process_time() - cpu_started)
        out[str(b)] = {"wall_ms": round(statistics.median(wall) * 1e3, 2), "cpu_ms": round(statistics.median(cpu) * 1e3, 2)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--policies", default="default,spin,passive")
    parser.add_argument("--tokens", type=int, default=24, help="decode steps timed per batch size")
    parser.add_argument("--no-run", action="store_true", help="decode steps only, no whole `batchinfer run`")
    parser.add_argument("--no-decode", action="store_true", help="the whole `batchinfer run` only")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(decode_child(BATCHES, args.tokens)))
        return
    policies = args.policies.split(",")
    rows: dict[str, dict[str, list]] = {p: {"decode": [], "run": []} for p in policies}
    for _ in range(args.repeats):
        for policy in policies:
            env = os.environ | POLICIES[policy]
            if not args.no_decode:
                rows[policy]["decode"].append(_decode(env, args.tokens))
            if not args.no_run:
                rows[policy]["run"].append(_whole_run(env) | {"load_1m": round(os.getloadavg()[0], 2)})
            print(policy, rows[policy]["decode"][-1:], rows[policy]["run"][-1:], file=sys.stderr, flush=True)
    print(json.dumps({"policies": {p: POLICIES[p] for p in policies}, "rows": rows,
                      "summary": {p: _summary(r) for p, r in rows.items()}}, indent=1))


def _decode(env: dict, tokens: int) -> dict:
    child = subprocess.run([sys.executable, "-m", "benchmarks.omp_policy", "--child", "--tokens", str(tokens)],
                           env=env, capture_output=True, text=True, check=True)
    return json.loads(child.stdout.strip().splitlines()[-1]) | {"load_1m": round(os.getloadavg()[0], 2)}


def _whole_run(env: dict) -> dict:
    """`batchinfer run examples/sample.jsonl` in a data dir of its own (the database made by an untimed run)."""
    with tempfile.TemporaryDirectory(prefix="omp-run-") as tmp:
        env = env | {"BATCHINFER_DATA_DIR": tmp}
        for key in ("BATCHINFER_DATABASE_URL", "BATCHINFER_STORAGE_URL", "BATCHINFER_BROKER_URL"):
            env.pop(key, None)
        cmd = [sys.executable, "-m", "batchinfer.cli", "run", str(SAMPLE), "-o", f"{tmp}/out.jsonl"]
        subprocess.run(cmd, env=env, capture_output=True, check=True)
        row = timed(cmd, env, 600)
        row.pop("stdout", None)
        return row


def _summary(rows: dict[str, list]) -> dict:
    out: dict = {}
    for b in map(str, BATCHES):
        for kind in ("wall_ms", "cpu_ms"):
            values = [r[b][kind] for r in rows["decode"] if b in r]
            if values:
                out[f"decode {b} {kind}"] = statistics.median(values)
    for kind in ("wall_s", "cpu_s"):
        values = [r[kind] for r in rows["run"] if r.get(kind) is not None]
        if values:
            out[f"run {kind}"] = statistics.median(values)
    return out


if __name__ == "__main__":
    main()
