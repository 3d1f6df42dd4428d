"""Find prefix groups in a PrefixTree and cut the tree into work units that keep groups together.

A prefix group is a branch point of the trie whose shared prefix adds at least
min_group_prefix_tokens to the group above it and that holds at least min_group_requests
requests: a system prompt (or a long document) that several requests, of any job, start with. A group
holds one cache scope's requests of one adapter (the tree keeps them apart): the engine shares no KV across them.
A request belongs to its deepest group; its routing key is that group's prefix_key.
"""
from __future__ import annotations

from dataclasses import dataclass

from batchinfer.planner.prefix_tree import Node, PrefixTree, prefix_key
from batchinfer.planner.types import PlannerConfig


@dataclass
class Group:
    key: str
    prefix_len: int  # tokens
    node: Node
    adapter: str = ""  # its requests' LoRA adapter ("": the base)


class Grouping:
    def __init__(self, tree: PrefixTree, config: PlannerConfig):
        self.tree = tree
        self.config = config
        self.group_at: dict[int, Group] = {}  # id(node) -> group rooted there
        self.group_of: list[Group | None] = [None] * len(tree.requests)
        self._find_groups()

    def _find_groups(self) -> None:
        cfg = self.config
        stack: list[tuple[Node, Group | None]] = [(self.tree.root, None)]
        while stack:
            node, group = stack.pop()
            above = group.prefix_len if group else 0
            if (node.depth and node.is_branch_point() and node.count >= cfg.min_group_requests
                    and node.depth - above >= max(cfg.min_group_prefix_tokens, 1)):
                group = self._make_group(node)
            for position in node.ends:
                self.group_of[position] = group
            stack.extend((child, group) for child in node.children.values())

    def _make_group(self, node: Node) -> Group:
        length, first = node.depth, self.tree.requests[node.first]
        group = Group(prefix_key(first.prompt_token_ids[:length], first.scope, first.adapter), length, node,
                      first.adapter)
        self.group_at[id(node)] = group
        return group

    @property
    def groups(self) -> list[Group]:
        return list(self.group_at.values())


class UnitPacker:
    """Depth-first packing, one cache scope after another (a unit never mixes scopes; it may mix adapters, whose
    lines run in the same engine steps, but never cuts through a group). A group holding
    at least group_own_unit_fill of a unit gets units of its own (evenly sized when it needs several), so
    units are the grain routing spreads over workers; smaller groups share units but are never split;
    other subtrees are split rather than closing a unit below min_unit_fill."""

    def __init__(self, grouping: Grouping, config: PlannerConfig):
        self.grouping = grouping
        self.tree = grouping.tree
        self.config = config
        self.units: list[list[int]] = []
        self._current: list[int] = []
        self._cost = 0

    def pack(self) -> list[list[int]]:
        for scope_root in self.tree.scope_roots:
            self._pack(scope_root)
            self._flush()
        return self.units

    def _pack(self, node: Node) -> None:
        while len(node.children) == 1 and not node.ends and id(node) not in self.grouping.group_at:
            node = next(iter(node.children.values()))
        is_group = id(node) in self.grouping.group_at
        if is_group and self._fill_of(node.count, node.cost) >= self.config.group_own_unit_fill:
            self._pack_own_units(node)
            return
        if self._fits(node.count, node.cost):
            self._add_all(node)
            return
        if self._fits_empty(node.count, node.cost) and (is_group or self._fill() >= self.config.min_unit_fill):
            self._flush()
            self._add_all(node)
            return
        self._pack_children(node)

    def _pack_children(self, node: Node) -> None:
        for position in node.ends:
            self._add(position)
        for child in node.ordered:
            self._pack(child)

    def _pack_own_units(self, node: Node) -> None:
        self._flush()
        first = len(self.units)
        if self._fits_empty(node.count, node.cost):
            self._add_all(node)
        else:
            self._pack_children(node)
        self._flush()
        if len(self.units) - first >= 2:
            self._even_last_two()

    def _even_last_two(self) -> None:
        """A group's last unit is often a small remainder: share the last two units' requests evenly."""
        cost = self.tree.requests
        joined = self.units[-2] + self.units[-1]
        total, acc, cut = sum(cost[p].cost for p in joined), 0, 0
        while cut < len(joined) - 1 and (acc + cost[joined[cut]].cost) * 2 <= total:
            acc += cost[joined[cut]].cost
            cut += 1
        cut = max(cut, 1)
        halves = joined[:cut], joined[cut:]
        if all(self._fits_empty(len(h), sum(cost[p].cost for p in h)) for h in halves):
            self.units[-2:] = [list(halves[0]), list(halves[1])]

    def _add_all(self, node: Node) -> None:
        for position in self.tree.leaves_in_order(node):
            self._add(position)

    def _add(self, position: int) -> None:
        cost = self.tree.requests[position].cost
        if not self._fits(1, cost):
            self._flush()
        self._current.append(position)
        self._cost += cost

    def _fits(self, count: int, cost: int) -> bool:
        cfg = self.config
        return (len(self._current) + count <= cfg.max_requests_per_unit
                and (self._cost + cost <= cfg.max_tokens_per_unit or not self._current and count == 1))

    def _fits_empty(self, count: int, cost: int) -> bool:
        return count <= self.config.max_requests_per_unit and cost <= self.config.max_tokens_per_unit

    def _fill_of(self, count: int, cost: int) -> float:
        cfg = self.config
        return max(count / cfg.max_requests_per_unit, cost / cfg.max_tokens_per_unit)

    def _fill(self) -> float:
        return self._fill_of(len(self._current), self._cost)

    def _flush(self) -> None:
        if self._current:
            self.units.append(self._current)
            self._current, self._cost = [], 0
