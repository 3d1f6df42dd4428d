"""`batchinfer bench formats`: one checkpoint in each weight format and dtype the engine can run it in, side by
side on this CPU: load time, resident memory, prefill and decode speed, and greedy agreement with dense float32
(the transformers-identical reference). What `auto` should pick for safetensors checkpoints is read off this table.

Each format runs in its own process (memory and caches are its own), the formats alternating over --repeat rounds.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from .process import hwm_kib
from .process_command import _lscpu_model, _uptime

FORMATS = {"dense-float32": ("dense", "float32"), "dense-bfloat16": ("dense", "bfloat16"), "q8_0": ("q8_0", "float32")}


def _prompts(tokenizer, n: int) -> list[list[int]]:
    from .workloads import build

    return build("no-sharing", tokenizer, n, 16).prompts


def run_one(model: str, cache: str, fmt: str, requests: int, decode_tokens: int) -> dict[str, Any]:
    """In this process: load, prefill all prompts (1 token each), then a decode of `decode_tokens` greedy tokens."""
    import torch

    from batchinfer.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams

    weight_format, dtype = FORMATS[fmt]
    started = time.perf_counter()
    engine = LLMEngine.from_pretrained(model, cache, EngineConfig(weight_format=weight_format, dtype=dtype))
    loaded = time.perf_counter() - started
    prompts = _prompts(engine.tokenizer, requests)
    warm = [GenerationRequest("warm", prompts[0][:32], SamplingParams(max_tokens=2, temperature=0))]
    engine.generate(warm)
    first = [GenerationRequest(f"p{i}", ids, SamplingParams(max_tokens=1, temperature=0)) for i, ids in enumerate(prompts)]
    t = time.perf_counter()
    engine.generate(first)
    prefill = time.perf_counter() - t
    full = [GenerationRequest(f"d{i}", ids, SamplingParams(max_tokens=decode_tokens, temperature=0, ignore_eos=True))
            for i, ids in enumerate(prompts)]
    t = time.perf_counter()
    results = engine.generate(full)  # the prompts are cached now: this is decode
    decode = time.perf_counter() - t
    del torch
    return {"format": fmt, "load_s": round(loaded, 2), "prefill_tokens": sum(len(p) for p in prompts),
            "prefill_s": round(prefill, 3), "decode_steps": decode_tokens, "decode_s": round(decode, 3),
            "tokens": [r.output_token_ids for r in results], "weights": engine.weights_note}


def bench_formats_command(
    model: Annotated[str, typer.Option("--model", help="a Hugging Face folder (safetensors)")],
    requests: Annotated[int, typer.Option(help="prompts (no shared prefix)")] = 16,
    decode_tokens: Annotated[int, typer.Option(help="greedy tokens per prompt")] = 32,
    repeat: Annotated[int, typer.Option(help="rounds, the formats alternating")] = 1,
    out: Annotated[str, typer.Option("--out", help="JSON report")] = "bench-formats.json",
) -> None:
    """Dense float32, dense bf16 and q8_0 on one checkpoint: speed, memory, agreement with float32."""
    from batchinfer.settings import get_settings

    cache = str(get_settings().model_cache)
    rows: list[dict[str, Any]] = []
    for round_ in range(repeat):
        for fmt in FORMATS if round_ % 2 == 0 else list(FORMATS)[::-1]:
            proc = subprocess.Popen([sys.executable, "-m", "benchmarks.formats", model, cache, fmt, str(requests),
                                     str(decode_tokens)], stdout=subprocess.PIPE, text=True)
            peak = 0
            while proc.poll() is None:
                peak = max(peak, hwm_kib(proc.pid))
                time.sleep(0.05)
            row = json.loads(proc.stdout.read() if proc.stdout else "{}") if proc.returncode == 0 else {"format": fmt}
            rows.append(row | {"round": round_, "rc": proc.returncode, "peak_rss_mib": round(peak / 1024)})
            typer.echo(f"{fmt}: {json.dumps({k: v for k, v in rows[-1].items() if k != 'tokens'})}", err=True)
    reference = next((r["tokens"] for r in rows if r.get("format") == "dense-float32" and "tokens" in r), None)
    for row in rows:
        if reference is not None and "tokens" in row:
            row["greedy_equal_to_float32"] = sum(a == b for a, b in zip(row["tokens"], reference))
    Path(out).write_text(json.dumps({"model": model, "cpu": _lscpu_model(), "load": _uptime(), "rows": rows}, indent=1))
    for row in rows:
        if "prefill_s" in row:
            typer.echo(f"{row['format']:>15} r{row['round']}: load {row['load_s']} s, prefill "
                       f"{row['prefill_tokens'] / row['prefill_s']:.0f} tok/s, decode "
                       f"{1000 * row['decode_s'] / row['decode_steps']:.0f} ms/step ({requests} rows), peak "
                       f"{row['peak_rss_mib']} MiB, greedy = float32 on {row.get('greedy_equal_to_float32')}/{requests}")


if __name__ == "__main__":
    model_arg, cache_arg, fmt_arg, n_arg, steps_arg = sys.argv[1:6]
    print(json.dumps(run_one(model_arg, cache_arg, fmt_arg, int(n_arg), int(steps_arg))))
