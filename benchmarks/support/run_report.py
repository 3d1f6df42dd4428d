"""What every services bench (load, pipeline) does around its run: the machine and its load before and after,
the raw results written as JSON, a table printed, and the checks' problems on stderr (exit 1 if any)."""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import typer
from rich.console import Console
from rich.table import Table


def cpu_flags() -> list[str]:
    """The flags that decide dtype auto and weight_format auto (engine/machine/dtype.py, engine/gguf/load.py)."""
    from batchinfer.engine.machine.cpuinfo import cpu_flags as flags

    return sorted(flags() & {"avx512_bf16", "amx_bf16", "amx_tile", "amx_int8", "avx512f", "avx512_vnni", "avx2", "fma", "f16c"})


def run_and_report(run: Callable[[], dict], out: Path, work: Path, table: Callable[[dict], Table],
                   max_problems: int = 10) -> None:
    from benchmarks.process_command import _lscpu_model, _uptime

    machine = {"cpu": _lscpu_model(), "cores": len(os.sched_getaffinity(0)), "flags": cpu_flags(),
               "load_before": _uptime(), "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    result = run()
    result["machine"] = machine | {"load_after": _uptime(),
                                   "finished_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    Console().print(table(result))
    typer.echo(f"raw results: {out}; logs: {work}", err=True)
    if not result["checks"]["ok"]:
        for problem in result["checks"]["problems"][:max_problems]:
            typer.echo(f"problem: {problem}", err=True)
        raise typer.Exit(1)
