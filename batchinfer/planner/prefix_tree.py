"""A radix tree over prompt tokens, cut at KV block boundaries: the prefix structure the planner
groups and orders requests by.

Two requests share a node exactly when the engine could share those KV blocks between them
(only full blocks are shared, as in the engine, and only within one cache scope and one LoRA adapter: the root
has one child per scope, each scope one child per adapter ("" for the base), all at depth 0, and every prefix hangs
under its request's adapter in its scope: an adapter changes K and V, so the engine keys blocks by it). Edges hold
runs of whole blocks, so a request that follows a long shared system prompt costs one comparison, not one per block.

The tree copies no token ids: each request's ids are one array('i') (4 bytes a token; a tuple of Python ints
costs about 36), a node's edge is a slice of the ids of a request that passes through it (`src`), and only a
child's first block is copied, as the bytes it is looked up by. A 200 MB batch holds ~20 million pending tokens.
"""
from __future__ import annotations

import gc
import hashlib
from array import array
from collections.abc import Sequence
from contextlib import contextmanager

from batchinfer.planner.types import PendingRequest, token_array


class Node:
    __slots__ = ("src", "depth", "parent", "children", "ends", "count", "cost", "savings", "first", "ordered")

    def __init__(self, src: array, depth: int, parent: Node | None):
        self.src = src  # ids of a request through this node: its edge is src[parent.depth:depth] (whole blocks)
        self.depth = depth  # tokens from the root to the end of this node
        self.parent = parent
        self.children: dict[object, Node] = {}  # by the child's first block, as bytes (a scope's: by adapter)
        self.ends: list[int] = []  # requests whose last full block ends here
        self.count = 0  # requests in the subtree
        self.cost = 0  # prompt + max_tokens over the subtree
        self.savings = 0  # prompt tokens served from cache in the subtree, each block computed once
        self.first = 0  # smallest request position in the subtree (earliest arrival)
        self.ordered: list[Node] = []  # children, most reuse first

    @property
    def edge_len(self) -> int:
        return self.depth - self.parent.depth if self.parent else 0

    def is_branch_point(self) -> bool:
        return len(self.children) != 1 or bool(self.ends)


_NO_IDS = array("i")


class PrefixTree:
    def __init__(self, requests: list[PendingRequest], block_size: int):
        self.requests = requests
        self.block_size = block_size
        self.root = Node(_NO_IDS, 0, None)
        self.node_of: list[Node] = [self._insert(p, token_array(r.prompt_token_ids), self._adapter_root(r))
                                    for p, r in enumerate(requests)]
        self._annotate()

    def _adapter_root(self, request: PendingRequest) -> Node:
        """The depth-0 node the request's prefixes hang under: its adapter's, under its scope's."""
        return _child_at_zero(_child_at_zero(self.root, (request.scope,)), (request.adapter,))

    @property
    def scope_roots(self) -> list[Node]:
        """One node per scope, most reuse first: nothing below two of them is shared."""
        return self.root.ordered

    def _block(self, ids: array, pos: int) -> bytes:
        return ids[pos:pos + self.block_size].tobytes()

    def _insert(self, position: int, ids: array, scope_root: Node) -> Node:
        bs, node, pos = self.block_size, scope_root, 0  # node.depth == pos throughout
        end = len(ids) // bs * bs
        while pos < end:
            child = node.children.get(self._block(ids, pos))
            if child is None:
                child = Node(ids, end, node)
                node.children[self._block(ids, pos)] = child
                node, pos = child, end
                break
            if child.depth <= end and ids[pos:child.depth] == child.src[pos:child.depth]:
                node, pos = child, child.depth
                continue
            node = self._split(child, self._matched_blocks(child, ids, pos, end) * bs)
            pos = node.depth
        node.ends.append(position)
        return node

    def _matched_blocks(self, child: Node, ids: array, pos: int, end: int) -> int:
        bs, edge = self.block_size, child.src
        lo, hi = 1, (min(child.depth, end) - pos) // bs  # the first block matched already
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if ids[pos:pos + mid * bs] == edge[pos:pos + mid * bs]:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _split(self, child: Node, at: int) -> Node:
        parent = child.parent
        assert parent is not None, "only a child is split: the root has no edge"
        mid = Node(child.src, parent.depth + at, parent)
        parent.children[self._block(child.src, parent.depth)] = mid  # the child's key: it keeps its place
        child.parent = mid
        mid.children[self._block(child.src, mid.depth)] = child
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
            node.savings = savings + node.edge_len * (count - 1)

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


def _child_at_zero(parent: Node, key: tuple[str]) -> Node:
    node = parent.children.get(key)
    if node is None:
        node = parent.children[key] = Node(_NO_IDS, 0, parent)
    return node


def _reuse_first(node: Node) -> tuple[int, int]:
    return -node.savings, node.first


def prefix_key(token_ids: Sequence[int], scope: str = "", adapter: str = "") -> str:
    """Stable routing key of a token prefix in a cache scope, for an adapter ("": the base), the same in every
    process and plan."""
    if not token_ids:
        return ""
    salt = scope.encode() + b"\0" if scope else b""
    salt += b"\0lora\0" + adapter.encode() + b"\0" if adapter else b""  # the base's keys are as they were
    return hashlib.blake2b(salt + array("q", token_ids).tobytes(), digest_size=8).hexdigest()


@contextmanager
def gc_paused():
    """Planning allocates about one tree node per request; pausing the cyclic collector meanwhile
    keeps it from rescanning every node and request again and again (it collects the tree later)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
