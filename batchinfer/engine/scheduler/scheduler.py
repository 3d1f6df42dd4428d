"""Continuous batching under a token budget: decodes and chunked prefills share each step.

Running sequences go first, oldest first; when blocks run out the newest running sequence is
preempted (its blocks freed, recomputed later). Waiting sequences are then admitted longest cached
prefix first, so a shared prefix is computed once and reused (SGLang's longest-prefix-match order);
a sequence passed over for `starvation_steps` steps, or one that was preempted, jumps the queue.
Plain Python: no torch, no device.
"""
from __future__ import annotations

from collections.abc import Callable

from ..kvcache.block_manager import BlockManager
from ..config import EngineConfig
from .sequence import Sequence, SequenceStatus


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager):
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.starvation_steps = config.starvation_steps
        self.max_loras = config.max_loras
        self.block_manager = block_manager
        # Admit new work only while this many blocks stay free for the running decodes (less thrashing).
        self.watermark_blocks = max(1, block_manager.num_blocks // 100)
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[Sequence]:
        """Pick this step's batch; each picked sequence's num_new_tokens says how many tokens it runs."""
        budget = self.max_num_batched_tokens
        scheduled, budget, preempted = self._schedule_running(budget)
        if not preempted:
            scheduled += self._admit_waiting(budget)
        return scheduled

    def postprocess(self, seqs: list[Sequence], sampled: dict[str, int],
                    finish_check: Callable[[Sequence], str | None]) -> list[Sequence]:
        """Fold the step's results back: advance computed counts, append sampled tokens, finish."""
        finished = []
        for seq in seqs:
            seq.num_computed_tokens += seq.num_new_tokens
            seq.num_new_tokens = 0
            token = sampled.get(seq.request_id)
            if token is None:
                continue
            seq.token_ids.append(token)
            reason = finish_check(seq)
            if reason is not None:
                self.finish(seq, reason)
                finished.append(seq)
        return finished

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        seq.status = SequenceStatus.FINISHED
        self.block_manager.free(seq)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def fork(self, parent: Sequence, children: list[Sequence]) -> None:
        """parent's place in the running queue goes to the sequences forked from it (they hold its blocks now)."""
        i = self.running.index(parent)
        self.running[i:i + 1] = children
        for child in children:
            child.status = SequenceStatus.RUNNING
        parent.status = SequenceStatus.FINISHED
        self.block_manager.free(parent)

    # running --------------------------------------------------------------------------------------

    def _schedule_running(self, budget: int) -> tuple[list[Sequence], int, bool]:
        scheduled, preempted, i = [], False, 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_uncomputed_tokens, budget)
            while not self.block_manager.can_allocate(seq, n):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status != SequenceStatus.RUNNING:
                break
            self.block_manager.allocate_slots(seq, n)
            seq.num_new_tokens = n
            scheduled.append(seq)
            budget -= n
            i += 1
        return scheduled, budget, preempted

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.insert(0, seq)

    # waiting --------------------------------------------------------------------------------------

    def _admit_waiting(self, budget: int) -> list[Sequence]:
        admitted = []
        for seq in self._waiting_order():
            # a prompt of n samples takes n seats: they all run once it is prefilled
            seats = getattr(seq, "num_samples", 1)
            if budget <= 0 or self.running and len(self.running) + seats > self.max_num_seqs:
                break
            if not self._adapter_fits(seq):
                continue
            hits = self.block_manager.match_prefix(seq)
            n = min(len(seq) - len(hits) * self.block_manager.block_size, budget)
            if not self.block_manager.can_allocate(seq, n, hits, reserve=self._reserve()):
                break
            self._admit(seq, hits, n)
            admitted.append(seq)
            budget -= n
        if admitted:
            for seq in self.waiting:
                seq.skipped_steps += 1
        return admitted

    def _adapter_fits(self, seq: Sequence) -> bool:
        """At most max_loras distinct adapters run at once (the engine holds that many loaded)."""
        if seq.lora_request is None:
            return True
        running = {s.lora_int_id for s in self.running if s.lora_request is not None}
        return seq.lora_int_id in running or len(running) < self.max_loras

    def _reserve(self) -> int:
        return self.watermark_blocks if self.running else 0

    def _waiting_order(self) -> list[Sequence]:
        """Urgent (preempted or starving) first in queue order, then longest cached prefix first."""
        urgent = [s for s in self.waiting if s.num_preemptions or s.skipped_steps >= self.starvation_steps]
        rest = [s for s in self.waiting if not (s.num_preemptions or s.skipped_steps >= self.starvation_steps)]
        if self.block_manager.enable_prefix_caching and len(rest) > 1:
            hits = {id(s): len(self.block_manager.match_prefix(s)) for s in rest}
            rest.sort(key=lambda s: -hits[id(s)])  # stable: ties keep arrival order
        return urgent + rest

    def _admit(self, seq: Sequence, hits: list[int], n: int) -> None:
        self.waiting.remove(seq)
        self.block_manager.allocate_prefix(seq, hits)
        if seq.num_cached_tokens is None:
            seq.num_cached_tokens = seq.num_computed_tokens
        self.block_manager.allocate_slots(seq, n)
        seq.num_new_tokens = n
        seq.status = SequenceStatus.RUNNING
        seq.skipped_steps = 0
        self.running.append(seq)
