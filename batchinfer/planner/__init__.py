"""Cut the pending requests of queued jobs into work units.

With grouping (the default) the requests of one model, across all queued jobs, are put in a
prefix tree over KV blocks; units keep prefix groups together, follow the tree depth first (most
prefix reuse first), and carry the group's prefix_key so routing can send a group to the worker
that holds its prefix. Priority classes run in order and jobs share each class fairly
(planner.fairness). grouping=False is first come, first served, for comparison. Either way a unit
holds requests of one cache scope only (PendingRequest.scope): tenants that do not share a scope
never share a unit, a group or an expected cache hit. Requests of different LoRA adapters
(PendingRequest.adapter) never share a group or an expected cache hit either, but may share a unit.
"""
from __future__ import annotations

from batchinfer.planner.estimate import PlanEstimate, estimate_plan
from batchinfer.planner.fairness import fair_order, priority_classes
from batchinfer.planner.grouping import Grouping, UnitPacker
from batchinfer.planner.prefix_tree import PrefixTree, gc_paused, prefix_key
from batchinfer.planner.types import PendingRequest, PlannerConfig, UnitPlan
from batchinfer.planner.unit_size import sized_for

__all__ = ["PendingRequest", "PlannerConfig", "UnitPlan", "PlanEstimate", "plan_units", "estimate_plan", "sized_for",
           "prefix_key"]


def plan_units(pending: list[PendingRequest], config: PlannerConfig) -> list[UnitPlan]:
    with gc_paused():
        if not config.grouping:
            return _first_come_first_served(pending, config)
        units: list[UnitPlan] = []
        for members in priority_classes(pending, config):
            units.extend(_plan_class(members, config))
        return units


def _plan_class(pending: list[PendingRequest], config: PlannerConfig) -> list[UnitPlan]:
    pending = sorted(pending, key=lambda r: (r.submitted_at, r.job_id, r.index))
    tree = PrefixTree(pending, config.block_size)
    grouping = Grouping(tree, config)
    packed = UnitPacker(grouping, config).pack()
    position = {id(pending[p]): p for unit in packed for p in unit}
    units = []
    for requests in fair_order([[pending[p] for p in unit] for unit in packed]):
        positions = [position[id(r)] for r in requests]
        units.append(_unit_plan(requests, [grouping.group_of[p] for p in positions]))
    _set_expected_cached(units, tree, position)
    return units


def _unit_plan(requests: list[PendingRequest], groups: list) -> UnitPlan:
    """The unit routes by the group holding most of its prompt tokens ("" when that is no group)."""
    weight: dict[int, int] = {}
    for req, group in zip(requests, groups):
        weight[id(group)] = weight.get(id(group), 0) + len(req.prompt_token_ids)
    dominant = max(groups, key=lambda g: weight[id(g)])
    if dominant is None:
        return UnitPlan(requests, "", 0)
    return UnitPlan(requests, dominant.key, dominant.prefix_len, adapter=dominant.adapter)


def _set_expected_cached(units: list[UnitPlan], tree: PrefixTree, position: dict[int, int]) -> None:
    """Attribute the optimum (each distinct block computed once, in emission order) to units."""
    cached = iter(tree.cached_in_order([position[id(r)] for unit in units for r in unit.requests]))
    for unit in units:
        unit.expected_cached_tokens = sum(min(next(cached), max(len(r.prompt_token_ids) - 1, 0))
                                          for r in unit.requests)


def _first_come_first_served(pending: list[PendingRequest], config: PlannerConfig) -> list[UnitPlan]:
    """In arrival order, one open unit per cache scope."""
    ordered = sorted(pending, key=lambda r: (-r.priority, r.submitted_at, r.job_id, r.index))
    units: list[UnitPlan] = []
    open_units: dict[str, tuple[list[PendingRequest], int]] = {}
    for req in ordered:
        current, tokens = open_units.get(req.scope, ([], 0))
        if current and (len(current) >= config.max_requests_per_unit or tokens + req.cost > config.max_tokens_per_unit):
            units.append(UnitPlan(current, ""))
            current, tokens = [], 0
        current.append(req)
        open_units[req.scope] = current, tokens + req.cost
    units.extend(UnitPlan(current, "") for current, _ in open_units.values())
    tree = PrefixTree(ordered, config.block_size)
    _set_expected_cached(units, tree, {id(r): p for p, r in enumerate(ordered)})
    return units
