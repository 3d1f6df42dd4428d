"""The round policy of a dispatch: how many units each round persists, and whether (and when) another round
follows. A round persists the first units of its plan and the next round queues behind the units it sent, so a
worker with one slot runs units between rounds instead of after the whole plan (docs/benchmarks.md, "The
streaming pipeline", has the figures behind the numbers here)."""
from __future__ import annotations

from dataclasses import dataclass

from batchinfer.context import AppContext
from batchinfer.jobs.dispatch.planning import more_pending, still_validating

FIRST_ROUND_UNITS = 16  # units the first round persists: a unit runs while the rest is planned
ROUND_GROWTH = 4  # each later round persists this many times more (50,000 requests in 64: 4 rounds)
# while a file is still validated, a round follows the last this long after it, or STREAM_ROUND_SHARE of its own
# length if longer: back to back, a worker with one slot got one unit between rounds
STREAM_ROUND_GAP_S = 0.5
STREAM_ROUND_SHARE = 0.5
STREAM_ROUND_GAP_MAX_S = 30.0  # a long file still streams: its rounds keep coming while it validates
STREAM_WAIT_S = 2.0  # a chain that found nothing to send looks again this much later while a file is validated


def round_units(round_no: int | None) -> int | None:
    """Units round `round_no` persists; None (the sweep's dispatch, `batchinfer run`'s): all of the plan."""
    return None if round_no is None else FIRST_ROUND_UNITS * ROUND_GROWTH ** min(round_no, 8)


def stream_round_gap(round_s: float) -> float:
    """The countdown of the next round while a file is still validated: the worker runs units in between."""
    return min(STREAM_ROUND_GAP_MAX_S, max(STREAM_ROUND_GAP_S, STREAM_ROUND_SHARE * round_s))


@dataclass(frozen=True)
class NextRound:
    round_no: int
    countdown: float | None
    waits: bool = False  # it waits for a validated file's next rows: one such chain at a time (the caller keeps it so)


def next_round(ctx: AppContext, round_no: int, sent: bool, round_s: float) -> NextRound | None:
    """The round after `round_no`, if any. A round that planned nothing ends the chain (what it could not plan is
    left to the sweep: rounds always progress), except while a file is still validated: its units kept up with
    its validation, and the chain waits for its next rows."""
    validating = still_validating(ctx)
    if sent and more_pending(ctx):
        return NextRound(round_no + 1, stream_round_gap(round_s) if validating else None)
    if validating:
        return NextRound(round_no + 1, STREAM_WAIT_S, waits=True)
    return None
