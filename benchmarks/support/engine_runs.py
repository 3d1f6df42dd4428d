"""What `bench constrained` and `bench tools` share: one engine for the run, a timed generate with its decode
steps, alternated runs of two kinds (so load drifts hit both alike) and their medians."""
from __future__ import annotations

import json
import os
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import typer

from ..process_command import _lscpu_model, _uptime


def load_engine(model: str | None, cache_dir: str | None, dtype: str, device: str):
    from batchinfer.engine import EngineConfig, LLMEngine
    from batchinfer.settings import get_settings

    settings = get_settings()
    return LLMEngine.from_pretrained(model or settings.model, cache_dir or str(settings.model_cache),
                                     EngineConfig(dtype=dtype, device=device, max_num_seqs=64))


def new_report(options: dict[str, Any]) -> dict:
    return {"machine": {"cpu": _lscpu_model(), "cores": len(os.sched_getaffinity(0)), "load_before": _uptime(),
                        "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")},
            "options": options}


def timed_generate(engine, requests: list) -> tuple[list, dict]:
    """The results, and wall time, output tokens/s and decode steps of the call."""
    before = engine.step_stats.copy()
    started = time.perf_counter()
    results = engine.generate(requests)
    wall = time.perf_counter() - started
    steps = engine.step_stats.since(before)
    tokens = sum(r.completion_tokens for r in results)
    return results, {"wall_s": round(wall, 3), "output_tokens": tokens, "tokens_per_s": round(tokens / wall, 2),
                     "decode_steps": steps.decode_steps,
                     "decode_step_ms": round(1000 * steps.decode_s / steps.decode_steps, 2) if steps.decode_steps else None}


def alternate(kinds: tuple[str, str], repeat: int, run: Callable[[str, str], dict]) -> dict[str, list[dict]]:
    """run(kind, tag) for each kind in turn, `repeat` rounds (a fresh tag each run: ids differ, prompts do not)."""
    runs: dict[str, list[dict]] = {kind: [] for kind in kinds}
    for r in range(repeat):
        for kind in kinds:
            runs[kind].append(run(kind, f"{kind}{r}"))
            typer.echo(f"{kind} run {r + 1}: {runs[kind][-1]}", err=True)
    return runs


def finish(report: dict, runs: dict[str, list[dict]], ratio_name: str, out: Path) -> None:
    """Medians of tokens/s and decode step, the second kind's tokens/s over the first's; written to `out`."""
    first, second = list(runs)
    median = {kind: statistics.median(x["tokens_per_s"] for x in rows) for kind, rows in runs.items()}
    step = {kind: statistics.median(x["decode_step_ms"] or 0 for x in rows) for kind, rows in runs.items()}
    report["runs"] = runs
    report["summary"] = {"tokens_per_s": median, "decode_step_ms": step,
                         ratio_name: round(median[second] / median[first], 3)}
    report["machine"]["load_after"] = _uptime()
    out.write_text(json.dumps(report, indent=1))
    typer.echo(json.dumps(report["summary"]))
