"""How many requests a unit holds: a deep backlog gets bigger units, a short one keeps the base size.

A unit costs the job system about the same whatever it holds (its input and results files, its claim, start and
commit, its message: 30-50 ms of a 2-core worker), so per request it is cheapest in big units. Small units spread
a short batch over every worker and rerun less after a crash. So units grow, in whole multiples of the base size,
only while every worker still gets UNITS_PER_WORKER of them; the token budget (max_tokens_per_unit) still closes a
unit of long requests early, so only short requests fill grown units.
"""
from __future__ import annotations

from dataclasses import replace

from batchinfer.planner.types import PlannerConfig

UNITS_PER_WORKER = 16


def sized_for(config: PlannerConfig, pending: int, workers: int) -> PlannerConfig:
    """The config for planning `pending` requests over `workers` workers (at least one)."""
    base = config.max_requests_per_unit
    steps = min(config.unit_growth, pending // (max(workers, 1) * UNITS_PER_WORKER * base))
    return replace(config, max_requests_per_unit=base * steps) if steps > 1 else config
