"""`batchinfer bench plan`: plan's estimate against the run, on the bench's workloads (issue 21 point 3).

In one process on the real engine, the embedded mode's path (the unit runner as a worker runs it): each
workload as a chat JSONL file, estimated as `plan` estimates it (the rates this machine measured so far),
then run; a first round only records the costs. Beside each ratio: the estimate again at the run's own
measured costs ("replay"), which tells the model's error apart from the machine's load moving between the
runs that measured the rates and the run estimated, and how much of the run's wall time was engine steps.
"""
from __future__ import annotations

import io
import json
import os
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

import typer

from .process_command import _lscpu_model, _uptime
from .workloads import build

WORKLOADS = ("shared-prefix", "no-sharing", "long-decode")


def chat_line(i: int, system: str | None, user: str, max_tokens: int) -> str:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "smollm2-135m-instruct", "messages": messages, "max_tokens": max_tokens, "temperature": 0}})


def request_file(name: str, tokenizer, requests: int | None, max_tokens: int | None, seed: int) -> bytes:
    w = build(name, tokenizer, requests=requests, max_tokens=max_tokens, seed=seed)
    return ("\n".join(chat_line(i, s, u, w.max_tokens) for i, (s, u) in enumerate(w.chats)) + "\n").encode()


def estimate_and_run(ctx, generator, name: str, data: bytes) -> dict:
    """One workload: the estimate, the run, and the estimate at the run's own costs."""
    from batchinfer.cluster.registry import WorkerState
    from batchinfer.jobs import engine_rates, service
    from batchinfer.runtime.embedded import run_pending
    from batchinfer.runtime.preview import summary

    workers = [WorkerState("embedded")]
    estimate = summary(ctx, io.BytesIO(data), workers)
    job = service.submit(ctx, io.BytesIO(data), f"{name}.jsonl")
    before, load = generator.step_stats.copy(), os.getloadavg()[0]
    started = time.perf_counter()
    run_pending(ctx)
    actual = time.perf_counter() - started
    steps = generator.step_stats.since(before)
    replay = summary(ctx, io.BytesIO(data), workers, engine_rates.rate_of_steps(steps, "this run"))
    job = service.get(ctx, job.id)
    return {"workload": name, "estimated_s": round(estimate["estimated_run_s"] or 0, 3), "actual_s": round(actual, 3),
            "ratio": round((estimate["estimated_run_s"] or 0) / actual, 3),
            "replay_s": round(replay["estimated_run_s"] or 0, 3),
            "replay_ratio": round((replay["estimated_run_s"] or 0) / actual, 3),
            "engine_steps_s": round(steps.prefill_s + steps.decode_s, 3), "prefill_s": round(steps.prefill_s, 3),
            "decode_s": round(steps.decode_s, 3), "decode_steps": steps.decode_steps,
            "prefill_tokens": steps.prefill_tokens, "prefill_pairs": steps.prefill_pairs,
            "decode_pairs": steps.decode_pairs, "status": job.status, "completion_tokens": job.completion_tokens,
            "max_new_tokens": estimate["max_new_tokens"], "rates": estimate["rate_source"],
            "load_1m_before": round(load, 2), "load_1m_after": round(os.getloadavg()[0], 2)}


def plan_rounds(ctx, generator, rounds: int, requests: int | None, max_tokens: int | None,
                workloads: tuple[str, ...] = WORKLOADS, echo=print) -> list[dict]:
    """Round 0 records the costs (reported, marked); rounds 1.. are the figures. Each round's prompts are
    new (its own seed): a run never finds the previous round's prompts in the engine's prefix cache."""
    rows = []
    for round_ in range(rounds + 1):
        for name in workloads:
            data = request_file(name, generator.tokenizer, requests, max_tokens, seed=round_)
            row = {"round": round_, **estimate_and_run(ctx, generator, name, data)}
            rows.append(row)
            echo(json.dumps(row))
    return rows


def bench_plan_command(
    rounds: Annotated[int, typer.Option(min=1, help="rounds of all workloads after the one that records the costs")] = 2,
    requests: Annotated[int | None, typer.Option(help="requests per workload (default: each workload's own)")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="max_tokens of every request (default: each workload's own)")] = None,
    database_url: Annotated[str | None, typer.Option(help="PostgreSQL (a worker's case); default SQLite in a temp dir")] = None,
    out: Annotated[Path, typer.Option("--out", help="where the raw results go (JSON)")] = Path("bench-plan.json"),
) -> None:
    """plan's estimate against the measured run on the bench's workloads (shared-prefix, no-sharing,
    long-decode): the ratio estimate / actual per run, the same at the run's own costs, and the load."""
    from batchinfer.context import AppContext
    from batchinfer.runtime.engine_host import get_generator
    from batchinfer.settings import Settings

    report: dict = {"machine": {"cpu": _lscpu_model(), "cores": len(os.sched_getaffinity(0)), "load_before": _uptime(),
                                "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}}
    settings = Settings(data_dir=Path(tempfile.mkdtemp(prefix="bench-plan-")), database_url=database_url)
    ctx = AppContext.create(settings, migrate=True)
    generator = get_generator(settings)
    report["rows"] = rows = plan_rounds(ctx, generator, rounds, requests, max_tokens,
                                        echo=lambda line: typer.echo(line, err=True))
    report["machine"]["load_after"] = _uptime()
    out.write_text(json.dumps(report, indent=1))
    typer.echo("| round | workload | estimate s | actual s | ratio | at the run's own costs | engine steps s | load |")
    typer.echo("|---|---|---|---|---|---|---|---|")
    for r in rows:
        typer.echo(f"| {r['round'] or 'records'} | {r['workload']} | {r['estimated_s']:.1f} | {r['actual_s']:.1f} | "
                   f"{r['ratio']:.2f} | {r['replay_ratio']:.2f} | {r['engine_steps_s']:.1f} | "
                   f"{r['load_1m_before']:.1f}-{r['load_1m_after']:.1f} |")
    typer.echo(f"load: {report['machine']['load_before']} -> {report['machine']['load_after']}; raw: {out}")


__all__ = ["bench_plan_command", "plan_rounds"]
