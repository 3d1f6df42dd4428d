"""A dispatch under the dispatch lock, in rounds: plan what is pending, send each batch of units as soon as it is
committed, renew the lock at each batch, then queue the next round (jobs.dispatch.rounds) behind the units sent."""
from __future__ import annotations

import logging
import time
from typing import Callable

from redis.exceptions import LockError, LockNotOwnedError

from batchinfer.cluster.registry import open_registry
from batchinfer.context import AppContext
from batchinfer.jobs.dispatch import rounds
from batchinfer.jobs.dispatch.planning import DispatchedUnit, dispatch
from batchinfer.runtime.commands.sender import Sender

log = logging.getLogger(__name__)
OnUnits = Callable[[list[DispatchedUnit]], None]
Plan = Callable[[OnUnits, int | None], list[DispatchedUnit]]  # (on_units, max_units) -> the units persisted


class DispatchLockLost(Exception):
    """The dispatch lock expired under a running dispatch: it stops at the batch it just sent."""


class DispatchRound:
    """round_no None (the sweep's dispatch of lost work): the whole plan, no round after it. A lock that stays held
    past its wait is not an error: its holder is planning what is pending, and the sweep dispatches what is left."""

    def __init__(self, ctx: AppContext, sender: Sender, incarnation: str | None = None, round_no: int | None = None,
                 plan: Plan | None = None):
        self.ctx, self.sender, self.incarnation, self.round_no = ctx, sender, incarnation, round_no
        self.plan = plan or self._plan
        self.registry = open_registry(ctx.settings)

    def run(self) -> int:
        """The units sent."""
        lock = self.registry.dispatch_lock()
        # the holder's incarnation as the token: the sweep leaves a live dispatcher's unsent units alone
        if not lock.acquire(token=self.incarnation):
            log.info("dispatch skipped: another dispatcher still holds the lock; the sweep dispatches what it leaves")
            return 0
        began = time.monotonic()  # the round's own length, not its wait for the lock
        sent: list[DispatchedUnit] = []

        def send_and_renew(batch: list[DispatchedUnit]) -> None:
            for unit in batch:  # each batch sent once committed: the first run early
                self.sender.unit(unit.unit_id, unit.queue, unit.level)
            sent.extend(batch)
            try:  # a long dispatch keeps its lock; a wedged one stops renewing and loses it
                lock.reacquire()
            except LockNotOwnedError as exc:
                raise DispatchLockLost() from exc

        try:
            self.plan(send_and_renew, rounds.round_units(self.round_no))
        except DispatchLockLost:  # claims stay safe without it (one transaction each); the holder plans the rest
            log.warning("dispatch stopped after %d units: its lock expired and another dispatcher may hold it", len(sent))
            return len(sent)
        finally:
            try:
                lock.release()
            except LockError:  # held past its timeout: it has expired by itself
                pass
        log.info("dispatched %d units (round %s)", len(sent), self.round_no)
        if self.round_no is not None:
            self._chain(bool(sent), time.monotonic() - began)
        return len(sent)

    def _plan(self, on_units: OnUnits, max_units: int | None) -> list[DispatchedUnit]:
        """Planned and routed on the registry's view of the live workers."""
        loads = self.registry.loads()
        return dispatch(self.ctx, [w.name for w in loads], worker_loads=loads, on_units=on_units, max_units=max_units)

    def _chain(self, sent: bool, round_s: float) -> None:
        assert self.round_no is not None
        after = rounds.next_round(self.ctx, self.round_no, sent, round_s)
        if after is None:
            return
        if after.waits and not self.registry.due("stream-round-wait", rounds.STREAM_WAIT_S * 0.9):
            return  # another chain already waits for the file's next rows
        self.sender.dispatch(after.round_no, after.countdown)
