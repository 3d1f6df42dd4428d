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

from .process import SUITES, SYSTEMS, markdown, run_process_bench


def bench_process_command(
    out: Annotated[str, typer.Option("--out", help="directory for process.json and process.md")] = "bench-process",
    system: Annotated[list[str], typer.Option("--system", "-s", help=f"{' | '.join(SYSTEMS)} | all")] = ["all"],  # noqa: B006
    work: Annotated[list[str], typer.Option("--work", "-w", help="workload names of the suite | all")] = ["all"],  # noqa: B006
    threads: Annotated[int, typer.Option(help="llama.cpp threads")] = 2,
    timeout: Annotated[float, typer.Option(help="seconds per process before it counts as failed")] = 900,
    model: Annotated[str | None, typer.Option("--model", help="a GGUF file (default: BATCHINFER_MODEL, else SmolLM2)")] = None,
    suite_name: Annotated[str, typer.Option("--suite", help=f"{' | '.join(SUITES)} (1b: issue 46's two workloads)")] = "smollm2",
    repeat: Annotated[int, typer.Option(help="rounds, the systems alternating; the table keeps each one's best")] = 1,
) -> None:
    """Each system as its own timed process (start-up included): batchinfer run vs llama.cpp, same GGUF."""
    from batchinfer.engine.loading.light_loader import LightTokenizer
    from batchinfer.engine.loading.loader import default_model_path, model_files_dir
    from batchinfer.settings import get_settings

    settings = get_settings()
    if suite_name not in SUITES:
        raise typer.BadParameter(f"unknown suite {suite_name!r}; choose from {', '.join(SUITES)}")
    systems = _pick(system, SYSTEMS)
    names = {name for name, _, _ in SUITES[suite_name].values()}
    picked = set(_pick(work, tuple(sorted(names))))
    suite = {label: spec for label, spec in SUITES[suite_name].items() if spec[0] in picked}
    gguf = str(Path(model).resolve()) if model else settings.model or default_model_path()
    if not gguf.endswith(".gguf") or not Path(gguf).exists():
        raise typer.BadParameter(f"--model must be an existing .gguf file (llama.cpp runs the same one), got {gguf}")
    tokenizer = LightTokenizer(model_files_dir(gguf, settings.model_cache))
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    # batchinfer run uses its own data dir here; one untimed run first creates its database (a user's is warm).
    env = os.environ | {"BATCHINFER_DATA_DIR": str((out_dir / "data").resolve()), "BATCHINFER_MODEL": gguf}
    started, load_before = datetime.now(timezone.utc).isoformat(timespec="seconds"), _uptime()
    if "batchinfer" in systems:
        run_process_bench(tokenizer, gguf, out_dir / "warmup", {"warm-up": ("single", 1, 1)}, ("batchinfer",),
                          env, threads, timeout, progress=lambda line: None)
    report = run_process_bench(tokenizer, gguf, out_dir / "work", suite, systems, env, threads, timeout,
                               progress=lambda line: typer.echo(line, err=True), repeat=repeat)
    report["model"] = gguf
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
