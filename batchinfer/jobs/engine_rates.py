"""Prefill and decode rates measured per model and machine, for `plan`, the estimate API and ETAs.

Each unit's run adds its engine step times (by phase) to its machine's sums; older sums decay, so the
rate follows the machine's recent load. Prefill is priced per computed token; decode per step, since a
decode step reads the weights once whatever its batch (a unit's requests decode side by side). A figure
says where it came from (MeasuredRate.source).
"""
from __future__ import annotations

import socket
import time
from dataclasses import dataclass

from sqlalchemy import select

from batchinfer.context import AppContext
from batchinfer.db.models import EngineRate
from batchinfer.db.session import retrying

DECAY = 0.8  # weight of the sums so far against the newest unit's
# Before any run is measured: a CPU-scale figure (SmolLM2-135M, prefill-dominated work on one core).
ASSUMED_PREFILL_TOKENS_PER_S = 300.0
ASSUMED_DECODE_STEP_S = 0.05


@dataclass(frozen=True)
class MeasuredRate:
    prefill_tokens_per_s: float
    decode_step_s: float  # one decode step of a unit's batch
    source: str  # e.g. "measured on host-a (12 units run there)" or "assumed: no run measured on this model yet"


def machine_name() -> str:
    return socket.gethostname()


def record(ctx: AppContext, model: str, machine: str, prefill_tokens: int, prefill_s: float, decode_tokens: int,
           decode_s: float, decode_steps: int) -> None:
    """Fold one unit's step times into the machine's sums (one short transaction per unit)."""
    if prefill_s <= 0 and decode_s <= 0:
        return

    def work(session) -> None:
        row = session.get(EngineRate, (model, machine), with_for_update=True)
        if row is None:
            row = EngineRate(model=model, machine=machine, prefill_tokens=0.0, prefill_s=0.0, decode_tokens=0.0,
                             decode_s=0.0, decode_steps=0.0, units=0, updated_at=0.0)
            session.add(row)
        row.prefill_tokens = row.prefill_tokens * DECAY + prefill_tokens
        row.prefill_s = row.prefill_s * DECAY + prefill_s
        row.decode_tokens = row.decode_tokens * DECAY + decode_tokens
        row.decode_s = row.decode_s * DECAY + decode_s
        row.decode_steps = row.decode_steps * DECAY + decode_steps
        row.units += 1
        row.updated_at = time.time()

    retrying(ctx.sessions, work)


def measured(ctx: AppContext, model: str, machines: list[str] | None = None) -> MeasuredRate:
    """The rate of one worker: measured on one of `machines` when known (the most recent), else on any
    machine for this model, else assumed."""
    with ctx.sessions() as session:
        rows = list(session.scalars(select(EngineRate).where(EngineRate.model == model)
                                    .order_by(EngineRate.updated_at.desc())))
    usable = [r for r in rows if r.prefill_s > 0 and r.decode_steps > 0]
    mine = [r for r in usable if machines and r.machine in machines]
    if mine or usable:
        row = (mine or usable)[0]
        where = "" if mine or not machines else ", another machine than these workers'"
        units = f"{row.units} unit{'s' if row.units != 1 else ''}"
        return MeasuredRate(row.prefill_tokens / row.prefill_s, row.decode_s / row.decode_steps,
                            f"measured on {row.machine}{where} ({units} run there)")
    return MeasuredRate(ASSUMED_PREFILL_TOKENS_PER_S, ASSUMED_DECODE_STEP_S,
                        "assumed: no run measured on this model yet")
