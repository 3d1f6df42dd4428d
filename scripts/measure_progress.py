"""Measure what a person watching a batch sees (docs/benchmarks.md, "Live counts, cancel, estimates"):
how late the live counts are, how long a cancel takes to stop the engine, and plan's estimate against
the measured run on the bench's workloads (as `batchinfer bench plan`). In-process on the real engine; the database is PostgreSQL
when --database-url is given (a worker's case), else SQLite (the embedded mode's).

    python scripts/measure_progress.py [--database-url postgresql+psycopg://postgres@127.0.0.1/db]
"""
from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.plan_accuracy import plan_rounds
from batchinfer.context import AppContext
from batchinfer.jobs import service
from batchinfer.jobs.units.live import with_live
from batchinfer.jobs.dispatch.planning import dispatch
from batchinfer.runtime.engine_host import get_generator
from batchinfer.jobs.units.runner import run_unit
from batchinfer.settings import Settings


def chat(i: int, text: str, max_tokens: int, system: str | None = None) -> str:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "smollm2-135m-instruct", "messages": messages, "max_tokens": max_tokens, "temperature": 0}})


def submit(ctx: AppContext, lines: list[str]):
    return service.submit(ctx, io.BytesIO(("\n".join(lines) + "\n").encode()), "m.jsonl")


def one_unit(ctx: AppContext) -> str:
    units = dispatch(ctx, ["m"])
    assert len(units) == 1, units
    return units[0].unit_id


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def live_lateness(ctx: AppContext, generator, n: int = 200) -> list[float]:
    """Seconds from a request's finish in the engine to the first live count that includes it."""
    job = submit(ctx, [chat(i, f"Spell the number {i}.", 1 + i % 4) for i in range(n)])
    unit_id, finished = one_unit(ctx), []
    runner = threading.Thread(target=run_unit, args=(ctx, unit_id, generator, "m"),
                              kwargs={"on_result": lambda r: finished.append(time.time())})
    runner.start()
    seen: list[tuple[float, int]] = []
    while runner.is_alive():
        shown = with_live(ctx, [service.get(ctx, job.id)])[0].completed
        if not seen or shown != seen[-1][1]:
            seen.append((time.time(), shown))
        time.sleep(0.02)
    late = []
    for k, done_at in enumerate(finished, start=1):
        shown_at = next((t for t, c in seen if c >= k), None)
        if shown_at is not None:  # else it first showed in the committed count
            late.append(shown_at - done_at)
    return late


def cancel_stop(ctx: AppContext, generator, runs: int = 5) -> list[tuple[float, float]]:
    """(cancel committed -> engine stopped its requests, -> job cancelled), while another job's requests run on."""
    out = []
    for _ in range(runs):
        doomed = submit(ctx, [chat(i, f"Count from {i} to 500, comma separated.", 256) for i in range(3)])
        submit(ctx, [chat(i, f"Count from {i} to 500.", 32) for i in range(2)])
        unit_id, stopped = one_unit(ctx), []

        def on_result(result, stopped=stopped) -> None:
            if result.aborted:
                stopped.append(time.time())

        runner = threading.Thread(target=run_unit, args=(ctx, unit_id, generator, "m"), kwargs={"on_result": on_result})
        runner.start()
        time.sleep(2.0)  # well into the run
        service.cancel(ctx, doomed.id)
        cancelled_at = time.time()
        while service.get(ctx, doomed.id).status != "cancelled":
            time.sleep(0.01)
        ended_at = time.time()
        runner.join()
        out.append((max(stopped) - cancelled_at, ended_at - cancelled_at))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--plan-only", action="store_true", help="only plan against the run")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="measure-progress-"))
    settings = Settings(data_dir=data, database_url=args.database_url, max_requests_per_unit=200)
    ctx = AppContext.create(settings, migrate=True)
    generator = get_generator(settings)
    if not args.plan_only:
        measure_live_and_cancel(ctx, generator)
    warm = settings.model_copy(update={"max_requests_per_unit": 64})
    ctx = AppContext(warm, ctx.sessions, ctx.storage)
    plan_rounds(ctx, generator, rounds=1, requests=None, max_tokens=None)  # `batchinfer bench plan`'s rounds


def measure_live_and_cancel(ctx: AppContext, generator) -> None:
    late = live_lateness(ctx, generator)
    print(f"live counts: {len(late)} requests seen live; lateness p50 {pct(late, 50):.2f} s, p99 {pct(late, 99):.2f} s, "
          f"max {max(late):.2f} s")
    stops = cancel_stop(ctx, generator)
    engine = [s for s, _ in stops]
    job = [e for _, e in stops]
    print(f"cancel: engine stopped in median {statistics.median(engine):.2f} s (max {max(engine):.2f}); "
          f"job cancelled in median {statistics.median(job):.2f} s (max {max(job):.2f}) over {len(stops)} runs")


if __name__ == "__main__":
    main()
