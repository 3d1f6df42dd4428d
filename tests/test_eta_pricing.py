"""Prefill and decode priced by attention pairs as well as tokens (issue 21 point 3): a long-context run
costs more than a short one with the same token counts, the costs are fitted from the decayed sums alone,
and rows recorded before the pair sums price as they did."""
import pytest

from batchinfer.db.models import EngineRate
from batchinfer.engine.scheduler.sequence import Sequence
from batchinfer.engine.scheduler.step_stats import StepStats
from batchinfer.engine.types import SamplingParams
from batchinfer.jobs import engine_rates
from batchinfer.jobs.views.eta import RunShape, prefill_pairs, shape_of
from batchinfer.planner import PendingRequest, PlannerConfig, estimate_plan, plan_units

A, P, Q = 0.002, 4e-6, 1e-5  # seconds per prompt token, per prefill pair, per decode pair beyond the class mean


def _steps() -> StepStats:
    """Prefill steps of short and long contexts at s = A*t + P*pairs; decode steps of 4 and 32 rows whose
    time is the class's own plus Q per pair (32 rows: 0.2 s + Q*pairs; 4 rows: 0.08 s + Q*pairs)."""
    steps = StepStats()
    for tokens, pairs in [(512, 512 * 17), (512, 512 * 200), (370, 370 * 371 // 2), (300, 300 * 400), (60, 60 * 30)]:
        steps.record([], A * tokens + P * pairs, prompt=tokens, pairs=pairs)
    for b, base, contexts in [(32, 0.2, range(40, 80)), (32, 0.2, range(400, 408)), (4, 0.08, range(30, 160))]:
        for c in contexts:
            steps.record([None] * b, base + Q * b * c, prompt=0, pairs=b * c)  # type: ignore[list-item]
    return steps


@pytest.mark.fast
def test_the_fit_recovers_the_token_and_pair_costs_from_the_sums_alone():
    rate = engine_rates.rate_of_steps(_steps(), "test")
    assert rate.prefill_token_s == pytest.approx(A) and rate.prefill_pair_s == pytest.approx(P)
    assert rate.decode_pair_s == pytest.approx(Q)
    assert rate.step_s(32, 60) == pytest.approx(0.2 + Q * 32 * 60)  # the class mean, corrected to its context
    assert rate.step_s(32, 400) == pytest.approx(0.2 + Q * 32 * 400)
    assert rate.prefill_seconds(1000, 10**5) == pytest.approx(1000 * A + 10**5 * P)


@pytest.mark.fast
def test_the_sums_decay_as_the_rest_and_the_fit_survives_the_fold():
    steps = _steps()
    sums = engine_rates.fold_attention(engine_rates.fold_attention({}, steps), steps)
    assert sums["prefill"][0] == pytest.approx(steps.prefill_tt * (1 + engine_rates.DECAY))
    assert engine_rates.fit_prefill(sums["prefill"]) == pytest.approx((A, P))
    assert engine_rates.fit_decode_pairs(sums["sizes"]) == pytest.approx(Q)


@pytest.mark.fast
def test_one_workloads_prefill_tells_tokens_and_pairs_no_apart_and_prices_per_token():
    steps = StepStats()
    for tokens in (512, 512, 101):  # every step's tokens attend to ~18 keys each: pairs in a fixed ratio
        steps.record([], 0.002 * tokens, prompt=tokens, pairs=tokens * 18)
    steps.record([None] * 4, 0.1, prompt=0, pairs=4 * 40)  # type: ignore[list-item]
    rate = engine_rates.rate_of_steps(steps, "test")
    assert rate.prefill_token_s == 0 and rate.prefill_seconds(1125, 10**6) == pytest.approx(1125 * 0.002)
    assert engine_rates.fit_prefill([1.0, -1.0, 1.0, 1.0, -1.0]) is None  # collinear


@pytest.mark.fast
def test_decode_steps_of_one_long_context_fit_no_slope_and_take_the_prefills_pair_cost():
    steps = StepStats()
    for tokens, pairs in [(512, 512 * 17), (370, 370 * 371 // 2), (300, 300 * 400)]:
        steps.record([], A * tokens + P * pairs, prompt=tokens, pairs=pairs)
    for c, noise in zip(range(400, 407), (0.03, -0.02, 0.01, 0.04, -0.03, 0.0, 0.02)):  # a 1.5% spread, noisy
        steps.record([None] * 32, 0.3 + noise, prompt=0, pairs=32 * c)  # type: ignore[list-item]
    assert engine_rates.fit_decode_pairs(engine_rates.fold_attention({}, steps)["sizes"]) is None
    rate = engine_rates.rate_of_steps(steps, "test")
    assert rate.decode_pair_s == pytest.approx(P)
    assert rate.step_s(32, 55) == pytest.approx(rate.step_s(32) - P * 32 * (403 - 55))


@pytest.mark.fast
def test_a_long_context_shape_prices_higher_than_a_short_one_with_the_same_token_counts():
    rate = engine_rates.rate_of_steps(_steps(), "test")
    short = RunShape(1000, ((9,) * 32,), prefill_pairs=32 * prefill_pairs(31, 0), unit_prompt_lens=((31,) * 32,))
    long_ = RunShape(1000, ((9,) * 32,), prefill_pairs=prefill_pairs(370, 0) + 31 * prefill_pairs(390, 370),
                     unit_prompt_lens=((390,) * 32,))
    assert long_.seconds(rate) > short.seconds(rate) * 1.5
    assert long_.seconds(rate) - short.seconds(rate) == pytest.approx(
        (long_.prefill_pairs - short.prefill_pairs) * P + 8 * Q * 32 * (390 - 31))


@pytest.mark.fast
def test_a_plans_shape_counts_each_requests_cached_prefix_out_of_its_pairs():
    doc = tuple(range(1000, 1000 + 368))  # 23 blocks of 16
    shared = [PendingRequest("j", i, doc + (5000 + i,) * 20, 8) for i in range(4)]
    config = PlannerConfig()
    units = plan_units(shared, config)
    shape = shape_of(estimate_plan(shared, config), units, config.block_size)
    assert shape.prefill_pairs == prefill_pairs(388, 0) + 3 * prefill_pairs(388, 368)
    assert shape.computed_prompt_tokens == 388 + 3 * 20
    assert sorted(n for lens in shape.unit_prompt_lens for n in lens) == [388] * 4


@pytest.mark.fast
def test_a_step_counts_its_pairs_from_the_sequences_positions():
    prefill = Sequence("a", list(range(100)), SamplingParams())
    prefill.num_computed_tokens, prefill.num_new_tokens = 64, 36  # 36 prompt tokens at positions 64..99
    assert StepStats.pairs([prefill]) == 36 * 64 + 36 * 37 // 2
    decode = Sequence("b", list(range(50)), SamplingParams())
    decode.token_ids.append(7)  # 50 prompt tokens, one generated: the next step's token attends to 51 keys
    decode.num_computed_tokens, decode.num_new_tokens = 50, 1
    assert StepStats.pairs([decode, decode]) == 102


@pytest.mark.fast
def test_a_row_recorded_before_the_pair_sums_prices_as_before():
    steps = StepStats()
    for b, t in [(4, 0.1)] * 5 + [(32, 0.5)] * 5:
        steps.record([None] * b, t, prompt=0)  # type: ignore[list-item]
    row = EngineRate(prefill_tokens=1000.0, prefill_s=2.0, decode_sizes=engine_rates.fold_sizes(
        {}, {size: v[:3] for size, v in steps.by_size.items()}), attention_sums=None,
        **{name: float(getattr(steps, name)) for name in engine_rates.SUMS[2:]})
    rate = engine_rates.rate_of(row, "old")
    assert (rate.prefill_token_s, rate.decode_pair_s, rate.contexts) == (0.0, 0.0, ())
    shape = RunShape(900, ((9,) * 32, (5,) * 4), prefill_pairs=10**6, unit_prompt_lens=((400,) * 32, (400,) * 4))
    today = 900 / 500.0 + 8 * 0.5 + 4 * 0.1  # per token and per step class, as before the pair sums
    assert shape.seconds(rate) == pytest.approx(today)
    assert RunShape(900, ((9,) * 32, (5,) * 4)).seconds(rate) == pytest.approx(today)
