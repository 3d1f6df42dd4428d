"""After a load run: did every job complete with each custom_id exactly once, and where did the time go.

The pipeline's own overhead is everything but the engine. The engine time of a unit is the largest `e2e_s`
among its requests' output metrics: the unit's requests all enter the engine in one generate() call, and e2e
runs from that arrival to the request's last token, so the largest is the engine call. Then, per request:
  overhead   = (workers x wall - engine time) / requests   (all the workers' time that was not the engine:
                submit, validation, dispatch, S3, SQL, finalize, and idle waits between them)
  in_unit    = (sum of unit spans - engine time) / requests (a worker inside a unit but outside the engine:
                claim the rows, read the unit input, write results, commit behind the fence)
  steady     = (workers x (last job final - first unit start) - engine time) / requests: the same as
                overhead without the submit phase, when the workers wait for the first validated job
"""
from __future__ import annotations

import io
import json
from collections import Counter, defaultdict

from sqlalchemy import select

from batchinfer.db.models import Job, JobStatus, Request, UnitStatus, WorkUnit
from batchinfer.jobs import service

from .load_workload import custom_id

TRACEBACK = "Traceback (most recent call last)"


def job_files(ctx, job_id: str) -> tuple[list[dict], list[dict]]:
    found = []
    for errors in (False, True):
        target = io.BytesIO()
        service.download(ctx, job_id, target, errors=errors)
        found.append([json.loads(line) for line in target.getvalue().splitlines() if line.strip()])
    return found[0], found[1]


def end_time(job: Job) -> float | None:
    return max((t for t in (job.completed_at, job.failed_at, job.expired_at, job.cancelled_at) if t), default=None)


def check_jobs(ctx, files: list[str], requests: int) -> tuple[dict, dict[str, list[dict]]]:
    """One job per input file, completed, every custom_id exactly once across its output and error files,
    and its counts equal to those files' lines. Returns the findings and each job's output lines."""
    with ctx.sessions() as session:
        jobs = list(session.scalars(select(Job)))
    by_file = defaultdict(list)
    for job in jobs:
        by_file[job.input_filename].append(job)
    problems: list[str] = []
    outputs: dict[str, list[dict]] = {}
    totals: Counter[str] = Counter()
    lines: Counter[str] = Counter()
    for number, name in enumerate(files):
        found = by_file.get(name, [])
        if len(found) != 1:
            problems.append(f"{name}: {len(found)} jobs")
            continue
        job = found[0]
        totals[job.status] += 1
        if job.status != JobStatus.COMPLETED:
            problems.append(f"{name}: job {job.id} is {job.status} ({str(job.errors)[:200]})")
        if job.status not in JobStatus.TERMINAL:
            continue
        out, err = job_files(ctx, job.id)
        outputs[job.id] = out
        lines["output"] += len(out)
        lines["errors"] += len(err)
        problems += _check_ids(name, number, requests, out, err)
        if (job.completed, job.failed, job.total) != (len(out), len(err), requests):
            problems.append(f"{name}: counts {job.completed}/{job.failed}/{job.total} vs lines {len(out)}/{len(err)}/{requests}")
    extra = sorted(set(by_file) - set(files))
    if extra:
        problems.append(f"jobs of unknown files: {extra[:5]}")
    return {"jobs": len(files), "jobs_found": sum(len(by_file.get(f, [])) for f in files), "by_status": dict(totals),
            "output_lines": lines["output"], "error_lines": lines["errors"],
            "problems": problems[:50], "problem_count": len(problems), "ok": not problems}, outputs


def _check_ids(name: str, number: int, requests: int, out: list[dict], err: list[dict]) -> list[str]:
    seen = Counter(line["custom_id"] for line in out + err)
    wanted = {custom_id(number, i) for i in range(requests)}
    missing = wanted - set(seen)
    twice = [cid for cid, n in seen.items() if n > 1]
    unknown = set(seen) - wanted
    problems = []
    for what, ids in (("missing", missing), ("more than once", twice), ("unexpected", unknown)):
        if ids:
            problems.append(f"{name}: {len(ids)} custom_ids {what}, e.g. {sorted(ids)[:3]}")
    return problems


def time_split(ctx, outputs: dict[str, list[dict]], workers: int, started: float, final_at: float, requests: int) -> dict:
    """Engine time, unit spans and the pipeline's overhead per request (the method: this module's docstring)."""
    with ctx.sessions() as session:
        unit_of = {(j, c): u for j, c, u in session.execute(select(Request.job_id, Request.custom_id, Request.unit_id))}
        units = list(session.execute(select(WorkUnit.id, WorkUnit.started_at, WorkUnit.finished_at, WorkUnit.attempts)
                                     .where(WorkUnit.status == UnitStatus.DONE)))
    engine: dict[str | None, float] = defaultdict(float)  # by unit (None: a line no request row names)
    usage: Counter[str] = Counter()
    for job_id, lines in outputs.items():
        for line in lines:
            unit = unit_of.get((job_id, line["custom_id"]))
            engine[unit] = max(engine[unit], line["metrics"]["e2e_s"])
            body = line["response"]["body"]["usage"]
            usage["prompt_tokens"] += body["prompt_tokens"]
            usage["completion_tokens"] += body["completion_tokens"]
            usage["cached_tokens"] += (body.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    engine_s = sum(engine.values())
    unit_s = sum(f - s for _, s, f, _ in units if s and f)
    capacity = workers * (final_at - started)
    first_unit = min((s for _, s, _, _ in units if s), default=final_at)
    steady = workers * (final_at - first_unit)
    per_request = 1000 / max(1, requests)
    return {"units": len(units), "requests_per_unit": round(requests / max(1, len(units)), 1),
            "units_rerun": sum(1 for *_, attempts in units if attempts > 1),
            "engine_s": round(engine_s, 2), "unit_spans_s": round(unit_s, 2), "worker_capacity_s": round(capacity, 2),
            "engine_ms_per_request": round(engine_s * per_request, 3),
            "overhead_ms_per_request": round((capacity - engine_s) * per_request, 3),
            "in_unit_overhead_ms_per_request": round((unit_s - engine_s) * per_request, 3),
            "outside_units_ms_per_request": round((capacity - unit_s) * per_request, 3),
            "first_unit_after_s": round(first_unit - started, 2),
            "steady_overhead_ms_per_request": round((steady - engine_s) * per_request, 3),
            **dict(usage)}


def tracebacks(logs: dict[str, str]) -> list[str]:
    return [f"{name}: {text[text.index(TRACEBACK):][:600]}" for name, text in logs.items() if TRACEBACK in text]
