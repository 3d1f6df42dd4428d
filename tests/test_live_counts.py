"""Live counts settle onto the committed ones: a run's live rows count only while it is the unit's running
attempt, a rerun never shows a request twice, and after the commit the job's own counts are the figures.
Also the measured engine rates that plan's estimate uses."""
import pytest

from batchinfer.db.models import EngineRate
from batchinfer.engine.scheduler.step_stats import StepStats
from batchinfer.jobs import engine_rates, service
from batchinfer.jobs.units.live import with_live
from batchinfer.jobs.state import units
from batchinfer.jobs.units import runner as unit_runner
from batchinfer.jobs.dispatch.planning import dispatch
from batchinfer.jobs.units.progress import UnitWatch
from jobfiles import completion_line, submit_lines


def _shown(ctx, job_id: str) -> tuple[int, int]:
    job = with_live(ctx, [service.get(ctx, job_id)])[0]
    return job.completed, job.completion_tokens


def _run_three_live(ctx, generator):
    """A job of three requests whose one unit ran on w1 and wrote its live rows, nothing committed."""
    job = submit_lines(ctx, [completion_line(f"c{i}", f"Item {i}:", max_tokens=3) for i in range(3)])
    (unit,) = dispatch(ctx)
    started = units.start_unit(ctx, unit.unit_id, "w1")
    assert started is not None
    requests = unit_runner._load_requests(ctx, unit.unit_id, started.to_run)
    watch = UnitWatch(ctx, unit.unit_id, started.attempt, [r for r, _ in requests])
    records = unit_runner._generate(requests, generator, "w1", watch.listen(), aborts=watch.aborts)
    watch._flush()  # what the watch's thread does once a second
    return job, unit, started.attempt, watch, records


def test_live_rows_count_only_the_running_attempt_and_settle_on_the_commit(make_context, generator):
    ctx = make_context()
    job, unit, attempt, watch, records = _run_three_live(ctx, generator)
    tokens = sum(r.completion_tokens for r in records.values())
    assert _shown(ctx, job.id) == (3, tokens) and service.get(ctx, job.id).completed == 0  # live, not committed

    rerun = units.start_unit(ctx, unit.unit_id, "w2")  # the unit is taken over: attempt 2 starts afresh
    assert rerun is not None and rerun.attempt == attempt + 1
    assert _shown(ctx, job.id) == (0, 0)  # the first attempt's figures no longer count
    watch._flush()  # a late write of the old attempt changes nothing
    assert _shown(ctx, job.id) == (0, 0)

    outcome = unit_runner._commit(ctx, unit.unit_id, "units/r.jsonl", records)
    assert outcome.committed and _shown(ctx, job.id) == (3, tokens) == (service.get(ctx, job.id).completed, tokens)


def test_a_chunk_committed_between_reading_a_job_and_its_live_rows_counts_once(make_context, generator):
    """A chunk's commit moves requests from the live rows into the job's counts. A job read before it and live rows
    read after it once showed 0 where 54 had been (CI): the counts shown are read in one statement."""
    ctx = make_context()
    job, _, _, watch, records = _run_three_live(ctx, generator)
    before = service.get(ctx, job.id)  # what the API or `status` read first
    assert before.completed == 0 and with_live(ctx, [before])[0].completed == 3
    assert watch._commit_chunk(0, "units/chunk-0.jsonl", records) == 3  # all three leave the live rows
    assert service.get(ctx, job.id).completed == 3
    assert with_live(ctx, [before])[0].completed == 3  # neither 0 (dropped) nor 6 (twice)


def test_a_units_run_records_its_measured_rates_for_the_estimate(make_context, generator):
    ctx = make_context()
    assert engine_rates.measured(ctx, ctx.settings.model_id).source.startswith("assumed")
    submit_lines(ctx, [completion_line(f"c{i}", f"Item {i}:", max_tokens=4) for i in range(2)])
    (unit,) = dispatch(ctx)
    assert unit_runner.run_unit(ctx, unit.unit_id, generator, "w1").committed
    rate = engine_rates.measured(ctx, ctx.settings.model_id, [engine_rates.machine_name()])
    assert rate.source == f"measured on {engine_rates.machine_name()} (1 unit run there)"
    assert rate.prefill_tokens_per_s > 0 and rate.decode_s(steps=4, tokens=8) > 0 and rate.unit_decode_s([4, 4]) > 0
    assert rate.sizes  # the steps were measured per batch size too
    elsewhere = engine_rates.measured(ctx, ctx.settings.model_id, ["another-host"])
    assert "another machine" in elsewhere.source


@pytest.mark.fast
def test_a_decode_steps_cost_is_fitted_from_the_sums_alone():
    steps = StepStats()
    for b in (1, 4, 4, 16, 32, 64):  # t = 0.02 + 0.003 * b, exactly
        steps.decode_steps += 1
        steps.decode_tokens += b
        steps.decode_s += 0.02 + 0.003 * b
        steps.decode_tokens_sq += b * b
        steps.decode_token_s += b * (0.02 + 0.003 * b)
    row = EngineRate(**{name: float(getattr(steps, name)) for name in engine_rates.SUMS})
    assert engine_rates.fit_decode(row) == pytest.approx((0.02, 0.003))
    one_size = EngineRate(decode_steps=3.0, decode_tokens=12.0, decode_s=0.3, decode_tokens_sq=48.0, decode_token_s=1.2)
    assert engine_rates.fit_decode(one_size) == pytest.approx((0.1, 0.0))  # one batch size: a per-step cost


@pytest.mark.fast
def test_a_units_decode_is_priced_at_the_step_cost_measured_for_each_batch_size():
    steps = StepStats()
    for b, t in [(4, 0.1)] * 5 + [(32, 0.5)] * 5:  # not linear: small steps as dear as a fifth of big ones
        steps.record([None] * b, t, prompt=0)  # type: ignore[list-item]  # a decode step of b sequences
    steps.prefill_tokens, steps.prefill_s = 100, 1.0
    rate = engine_rates.rate_of_steps(steps, "test")
    assert rate.step_s(4) == pytest.approx(0.1) and rate.step_s(32) == pytest.approx(0.5)
    assert rate.step_s(18) == pytest.approx(0.3)
    assert rate.step_s(1) == pytest.approx(0.1 * 0.035 / 0.05)  # outside: the assumed shape, scaled
    assert rate.step_s(64) == pytest.approx(0.5 * 0.35 / 0.19)
    # 32 requests of 9 tokens: the prefill makes the first, then 8 steps of 32; then 4 of 9: 8 steps of 4
    assert rate.unit_decode_s([9] * 32) == pytest.approx(8 * 0.5)
    assert rate.unit_decode_s([9] * 4 + [1] * 10) == pytest.approx(8 * 0.1)  # a request of 1 token never decodes
    assert rate.unit_decode_s([3, 5]) == pytest.approx(2 * rate.step_s(2) + 2 * rate.step_s(1))


def test_status_before_the_first_request_finishes_shows_the_plans_eta(make_context, generator):
    import io

    from batchinfer.cluster.registry import WorkerState
    from batchinfer.jobs.views.eta import batch_with_eta
    from batchinfer.jobs.dispatch.planning import planner_config
    from batchinfer.runtime.preview import summary

    ctx = make_context()
    lines = [completion_line(f"c{i}", f"Item {i}:", max_tokens=3) for i in range(3)]
    job = submit_lines(ctx, lines)
    batch = batch_with_eta(ctx, service.get(ctx, job.id), planner_config(ctx))
    planned = summary(ctx, io.BytesIO(("\n".join(lines) + "\n").encode()), [WorkerState("embedded")])
    assert batch["estimated_remaining_s"] == pytest.approx(planned["estimated_run_s"], abs=0.06)  # plan's figure
    assert "assumed" in batch["estimate_source"]

    (unit,) = dispatch(ctx)
    assert unit_runner.run_unit(ctx, unit.unit_id, generator, "w1").committed
    assert "estimated_remaining_s" not in batch_with_eta(ctx, service.get(ctx, job.id), planner_config(ctx))  # done
    second = submit_lines(ctx, lines)
    batch = batch_with_eta(ctx, service.get(ctx, second.id), planner_config(ctx), workers=2)
    assert batch["estimate_source"].startswith("plan at the measured rates (measured on ")
    assert batch["estimate_source"].endswith("on 2 workers)")
