"""Prefill and decode costs measured per model and machine, for `plan`, the estimate API and ETAs.

Each unit's run adds its engine step times (by phase) to its machine's sums; older sums decay, so the
figures follow the machine's recent load. Prefill is priced per computed prompt token. A decode step of
b sequences costs a + c*b (a: reading the weights, launching; c: each sequence's share), fitted by least
squares from the sums, so a unit whose requests decode side by side costs a*(longest max_tokens) +
c*(sum of max_tokens, times n). A figure says where it came from (MeasuredRate.source).
"""
from __future__ import annotations

import socket
import time
from dataclasses import dataclass

from sqlalchemy import select

from batchinfer.context import AppContext
from batchinfer.db.models import EngineRate
from batchinfer.db.session import retrying
from batchinfer.engine.step_stats import StepStats

DECAY = 0.8  # weight of the sums so far against the newest unit's
# Before any run is measured: CPU-scale figures (SmolLM2-135M on one or two cores).
ASSUMED = (300.0, 0.03, 0.005)  # prefill tokens/s, decode step seconds, seconds per sequence in a decode step
SUMS = ("prefill_tokens", "prefill_s", "decode_steps", "decode_tokens", "decode_s", "decode_tokens_sq", "decode_token_s")


@dataclass(frozen=True)
class MeasuredRate:
    prefill_tokens_per_s: float
    decode_step_s: float  # a: what a decode step costs whatever its batch
    decode_seq_s: float  # c: what each sequence in it adds
    source: str  # e.g. "measured on host-a (12 units run there)" or "assumed: no run measured on this model yet"

    def decode_s(self, steps: int, tokens: int) -> float:
        return steps * self.decode_step_s + tokens * self.decode_seq_s


def machine_name() -> str:
    return socket.gethostname()


def record(ctx: AppContext, model: str, machine: str, steps: StepStats) -> None:
    """Fold one unit's step times into the machine's sums (one short transaction per unit)."""
    if steps.prefill_s <= 0 and steps.decode_s <= 0:
        return

    def work(session) -> None:
        row = session.get(EngineRate, (model, machine), with_for_update=True)
        if row is None:
            row = EngineRate(model=model, machine=machine, units=0, updated_at=0.0, **{name: 0.0 for name in SUMS})
            session.add(row)
        for name in SUMS:
            setattr(row, name, getattr(row, name) * DECAY + getattr(steps, name))
        row.units += 1
        row.updated_at = time.time()

    retrying(ctx.sessions, work)


def fit_decode(row: EngineRate) -> tuple[float, float]:
    """(a, c) of t = a + c*b by least squares over the decayed sums; one batch size only (or a negative
    term) falls back to the simpler model the data supports."""
    n, sb, st, sbb, sbt = row.decode_steps, row.decode_tokens, row.decode_s, row.decode_tokens_sq, row.decode_token_s
    det = n * sbb - sb * sb
    if det > 1e-9 * max(n * sbb, 1.0):
        c = (n * sbt - sb * st) / det
        a = (st - c * sb) / n
        if a >= 0 and c >= 0:
            return a, c
    return st / n, 0.0  # every step alike: a per-step cost


def measured(ctx: AppContext, model: str, machines: list[str] | None = None) -> MeasuredRate:
    """The costs on one worker: measured on one of `machines` when known (the most recent), else on any
    machine for this model, else assumed."""
    with ctx.sessions() as session:
        rows = list(session.scalars(select(EngineRate).where(EngineRate.model == model)
                                    .order_by(EngineRate.updated_at.desc())))
    usable = [r for r in rows if r.prefill_s > 0 and r.decode_steps > 0]
    mine = [r for r in usable if machines and r.machine in machines]
    if not usable:
        return MeasuredRate(*ASSUMED, "assumed: no run measured on this model yet")
    row = (mine or usable)[0]
    where = "" if mine or not machines else ", another machine than these workers'"
    units = f"{row.units} unit{'s' if row.units != 1 else ''}"
    source = f"measured on {row.machine}{where} ({units} run there)"
    return MeasuredRate(row.prefill_tokens / row.prefill_s, *fit_decode(row), source)
