"""The `batchinfer bench process` command: the whole-process table on this machine."""
from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

import typer

from .process import SUITE, SYSTEMS, markdown, run_process_bench


def bench_process_command(
    out: Annotated[str, typer.Option("--out", help="directory for process.json and process.md")] = "bench-process",
    system: Annotated[list[str], typer.Option("--system", "-s", help=f"{' | '.join(SYSTEMS)} | all")] = ["all"],  # noqa: B006
    work: Annotated[list[str], typer.Option("--work", "-w", help="workload names of the suite | all")] = ["all"],  # noqa: B006
    threads: Annotated[int, typer.Option(help="llama.cpp threads")] = 2,
    timeout: Annotated[float, typer.Option(help="seconds per process before it counts as failed")] = 900,
) -> None:
    """Each system as its own timed process (start-up included): batchinfer run vs llama.cpp, same GGUF."""
    from transformers import AutoTokenizer

    from batchinfer.engine.loader import default_model_path, resolve_model_dir
    from batchinfer.settings import get_settings

    settings = get_settings()
    systems = _pick(system, SYSTEMS)
    names = {name for name, _, _ in SUITE.values()}
    picked = set(_pick(work, tuple(sorted(names))))
    suite = {label: spec for label, spec in SUITE.items() if spec[0] in picked}
    gguf = settings.model or default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir(gguf, settings.model_cache))
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    # batchinfer run uses its own data dir here; one untimed run first creates its database (a user's is warm).
    env = os.environ | {"BATCHINFER_DATA_DIR": str((out_dir / "data").resolve())}
    started, load_before = datetime.now(timezone.utc).isoformat(timespec="seconds"), _uptime()
    if "batchinfer" in systems:
        run_process_bench(tokenizer, gguf, out_dir / "warmup", {"warm-up": ("single", 1, 1)}, ("batchinfer",),
                          env, threads, timeout, progress=lambda line: None)
    report = run_process_bench(tokenizer, gguf, out_dir / "work", suite, systems, env, threads, timeout,
                               progress=lambda line: typer.echo(line, err=True))
    report["machine"] = {"cpu": _lscpu_model(), "cores": len(os.sched_getaffinity(0)), "load_before": load_before,
                         "python": platform.python_version(), "started_utc": started,
                         "finished_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    report["machine"]["load_after"] = _uptime()
    (out_dir / "process.json").write_text(json.dumps(report, indent=1))
    (out_dir / "process.md").write_text(markdown(report))
    typer.echo(markdown(report))
    typer.echo(f"load: {report['machine']['load_before']} -> {report['machine']['load_after']}")


def _pick(values: list[str], allowed: tuple[str, ...]) -> tuple[str, ...]:
    picked = [v.strip() for value in values for v in value.split(",") if v.strip()]
    if not picked or "all" in picked:
        return allowed
    bad = [v for v in picked if v not in allowed]
    if bad:
        raise typer.BadParameter(f"unknown {', '.join(bad)}; choose from {', '.join(allowed)} or all")
    return tuple(dict.fromkeys(picked))


def _uptime() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _lscpu_model() -> str:
    try:
        text = subprocess.run(["lscpu"], check=False, capture_output=True, text=True, timeout=10).stdout
        return next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration, subprocess.SubprocessError):
        return platform.processor()


__all__ = ["bench_process_command"]
