"""Prefill and decode costs measured per model and machine, for `plan`, the estimate API and ETAs.

Each unit's run adds its engine step times (by phase) to its machine's sums; older sums decay, so the
figures follow the machine's recent load. Step times are whole engine steps (scheduling, sampling and
detokenizing included). Prefill is priced per computed prompt token. A decode step of b sequences costs what
steps of about b measured (mean step time per class of batch size, linear between classes), or, for sizes
never measured, a + c*b (a: reading the weights, launching; c: each sequence's share) fitted by least squares
from the sums. A unit's requests decode side by side: the prefill makes each one's first token, then step k
holds the sequences (n of a request) with more than k tokens to make (MeasuredRate.unit_decode_s). A figure says where it
came from (MeasuredRate.source).
"""
from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Iterable

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
    sizes: tuple[tuple[float, float], ...] = ()  # (mean batch, mean step seconds) per size class measured

    def decode_s(self, steps: int, tokens: int) -> float:
        return steps * self.decode_step_s + tokens * self.decode_seq_s

    def step_s(self, batch: int) -> float:
        """One decode step of `batch` sequences: linear between the size classes measured; outside them, the
        nearest one scaled by the assumed shape of a step's cost (weights read once, plus each sequence)."""
        if not self.sizes:
            return self.decode_step_s + self.decode_seq_s * batch
        b0, t0 = self.sizes[0]
        if batch <= b0:
            return t0 * _shape(batch) / _shape(b0)
        for b1, t1 in self.sizes[1:]:
            if batch <= b1:
                return t0 + (t1 - t0) * (batch - b0) / (b1 - b0)
            b0, t0 = b1, t1
        return t0 * _shape(batch) / _shape(b0)

    def unit_decode_s(self, max_tokens: Iterable[int]) -> float:
        """Decode time of one unit whose requests all run to max_tokens side by side."""
        left = sorted(m - 1 for m in max_tokens if m > 1)  # decode steps each needs after the prefill's token
        total, done = 0.0, 0
        for i, steps in enumerate(left):
            if steps > done:
                total += (steps - done) * self.step_s(len(left) - i)
                done = steps
        return total


def _shape(batch: float) -> float:
    return ASSUMED[1] + ASSUMED[2] * batch


def machine_name() -> str:
    return socket.gethostname()


def record(ctx: AppContext, model: str, machine: str, steps: StepStats) -> None:
    """Fold one unit's step times into the machine's sums (one short transaction per unit)."""
    if steps.prefill_s <= 0 and steps.decode_s <= 0:
        return

    def work(session) -> None:
        row = session.get(EngineRate, (model, machine), with_for_update=True)
        if row is None:
            row = EngineRate(model=model, machine=machine, units=0, updated_at=0.0, decode_sizes={},
                             **{name: 0.0 for name in SUMS})
            session.add(row)
        for name in SUMS:
            setattr(row, name, getattr(row, name) * DECAY + getattr(steps, name))
        row.decode_sizes = fold_sizes(row.decode_sizes or {}, steps.by_size)
        row.units += 1
        row.updated_at = time.time()

    retrying(ctx.sessions, work)


def fold_sizes(sums: dict[str, list[float]], new: dict[int, list[float]]) -> dict[str, list[float]]:
    """The per-size sums decayed, plus a unit's; a class not seen for long is dropped."""
    out = {size: [v * DECAY for v in values] for size, values in sums.items() if values[0] * DECAY >= 0.01}
    for size, values in new.items():
        old = out.get(str(size), [0.0, 0.0, 0.0])
        out[str(size)] = [a + b for a, b in zip(old, values)]
    return out


def size_points(sums: dict[str, list[float]]) -> tuple[tuple[float, float], ...]:
    """(mean batch, mean step seconds) of each class with at least a step's weight, by batch."""
    return tuple(sorted((b / n, t / n) for n, b, t in sums.values() if n >= 1))


def fit_decode(row: EngineRate) -> tuple[float, float]:
    """(a, c) of t = a + c*b by least squares over the decayed sums; one batch size only (or a negative
    term) falls back to the simpler model the data supports."""
    n, sb, st, sbb, sbt = row.decode_steps, row.decode_tokens, row.decode_s, row.decode_tokens_sq, row.decode_token_s
    if n <= 0:
        return 0.0, 0.0
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
    return rate_of(row, f"measured on {row.machine}{where} ({units} run there)")


def rate_of(row: EngineRate, source: str) -> MeasuredRate:
    return MeasuredRate(row.prefill_tokens / row.prefill_s, *fit_decode(row), source,
                        size_points(row.decode_sizes or {}))


def rate_of_steps(steps: StepStats, source: str) -> MeasuredRate:
    """The costs of one run's steps alone (the bench: what the estimate says at the run's own pace)."""
    row = EngineRate(decode_sizes=fold_sizes({}, steps.by_size), **{name: float(getattr(steps, name)) for name in SUMS})
    return rate_of(row, source)
