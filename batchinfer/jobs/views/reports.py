"""Prefix-cache figures of a job, per work unit and per prefix group: cached prompt tokens / prompt
tokens, and progress by group (for `batchinfer status`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from sqlalchemy import case, func, select

from batchinfer.context import AppContext
from batchinfer.db.models import Request, RequestStatus, UnitStatus, WorkUnit

NO_GROUP = "(no group)"


@dataclass
class UnitFigures:
    unit_id: str
    prefix_key: str
    shared_prefix_len: int
    status: str
    worker: str | None
    adapter: str | None  # its prefix group's LoRA adapter; None: the base's (or no group)
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
    adapter: str | None = None  # the LoRA adapter its lines name; None: the base
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
    stored on the request rows at commit, summed in SQL). One grouped query: a job of a busy system spans
    hundreds of units, and `status` asks this on every poll."""
    finished = Request.status.in_((RequestStatus.COMPLETED, RequestStatus.FAILED))
    unit = (Request.unit_id, WorkUnit.prefix_key, WorkUnit.shared_prefix_len, WorkUnit.status, WorkUnit.worker,
            WorkUnit.adapter)
    query = (select(*unit, func.count(), func.sum(case((finished, 1), else_=0)),
                    func.sum(case((finished, Request.prompt_tokens), else_=0)),
                    func.sum(case((finished, Request.cached_tokens), else_=0)))
             .join(WorkUnit, WorkUnit.id == Request.unit_id).where(Request.job_id == job_id)
             .group_by(*unit))
    with ctx.sessions() as session:
        rows = sorted(session.execute(query).all(), key=lambda row: row[0])  # Python's order, not the collation's
    return [UnitFigures(*row[:6], *(int(n or 0) for n in row[6:])) for row in rows]


def group_figures(units: list[UnitFigures]) -> list[GroupFigures]:
    groups: dict[str, GroupFigures] = {}
    for u in units:
        key = u.prefix_key or NO_GROUP
        g = groups.setdefault(key, GroupFigures(key, u.shared_prefix_len, u.adapter if u.prefix_key else None))
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
    return [{**vars(u), "hit_rate": round(u.hit_rate, 4)} for u in units]  # flat: asdict's deep copy costs ms


def job_prefix_report(ctx: AppContext, job_id: str) -> dict:
    units = unit_figures(ctx, job_id)
    return {"groups": [g.to_dict() for g in group_figures(units)], "units": units_json(units)}

