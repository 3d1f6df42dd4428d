"""What the planner takes (pending requests of queued jobs) and gives (work units)."""
from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field


def token_array(ids: Sequence[int]) -> array:
    """Prompt token ids as the planner and dispatch keep them: 4 bytes a token, where a tuple or list of
    Python ints costs about 36 (token ids fit in 32 bits; a larger one raises OverflowError)."""
    return ids if isinstance(ids, array) and ids.typecode == "i" else array("i", ids)


@dataclass(frozen=True)
class PendingRequest:
    job_id: str
    index: int  # position among the job's valid requests (input order)
    prompt_token_ids: Sequence[int]  # token_array() from a prepared record; a tuple works the same
    max_tokens: int
    priority: int = 0  # higher runs first
    submitted_at: float = 0.0  # the job's queued time, wall clock
    scope: str = ""  # the job's cache scope: requests of different scopes never share a unit, group or block
    n: int = 1  # samples: the prompt is computed once, each sample may generate max_tokens
    adapter: str = ""  # the LoRA adapter the line names ("": the base): only one adapter's requests share a group

    @property
    def new_tokens(self) -> int:
        """The most the request may generate, every sample counted."""
        return self.n * self.max_tokens

    @property
    def cost(self) -> int:
        """Tokens the request can occupy: its prompt plus the most it may generate."""
        return len(self.prompt_token_ids) + self.new_tokens


@dataclass
class UnitPlan:
    requests: list[PendingRequest]  # in the order the engine should receive them
    prefix_key: str  # routing key: hash of the prefix group's shared blocks; "" = no group worth routing
    shared_prefix_len: int = 0  # tokens of the group prefix (prefix_key) that the unit's grouped requests share
    expected_cached_tokens: int = 0  # prompt tokens a warm prefix cache serves (every distinct block once)
    adapter: str = ""  # the adapter of the group it routes by ("": the base's, or no group)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(r.prompt_token_ids) for r in self.requests)

    @property
    def cost(self) -> int:
        return sum(r.cost for r in self.requests)

    @property
    def job_ids(self) -> list[str]:
        return sorted({r.job_id for r in self.requests})


@dataclass
class PlannerConfig:
    max_requests_per_unit: int = 64
    max_tokens_per_unit: int = 65536  # prompt + max_tokens summed over the unit
    unit_growth: int = 1  # a deep backlog's units hold up to this many times max_requests_per_unit (unit_size)
    block_size: int = 16  # prefixes are shared in whole KV blocks: the runtime sets the engine's (planner_config)
    grouping: bool = True  # False: first come, first served
    min_group_prefix_tokens: int = 64  # a prefix group must add at least this many shared tokens
    min_group_requests: int = 2
    min_unit_fill: float = 0.5  # below this fill a unit takes part of a subtree rather than closing early
    group_own_unit_fill: float = 0.25  # a group this big (fraction of a unit) never shares a unit
    priority_aging_s: float = 0.0  # > 0: a job gains one priority level per this many seconds queued
    now: float | None = None  # reference time for aging (None: time.time())
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("max_requests_per_unit", "max_tokens_per_unit", "block_size", "min_group_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"PlannerConfig.{name} must be >= 1")
        if self.min_group_prefix_tokens < 0:
            raise ValueError("PlannerConfig.min_group_prefix_tokens must be >= 0")
        for name in ("min_unit_fill", "group_own_unit_fill"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"PlannerConfig.{name} must be in [0, 1]")
        if self.priority_aging_s < 0:
            raise ValueError("PlannerConfig.priority_aging_s must be >= 0")
