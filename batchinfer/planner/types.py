"""What the planner takes (pending requests of queued jobs) and gives (work units)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PendingRequest:
    job_id: str
    index: int  # position among the job's valid requests (input order)
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    priority: int = 0  # higher runs first
    submitted_at: float = 0.0  # the job's queued time, wall clock


@dataclass
class UnitPlan:
    requests: list[PendingRequest]  # in the order the engine should receive them
    prefix_key: str  # routing key: a hash of the prefix this unit's requests share
    shared_prefix_len: int = 0

    @property
    def prompt_tokens(self) -> int:
        return sum(len(r.prompt_token_ids) for r in self.requests)


@dataclass
class PlannerConfig:
    max_requests_per_unit: int = 64
    max_tokens_per_unit: int = 65536  # prompt + max_tokens summed over the unit
    block_size: int = 16
    grouping: bool = True  # False: first come, first served
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("max_requests_per_unit", "max_tokens_per_unit", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"PlannerConfig.{name} must be >= 1")
