"""Paged KV blocks: allocation, reference counts, and a prefix cache keyed by a content hash chain.

Every block is in exactly one state: free (ref 0, no hash), used (ref > 0) or cached (ref 0 but its
hash is registered, so a later request with the same prefix can lock it again). Cached blocks are
evicted least recently used when the free list runs dry. A forked sequence (n samples of one prompt)
shares its parent's blocks, the partial last one too: the first write into a shared partial block
copies it (copy on write; the runner applies take_copies() before the step's forward pass).
Plain Python: no torch, no device.
"""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Collection

from ..lora.request import LoRARequest
from ..scheduler.sequence import Sequence


def block_hash(parent: bytes, token_ids: list[int]) -> bytes:
    """Hash of one full block, chained to its parent so equal hashes mean equal whole prefixes."""
    return hashlib.blake2b(parent + array("q", token_ids).tobytes(), digest_size=16).digest()


def salt_root(cache_salt: str | None, lora_request: LoRARequest | None = None) -> bytes:
    """The parent of a sequence's first block (as vLLM's cache_salt): every hash of the chain depends on
    the salt and the adapter, so requests with different salts or adapters never match each other's blocks
    (an adapter changes K and V from the first layer it adapts). No salt and no adapter: b"" (the base's)."""
    if not cache_salt and lora_request is None:
        return b""
    adapter = b"" if lora_request is None else b"\0lora\0" + lora_request.lora_name.encode()
    return hashlib.blake2b(b"cache_salt\0" + (cache_salt or "").encode() + adapter, digest_size=16).digest()


class Block:
    __slots__ = ("block_id", "ref_count", "hash")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: bytes | None = None


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 share_embed_prefix: bool = True):
        if num_blocks < 1:
            raise ValueError(f"need at least one KV block, got {num_blocks}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.share_embed_prefix = share_embed_prefix  # False under mean pooling: it needs every token's hidden state
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.cached_block_ids: OrderedDict[int, None] = OrderedDict()  # evictable, oldest first
        self.hash_to_block_id: dict[bytes, int] = {}
        self.num_evictions = 0
        self.pending_copies: list[tuple[int, int]] = []  # (src, dst) block copies the next step needs first
        self.num_forked_blocks = 0  # block references handed to forked sequences instead of computed again
        self.num_cow_copies = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_available_blocks(self) -> int:
        return len(self.free_block_ids) + len(self.cached_block_ids)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # prefix cache ---------------------------------------------------------------------------------

    def full_block_hashes(self, seq: Sequence, num_tokens: int) -> list[bytes]:
        """The hash chain of seq's full blocks within its first num_tokens tokens (memoized on seq)."""
        bs, hashes = self.block_size, seq.block_hashes
        while len(hashes) < num_tokens // bs:
            i = len(hashes)
            parent = hashes[-1] if hashes else salt_root(seq.cache_salt, seq.lora_request)
            hashes.append(block_hash(parent, seq.token_ids[i * bs:(i + 1) * bs]))
        return hashes[:num_tokens // bs]

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding seq's longest known prefix, leaving at least one token to compute.
        Matching does not lock: call allocate_prefix before anything else can evict them."""
        if not self.enable_prefix_caching or seq.sampling.embed and not self.share_embed_prefix:
            return []
        hits = []
        for h in self.full_block_hashes(seq, len(seq) - 1):
            block_id = self.hash_to_block_id.get(h)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    # allocation -----------------------------------------------------------------------------------

    def can_allocate(self, seq: Sequence, num_new_tokens: int, prefix_hits: Collection[int] = (), reserve: int = 0) -> bool:
        """Whether seq (holding its block table, or about to lock prefix_hits) can grow by num_new_tokens
        and still leave `reserve` blocks available."""
        held = len(seq.block_table) or len(prefix_hits)
        computed = seq.num_computed_tokens if seq.block_table else len(prefix_hits) * self.block_size
        needed = self.blocks_for(computed + num_new_tokens) - held + (self._shared_partial(seq) is not None)
        locked_from_cache = sum(1 for b in prefix_hits if self.blocks[b].ref_count == 0)
        return needed + reserve <= self.num_available_blocks - locked_from_cache

    def allocate_prefix(self, seq: Sequence, prefix_hits: list[int]) -> None:
        assert not seq.block_table, f"{seq} already holds blocks"
        for block_id in prefix_hits:
            self._lock(block_id)
        seq.block_table = list(prefix_hits)
        seq.num_computed_tokens = len(prefix_hits) * self.block_size

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        """Give seq blocks for its next num_new_tokens tokens and register the blocks they fill.
        Registering before the forward pass is safe: the step writes each layer's K/V before any
        sequence reads it, so another sequence of the same step may already share these blocks."""
        end = seq.num_computed_tokens + num_new_tokens
        self._copy_on_write(seq)
        while len(seq.block_table) < self.blocks_for(end):
            seq.block_table.append(self._take_free_block())
        if self.enable_prefix_caching:
            self._register_full_blocks(seq, seq.num_computed_tokens // self.block_size, end)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """child takes parent's blocks and computed tokens by reference: nothing is computed or copied now."""
        assert not child.block_table, f"{child} already holds blocks"
        for block_id in parent.block_table:
            self._lock(block_id)
        child.block_table = list(parent.block_table)
        child.num_computed_tokens = parent.num_computed_tokens
        child.block_hashes = list(parent.block_hashes)  # the same prompt blocks: the same hash chain
        self.num_forked_blocks += len(parent.block_table)

    def take_copies(self) -> list[tuple[int, int]]:
        """The (src, dst) block copies this step's allocations made: apply them before the forward pass."""
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def free(self, seq: Sequence) -> None:
        # Release the tail first so it is evicted before the prefix it depends on.
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []
        seq.num_computed_tokens = 0

    # internals ------------------------------------------------------------------------------------

    def _shared_partial(self, seq: Sequence) -> int | None:
        """The block seq writes next when it is partly filled and shared (only forks share one), else None."""
        index, offset = divmod(seq.num_computed_tokens, self.block_size)
        if not offset or index >= len(seq.block_table):
            return None
        block_id = seq.block_table[index]
        return block_id if self.blocks[block_id].ref_count > 1 else None

    def _copy_on_write(self, seq: Sequence) -> None:
        shared = self._shared_partial(seq)
        if shared is None:
            return
        # Copying before the forward pass is safe: the source keeps a holder, and no write lands before it.
        new = self._take_free_block()
        self._release(shared)
        seq.block_table[seq.num_computed_tokens // self.block_size] = new
        self.pending_copies.append((shared, new))
        self.num_cow_copies += 1

    def _register_full_blocks(self, seq: Sequence, first: int, end_tokens: int) -> None:
        hashes = self.full_block_hashes(seq, end_tokens)
        for i in range(first, len(hashes)):
            block = self.blocks[seq.block_table[i]]
            if block.hash is None and hashes[i] not in self.hash_to_block_id:
                block.hash = hashes[i]
                self.hash_to_block_id[hashes[i]] = block.block_id

    def _lock(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.cached_block_ids[block_id]
        block.ref_count += 1

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        assert block.ref_count >= 0, f"block {block_id} released too often"
        if block.ref_count == 0:
            if block.hash is not None:
                self.cached_block_ids[block_id] = None
            else:
                self.free_block_ids.append(block_id)

    def _take_free_block(self) -> int:
        if self.free_block_ids:
            block_id = self.free_block_ids.popleft()
        elif self.cached_block_ids:
            block_id, _ = self.cached_block_ids.popitem(last=False)
            self._evict(block_id)
        else:
            raise RuntimeError("out of KV blocks: the scheduler must check can_allocate first")
        self.blocks[block_id].ref_count = 1
        return block_id

    def _evict(self, block_id: int) -> None:
        block = self.blocks[block_id]
        assert block.hash is not None, f"cached block {block_id} has no hash"
        del self.hash_to_block_id[block.hash]
        block.hash = None
        self.num_evictions += 1

    # integrity ------------------------------------------------------------------------------------

    def check_integrity(self, holders: list[Sequence]) -> None:
        """free + used + cached == all blocks, and every reference count equals its holders."""
        refs = [0] * self.num_blocks
        for seq in holders:
            assert len(set(seq.block_table)) == len(seq.block_table), f"{seq} holds a block twice"
            for block_id in seq.block_table:
                refs[block_id] += 1
        free, cached = set(self.free_block_ids), set(self.cached_block_ids)
        assert len(free) == len(self.free_block_ids), "a block is twice in the free list"
        used = {b.block_id for b in self.blocks if b.ref_count > 0}
        assert not (free & cached) and not (free & used) and not (cached & used), "a block is in two states"
        assert len(free) + len(used) + len(cached) == self.num_blocks, "free + used + cached != all blocks"
        for block in self.blocks:
            assert block.ref_count == refs[block.block_id], f"block {block.block_id}: ref {block.ref_count} != holders {refs[block.block_id]}"
            if block.block_id in free:
                assert block.hash is None, f"free block {block.block_id} still has a hash"
            if block.block_id in cached:
                assert block.hash is not None, f"cached block {block.block_id} has no hash"
            if block.hash is not None:
                assert self.hash_to_block_id.get(block.hash) == block.block_id, f"block {block.block_id} hash not indexed"
        assert len(self.hash_to_block_id) == sum(b.hash is not None for b in self.blocks), "stale hash entries"
