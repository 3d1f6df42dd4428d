"""Prefill and decode costs measured per model and machine, for `plan`, the estimate API and ETAs.

Each unit's run adds its engine step times (by phase) to its machine's sums; older sums decay, so the
figures follow the machine's recent load. Step times are whole engine steps (scheduling, sampling and
detokenizing included). Prefill is priced per computed prompt token. A decode step of b sequences costs what
steps of about b measured (mean step time per class of batch size, linear between classes), or, for sizes
never measured, a + c*b (a: reading the weights, launching; c: each sequence's share) fitted by least squares
from the sums. A unit's requests decode side by side: the prefill makes each one's first token, then step k
holds the sequences (n of a request) with more than k tokens to make (MeasuredRate.unit_decode_s). A figure says where it
came from (MeasuredRate.source).

Attention's cost grows with the context each token attends to, so rates from short prompts underprice long
ones. Steps also count attention pairs P (query token, key; engine.step_stats), kept in attention_sums:
prefill is priced a*tokens + p*P (least squares over the prefill steps' sums), a decode step as its class's
mean time plus q*(P - the class's mean P) (q: the slope of time on P within the classes, pooled; p when
the classes never saw different contexts). When a fit is degenerate (tokens and pairs in a fixed
ratio, a negative term) or the row predates the sums, the per-token model above prices it.
"""
from __future__ import annotations

import socket
import time
from dataclasses import dataclass, replace
from typing import Iterable

from sqlalchemy import select

from batchinfer.context import AppContext
from batchinfer.db.models import EngineRate
from batchinfer.db.session import retrying
from batchinfer.engine.scheduler.step_stats import StepStats

DECAY = 0.8  # weight of the sums so far against the newest unit's
# Before any run is measured: CPU-scale figures (SmolLM2-135M on one or two cores).
ASSUMED = (300.0, 0.03, 0.005)  # prefill tokens/s, decode step seconds, seconds per sequence in a decode step
SUMS = ("prefill_tokens", "prefill_s", "decode_steps", "decode_tokens", "decode_s", "decode_tokens_sq", "decode_token_s")
PREFILL_SUMS = ("prefill_tt", "prefill_tp", "prefill_pp", "prefill_ts", "prefill_ps")  # of s = a*t + p*P
COLLINEAR = 0.02  # tokens and pairs closer to a fixed ratio than this (1 - cos^2) tell a and p no apart
SPREAD = 0.01  # pairs within the classes varying less than this (variance / mean square: 10% apart) fit no q


@dataclass(frozen=True)
class MeasuredRate:
    prefill_tokens_per_s: float
    decode_step_s: float  # a: what a decode step costs whatever its batch
    decode_seq_s: float  # c: what each sequence in it adds
    source: str  # e.g. "measured on host-a (12 units run there)" or "assumed: no run measured on this model yet"
    sizes: tuple[tuple[float, float], ...] = ()  # (mean batch, mean step seconds) per size class measured
    prefill_token_s: float = 0.0  # a of prefill_s = a*tokens + p*pairs; 0: priced at prefill_tokens_per_s
    prefill_pair_s: float = 0.0  # p
    decode_pair_s: float = 0.0  # q: what a decode step's pair adds beyond its class's mean; 0: no correction
    contexts: tuple[float, ...] = ()  # mean context per sequence of each class in sizes; (): not measured

    def decode_s(self, steps: int, tokens: int) -> float:
        return steps * self.decode_step_s + tokens * self.decode_seq_s

    def prefill_seconds(self, tokens: int, pairs: int = 0) -> float:
        if self.prefill_token_s > 0:
            return tokens * self.prefill_token_s + pairs * self.prefill_pair_s
        return tokens / self.prefill_tokens_per_s

    def step_s(self, batch: int, context: float | None = None) -> float:
        """One decode step of `batch` sequences: linear between the size classes measured; outside them, the
        nearest one scaled by the assumed shape of a step's cost (weights read once, plus each sequence).
        Given the sequences' mean context, the step is corrected by q per pair beyond the classes' mean."""
        if not self.sizes:
            return self.decode_step_s + self.decode_seq_s * batch
        i, f = _place([b for b, _ in self.sizes], batch)
        t0, t1 = self.sizes[i][1], self.sizes[min(i + 1, len(self.sizes) - 1)][1]
        base = t0 + (t1 - t0) * f if f >= 0 else t0 * _shape(batch) / _shape(self.sizes[i][0])
        if context is None or not self.decode_pair_s or len(self.contexts) != len(self.sizes):
            return base
        c0, c1 = self.contexts[i], self.contexts[min(i + 1, len(self.contexts) - 1)]
        reference = c0 + (c1 - c0) * max(f, 0.0)
        return max(base + self.decode_pair_s * batch * (context - reference), 0.2 * base)  # floor: a fit's slope

    def unit_decode_s(self, max_tokens: Iterable[int], prompts: Iterable[int] | None = None) -> float:
        """Decode time of one unit whose requests all run to max_tokens side by side; given each sequence's
        prompt length, step k's rows attend to prompt + k keys each (a step's cost is linear in the context,
        so a stretch of steps is priced at its middle step)."""
        lengths = list(prompts) if prompts is not None else None
        rows = [(m - 1, lengths[j] if lengths else 0) for j, m in enumerate(max_tokens)]
        left = sorted(r for r in rows if r[0] > 0)  # decode steps each needs after the prefill's token
        total, done = 0.0, 0
        for i, (steps, _) in enumerate(left):
            if steps > done:
                batch = len(left) - i
                context = (sum(p for _, p in left[i:]) / batch + (done + 1 + steps) / 2) if lengths else None
                total += (steps - done) * self.step_s(batch, context)
                done = steps
        return total


def _place(points: list[float], batch: float) -> tuple[int, float]:
    """Where batch falls among the classes' mean batches: (i, f) with batch = points[i] + f*(points[i+1] -
    points[i]), f in [0, 1]; f = -1 outside them (i the nearest)."""
    if batch <= points[0]:
        return 0, (0.0 if batch == points[0] else -1.0)
    for i in range(len(points) - 1):
        if batch <= points[i + 1]:
            return i, (batch - points[i]) / (points[i + 1] - points[i])
    return len(points) - 1, -1.0


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
        row.decode_sizes = fold_sizes(row.decode_sizes or {}, {size: v[:3] for size, v in steps.by_size.items()})
        row.attention_sums = fold_attention(row.attention_sums or {}, steps)
        row.units += 1
        row.updated_at = time.time()

    retrying(ctx.sessions, work)


def fold_sizes(sums: dict[str, list[float]], new: dict[int, list[float]]) -> dict[str, list[float]]:
    """The per-size sums decayed, plus a unit's; a class not seen for long is dropped."""
    out = {size: [v * DECAY for v in values] for size, values in sums.items() if values[0] * DECAY >= 0.01}
    for size, values in new.items():
        old = out.get(str(size), [0.0] * len(values))
        out[str(size)] = [a + b for a, b in zip(old, values)]
    return out


def fold_attention(sums: dict, steps: StepStats) -> dict:
    """attention_sums decayed, plus a unit's: {"prefill": the PREFILL_SUMS, "sizes": per class [steps, sum of
    b, sum of t, sum of P, sum of P*P, sum of P*t]} (the per-class sums of decode_sizes again, so that
    the two are counted over the same steps)."""
    prefill = [v * DECAY + float(getattr(steps, name)) for v, name in zip(sums.get("prefill", [0.0] * 5), PREFILL_SUMS)]
    return {"prefill": prefill, "sizes": fold_sizes(sums.get("sizes", {}), steps.by_size)}


def fit_prefill(sums: list[float]) -> tuple[float, float] | None:
    """(a, p) of prefill_s = a*tokens + p*pairs by least squares over the prefill steps' sums; None when
    tokens and pairs kept to a fixed ratio (one workload's steps, say) or a term comes out negative."""
    tt, tp, pp, ts, ps = sums
    det = tt * pp - tp * tp
    if tt <= 0 or pp <= 0 or det <= COLLINEAR * tt * pp:
        return None
    a, p = (ts * pp - ps * tp) / det, (tt * ps - tp * ts) / det
    return (a, p) if a > 0 and p >= 0 else None


def fit_decode_pairs(sizes: dict[str, list[float]]) -> float | None:
    """q: the slope of a decode step's time on its pairs within each size class, pooled over the classes
    (so the batch size's own cost, the classes' means, stays out of it); None when the contexts hardly varied
    within the classes (one workload's few steps of a long shared prompt: the slope would be noise) or if
    negative."""
    cross = spread = total = 0.0
    for n, _b, t, sp, spp, spt in (v for v in sizes.values() if len(v) == 6 and v[0] >= 2):
        cross += spt - sp * t / n
        spread += spp - sp * sp / n
        total += spp
    if spread <= SPREAD * total or cross < 0:
        return None
    return cross / spread


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
    base = MeasuredRate(row.prefill_tokens / row.prefill_s, *fit_decode(row), source,
                        size_points(row.decode_sizes or {}))
    sums = row.attention_sums or {}
    prefill = fit_prefill(sums["prefill"]) if len(sums.get("prefill", ())) == 5 else None
    a, p = prefill or (0.0, 0.0)
    classes = [v for v in (sums.get("sizes") or {}).values() if len(v) == 6 and v[0] >= 1 and v[1] > 0]
    if not classes:  # a row from before the sums: the per-token model
        return replace(base, prefill_token_s=a, prefill_pair_s=p)
    points = sorted((b / n, t / n, sp / b) for n, b, t, sp, _, _ in classes)
    q = fit_decode_pairs(sums["sizes"])
    return replace(base, prefill_token_s=a, prefill_pair_s=p, decode_pair_s=p if q is None else q,
                   sizes=tuple((b, t) for b, t, _ in points), contexts=tuple(c for _, _, c in points))


def rate_of_steps(steps: StepStats, source: str) -> MeasuredRate:
    """The costs of one run's steps alone (the bench: what the estimate says at the run's own pace)."""
    row = EngineRate(decode_sizes=fold_sizes({}, {size: v[:3] for size, v in steps.by_size.items()}),
                     attention_sums=fold_attention({}, steps), **{name: float(getattr(steps, name)) for name in SUMS})
    return rate_of(row, source)
