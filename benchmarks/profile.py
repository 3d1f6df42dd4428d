"""Where the engine's time goes on one workload: time per engine stage, and the top torch operators.

python -m benchmarks.profile -w shared-prefix   (prints two tables; --trace FILE writes a Chrome trace)
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

# Engine attributes timed when present (dotted paths from the LLMEngine); nested ones count inside their parent.
STAGES = ("scheduler.schedule", "runner.prepare", "runner.model.forward", "runner.model.attention.forward",
          PROJECTIONS := "runner.model (quantized projections)", "runner.sampler.sample", "scheduler.postprocess")


class StageTimer:
    """Wraps engine methods for the duration of a `with` block and sums their wall time."""

    def __init__(self, engine, paths=STAGES):
        self.engine, self.paths = engine, paths
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._wrapped: list[tuple[object, str]] = []

    def __enter__(self) -> "StageTimer":
        from batchinfer.engine.quant.packed import StackedWeight

        self._projections = StackedWeight.__call__  # a class attribute: every projection of the model at once
        StackedWeight.__call__ = self._timed(PROJECTIONS, self._projections)  # type: ignore[method-assign]
        for path in self.paths:
            *parents, attr = path.split(".")
            owner = self.engine
            for p in parents:
                owner = getattr(owner, p, None)
            if owner is not None and callable(getattr(owner, attr, None)):
                setattr(owner, attr, self._timed(path, getattr(owner, attr)))
                self._wrapped.append((owner, attr))
        return self

    def __exit__(self, *exc) -> None:
        from batchinfer.engine.quant.packed import StackedWeight

        StackedWeight.__call__ = self._projections  # type: ignore[method-assign]
        for owner, attr in self._wrapped:
            delattr(owner, attr)

    def _timed(self, path: str, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[path] += time.perf_counter() - start
                self.calls[path] += 1
        return wrapper


def profile(
    workload: Annotated[str, typer.Option("--workload", "-w")] = "shared-prefix",
    requests: Annotated[Optional[int], typer.Option()] = None,
    max_tokens: Annotated[Optional[int], typer.Option()] = None,
    cache_dir: Annotated[Optional[str], typer.Option()] = None,
    max_num_batched_tokens: Annotated[int, typer.Option()] = 2048,
    dtype: Annotated[str, typer.Option(help="auto (as batchinfer run) | float32 | bfloat16")] = "auto",
    top: Annotated[int, typer.Option(help="operators to list")] = 20,
    model: Annotated[Optional[str], typer.Option(help="a checkpoint (default: SmolLM2's GGUF)")] = None,
    trace: Annotated[Optional[str], typer.Option(help="write a Chrome trace here")] = None,
) -> None:
    """Profile the engine on one generated workload (after a warm-up on another document)."""
    import torch.profiler

    from batchinfer.settings import get_settings
    from .config import BenchOptions
    from .harness import _warmup_workload, build_workloads
    from .runners.engine import EngineRunner

    options = BenchOptions(workloads=(workload,), systems=("engine",), requests=requests, max_tokens=max_tokens,
                           cache_dir=str(cache_dir or get_settings().model_cache),
                           max_num_batched_tokens=max_num_batched_tokens, dtype=dtype, model_path=model)
    runner = EngineRunner(options)
    (measured,), (warm,) = build_workloads(options), build_workloads(options, seed=options.seed + 1000)
    runner.run(_warmup_workload(measured, warm, 2))
    activities = [torch.profiler.ProfilerActivity.CPU]
    with StageTimer(runner.engine) as stages, torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        records, phases = runner.run(measured)
        wall = time.perf_counter() - start
    console = Console(width=160)
    console.print(_stage_table(stages, wall))
    console.print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=50))
    if phases:
        console.print(f"prefill steps {phases.prefill_s:.2f} s for {phases.prefill_flops / 1e9:.1f} GFLOP, "
                      f"decode steps {phases.decode_s:.2f} s for {phases.decode_flops / 1e9:.1f} GFLOP "
                      f"(wall {wall:.2f} s with the profiler on)")
    if trace:
        prof.export_chrome_trace(trace)


def _stage_table(stages: StageTimer, wall: float) -> Table:
    t = Table(title=f"engine stages (wall {wall:.2f} s; nested stages are included in their parents)")
    for col in ("stage", "calls", "seconds", "% wall", "ms / call"):
        t.add_column(col, justify="left" if col == "stage" else "right")
    for path in STAGES:
        if stages.calls.get(path):
            s, n = stages.seconds[path], stages.calls[path]
            t.add_row(path, str(n), f"{s:.3f}", f"{100 * s / wall:.1f}%", f"{1000 * s / n:.2f}")
    return t


if __name__ == "__main__":
    typer.run(profile)
