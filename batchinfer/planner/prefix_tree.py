"""A radix tree over prompt tokens, cut at KV block boundaries: the prefix structure the planner
groups and orders requests by.

Two requests share a node exactly when the engine could share those KV blocks between them
(only full blocks are shared, as in the engine, and only within one cache scope: the root has one
child per scope, at depth 0, and every prefix hangs under its request's scope). Edges hold runs of whole blocks, so a request
that follows a long shared system prompt costs one tuple comparison, not one per block.
"""
from __future__ import annotations

import gc
import hashlib
from contextlib import contextmanager
from array import array

from batchinfer.planner.types import PendingRequest


class Node:
    __slots__ = ("edge", "depth", "parent", "children", "ends", "count", "cost", "savings", "first", "ordered")

    def __init__(self, edge: tuple[int, ...], depth: int, parent: Node | None):
        self.edge = edge  # token ids from the parent to this node (whole blocks)
        self.depth = depth  # tokens from the root to the end of this node
        self.parent = parent
        self.children: dict[tuple, Node] = {}  # keyed by the child's first block (the root's: by scope)
        self.ends: list[int] = []  # requests whose last full block ends here
        self.count = 0  # requests in the subtree
        self.cost = 0  # prompt + max_tokens over the subtree
        self.savings = 0  # prompt tokens served from cache in the subtree, each block computed once
        self.first = 0  # smallest request position in the subtree (earliest arrival)
        self.ordered: list[Node] = []  # children, most reuse first

    def is_branch_point(self) -> bool:
        return len(self.children) != 1 or bool(self.ends)


class PrefixTree:
    def __init__(self, requests: list[PendingRequest], block_size: int):
        self.requests = requests
        self.block_size = block_size
        self.root = Node((), 0, None)
        self.node_of: list[Node] = [self._insert(p, r.prompt_token_ids, self._scope_root(r.scope))
                                    for p, r in enumerate(requests)]
        self._annotate()

    def _scope_root(self, scope: str) -> Node:
        node = self.root.children.get((scope,))
        if node is None:
            node = self.root.children[(scope,)] = Node((), 0, self.root)
        return node

    @property
    def scope_roots(self) -> list[Node]:
        """One node per scope, most reuse first: nothing below two of them is shared."""
        return self.root.ordered

    def _insert(self, position: int, ids: tuple[int, ...], scope_root: Node) -> Node:
        bs, node, pos = self.block_size, scope_root, 0
        end = len(ids) // bs * bs
        while pos < end:
            child = node.children.get(ids[pos:pos + bs])
            if child is None:
                child = Node(ids[pos:end], end, node)
                node.children[child.edge[:bs]] = child
                node, pos = child, end
                break
            span = len(child.edge)
            if pos + span <= end and ids[pos:pos + span] == child.edge:
                node, pos = child, pos + span
                continue
            node = self._split(child, self._matched_blocks(child.edge, ids, pos, end) * bs)
            pos = node.depth
        node.ends.append(position)
        return node

    def _matched_blocks(self, edge: tuple[int, ...], ids: tuple[int, ...], pos: int, end: int) -> int:
        bs = self.block_size
        lo, hi = 1, min(len(edge), end - pos) // bs  # the first block matched already
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if ids[pos:pos + mid * bs] == edge[:mid * bs]:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _split(self, child: Node, at: int) -> Node:
        parent = child.parent
        assert parent is not None, "only a child is split: the root has no edge"
        mid = Node(child.edge[:at], child.depth - len(child.edge) + at, parent)
        parent.children[mid.edge[:self.block_size]] = mid
        child.edge, child.parent = child.edge[at:], mid
        mid.children[child.edge[:self.block_size]] = child
        return mid

    def preorder(self) -> list[Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def _annotate(self) -> None:
        costs = [r.cost for r in self.requests]
        for node in reversed(self.preorder()):
            ends = node.ends
            count, cost = len(ends), sum([costs[p] for p in ends])
            first = ends[0] if ends else len(costs)
            savings = 0
            if node.children:
                kids = list(node.children.values())
                for k in kids:
                    count += k.count
                    cost += k.cost
                    savings += k.savings
                    first = min(first, k.first)
                node.ordered = sorted(kids, key=_reuse_first) if len(kids) > 1 else kids
            node.count, node.cost, node.first = count, cost, first
            node.savings = savings + len(node.edge) * (count - 1)

    def expected_cached_tokens(self) -> int:
        """Prompt tokens served from cache when every distinct block is computed once."""
        return self.root.savings

    def leaves_in_order(self, node: Node) -> list[int]:
        """Request positions under node in depth-first order (most reuse first)."""
        out, stack = [], [node]
        while stack:
            cur = stack.pop()
            out.extend(cur.ends)
            stack.extend(reversed(cur.ordered))
        return out

    def cached_in_order(self, positions: list[int]) -> list[int]:
        """Full-block tokens each request finds cached when requests run in this order and every
        block, once computed, stays cached (the optimum a prefix cache can reach)."""
        seen: set[int] = {id(self.root)}
        out = []
        for p in positions:
            node = self.node_of[p]
            while id(node) not in seen:
                seen.add(id(node))
                assert node.parent is not None, "the walk ends at the root, which is seen"
                node = node.parent
            out.append(node.depth)
        return out


def _reuse_first(node: Node) -> tuple[int, int]:
    return -node.savings, node.first


def prefix_key(token_ids: tuple[int, ...] | list[int], scope: str = "") -> str:
    """Stable routing key of a token prefix in a cache scope (the same in every process and plan)."""
    if not token_ids:
        return ""
    salt = scope.encode() + b"\0" if scope else b""
    return hashlib.blake2b(salt + array("q", token_ids).tobytes(), digest_size=8).hexdigest()


@contextmanager
def gc_paused():
    """Planning allocates about one tree node per request; pausing the cyclic collector meanwhile
    keeps it from rescanning every prompt tuple again and again (it collects the tree later)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
