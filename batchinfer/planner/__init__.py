"""Cut the pending requests of queued jobs into work units.

This first version is first come, first served; prefix grouping replaces it (issue 4).
"""
from __future__ import annotations

import hashlib

from batchinfer.planner.types import PendingRequest, PlannerConfig, UnitPlan

__all__ = ["PendingRequest", "PlannerConfig", "UnitPlan", "plan_units"]


def _prefix_key(req: PendingRequest, block_size: int) -> str:
    head = req.prompt_token_ids[:block_size]
    return hashlib.sha1(repr(head).encode()).hexdigest()[:16]


def plan_units(pending: list[PendingRequest], config: PlannerConfig) -> list[UnitPlan]:
    ordered = sorted(pending, key=lambda r: (-r.priority, r.submitted_at, r.job_id, r.index))
    units: list[UnitPlan] = []
    current: list[PendingRequest] = []
    tokens = 0
    for req in ordered:
        cost = len(req.prompt_token_ids) + req.max_tokens
        if current and (len(current) >= config.max_requests_per_unit or tokens + cost > config.max_tokens_per_unit):
            units.append(UnitPlan(current, _prefix_key(current[0], config.block_size)))
            current, tokens = [], 0
        current.append(req)
        tokens += cost
    if current:
        units.append(UnitPlan(current, _prefix_key(current[0], config.block_size)))
    return units
