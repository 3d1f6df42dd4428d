"""Prefix-cache figures of a job, per work unit and per prefix group: cached prompt tokens / prompt
tokens, and progress by group (for `batchinfer status`)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field

from sqlalchemy import func, select

from batchinfer.context import AppContext
from batchinfer.db.models import Request, RequestStatus, UnitStatus, WorkUnit
from batchinfer.jobs.records import work_tokens

NO_GROUP = "(no group)"


@dataclass
class UnitFigures:
    unit_id: str
    prefix_key: str
    shared_prefix_len: int
    status: str
    worker: str | None
    requests: int  # of this job
    done: int
    prompt_tokens: int = 0
    cached_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass
class GroupFigures:
    prefix_key: str
    shared_prefix_len: int
    units: int = 0
    units_done: int = 0
    requests: int = 0
    done: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    workers: list[str] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "hit_rate": round(self.hit_rate, 4)}


def unit_figures(ctx: AppContext, job_id: str) -> list[UnitFigures]:
    """Per unit of this job: its requests, how many finished, and their prompt and cached tokens (the counts
    stored on the request rows at commit, summed in SQL)."""
    with ctx.sessions() as session:
        rows = session.execute(
            select(Request.unit_id, Request.status, func.count(), func.sum(Request.prompt_tokens),
                   func.sum(Request.cached_tokens))
            .where(Request.job_id == job_id, Request.unit_id.is_not(None))
            .group_by(Request.unit_id, Request.status)).all()
        # The WHERE already drops unplanned requests; the comprehension narrows unit_id to str for mypy.
        counts = [(u, status, n, prompt, cached) for u, status, n, prompt, cached in rows if u is not None]
        unit_ids = sorted({row[0] for row in counts})
        units = {u.id: u for u in session.scalars(select(WorkUnit).where(WorkUnit.id.in_(unit_ids)))} if unit_ids else {}
    per_unit: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for unit_id, status, n, prompt, cached in counts:
        t = per_unit[unit_id]
        t[0] += n
        if status in (RequestStatus.COMPLETED, RequestStatus.FAILED):
            t[1] += n
            t[2] += prompt or 0
            t[3] += cached or 0
    return [UnitFigures(u, units[u].prefix_key, units[u].shared_prefix_len, units[u].status, units[u].worker,
                        *per_unit[u]) for u in unit_ids]


def group_figures(units: list[UnitFigures]) -> list[GroupFigures]:
    groups: dict[str, GroupFigures] = {}
    for u in units:
        key = u.prefix_key or NO_GROUP
        g = groups.setdefault(key, GroupFigures(key, u.shared_prefix_len))
        g.units += 1
        g.units_done += u.status == UnitStatus.DONE
        g.requests += u.requests
        g.done += u.done
        g.prompt_tokens += u.prompt_tokens
        g.cached_tokens += u.cached_tokens
        if u.worker and u.worker not in g.workers:
            g.workers.append(u.worker)
    return sorted(groups.values(), key=lambda g: (g.prefix_key == NO_GROUP, -g.requests, g.prefix_key))


def units_json(units: list[UnitFigures]) -> list[dict]:
    return [{**asdict(u), "hit_rate": round(u.hit_rate, 4)} for u in units]


def job_prefix_report(ctx: AppContext, job_id: str) -> dict:
    units = unit_figures(ctx, job_id)
    return {"groups": [g.to_dict() for g in group_figures(units)], "units": units_json(units)}


def unit_summary(ctx: AppContext, unit_id: str) -> tuple[str, int]:
    """A finished unit's prefix key and the tokens it computed (uncached prompt plus completion)."""
    with ctx.sessions() as session:
        unit = session.get(WorkUnit, unit_id)
        if unit is None:
            return "", 0
        if unit.status != UnitStatus.DONE:
            return unit.prefix_key, 0
        work = session.scalar(select(func.sum(work_tokens(Request.prompt_tokens, Request.completion_tokens,
                                                          Request.cached_tokens))).where(Request.unit_id == unit_id))
    return unit.prefix_key, int(work or 0)
