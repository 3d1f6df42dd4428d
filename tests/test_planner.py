"""The planner on random workloads: every request planned once, bounds kept, prefix groups kept
together in depth-first order, jobs served fairly and by priority, estimates exact."""
from __future__ import annotations

import random
import time
from collections import defaultdict
from dataclasses import replace

import pytest

from batchinfer.planner import PendingRequest, PlannerConfig, estimate_plan, plan_units, prefix_key

pytestmark = pytest.mark.fast

BS = 16


def tokens(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(3, 49152) for _ in range(n))


def make_workload(rng, jobs=4, per_job=(20, 120), prompts=4, prompt_blocks=(8, 40), max_tokens=(1, 64),
                  preamble_blocks=0):
    """Jobs mixing the same system prompts (whole blocks) in random order, after a shared preamble."""
    preamble = tokens(rng, preamble_blocks * BS)
    systems = [preamble + tokens(rng, rng.randint(*prompt_blocks) * BS) for _ in range(prompts)]
    pending, system_of = [], {}
    for j in range(jobs):
        for i in range(rng.randint(*per_job)):
            s = rng.randrange(prompts)
            req = PendingRequest(f"job{j}", i, systems[s] + tokens(rng, rng.randint(1, 40)),
                                 rng.randint(*max_tokens), 0, float(j))
            pending.append(req)
            system_of[(req.job_id, req.index)] = s
    return pending, systems, system_of


def key(req):
    return req.job_id, req.index


@pytest.mark.parametrize("seed", range(6))
def test_every_request_is_planned_once_within_bounds(seed):
    rng = random.Random(seed)
    pending, _, _ = make_workload(rng)
    config = PlannerConfig(max_requests_per_unit=rng.choice([3, 16, 64]),
                           max_tokens_per_unit=rng.choice([2000, 8000, 65536]), block_size=BS)
    units = plan_units(pending, config)
    planned = [key(r) for u in units for r in u.requests]
    assert sorted(planned) == sorted(key(r) for r in pending)
    for unit in units:
        assert 1 <= len(unit.requests) <= config.max_requests_per_unit
        assert unit.cost <= config.max_tokens_per_unit or len(unit.requests) == 1


@pytest.mark.parametrize("seed", range(6))
def test_a_prefix_group_that_fits_one_unit_is_never_split(seed):
    rng = random.Random(100 + seed)
    pending, systems, system_of = make_workload(rng, per_job=(2, 12))
    config = PlannerConfig(max_requests_per_unit=64, block_size=BS)
    units = plan_units(pending, config)
    units_of = defaultdict(set)
    for u, unit in enumerate(units):
        for r in unit.requests:
            units_of[system_of[key(r)]].add(u)
    for s, members in units_of.items():
        assert len(members) == 1, f"system prompt {s} split over units {members}"
    for unit in units:
        dominant = max(set(system_of[key(r)] for r in unit.requests),
                       key=lambda s: sum(len(r.prompt_token_ids) for r in unit.requests if system_of[key(r)] == s))
        assert unit.prefix_key == prefix_key(systems[dominant])
        assert unit.shared_prefix_len == len(systems[dominant])


@pytest.mark.parametrize("seed", range(4))
def test_a_big_group_gets_units_of_its_own_keyed_by_its_prefix(seed):
    rng = random.Random(200 + seed)
    pending, systems, system_of = make_workload(rng, jobs=3, per_job=(80, 150))
    units = plan_units(pending, PlannerConfig(max_requests_per_unit=16, block_size=BS))
    for unit in units:
        members = {system_of[key(r)] for r in unit.requests}
        assert len(members) == 1  # every group here is bigger than a unit
        assert unit.prefix_key == prefix_key(systems[members.pop()])


def test_one_job_runs_depth_first_with_most_reuse_first():
    rng = random.Random(7)
    pending, systems, system_of = make_workload(rng, jobs=1, per_job=(300, 300), prompt_blocks=(5, 40))
    units = plan_units(pending, PlannerConfig(max_requests_per_unit=8, block_size=BS))
    sequence = [system_of[key(r)] for u in units for r in u.requests]
    runs = [s for i, s in enumerate(sequence) if i == 0 or sequence[i - 1] != s]
    assert len(runs) == len(set(runs)), f"a group was left and resumed: {runs}"
    count = defaultdict(int)
    for s in sequence:
        count[s] += 1
    savings = {s: (count[s] - 1) * len(systems[s]) for s in count}
    assert runs == sorted(runs, key=lambda s: -savings[s])


def test_nested_prefixes_form_nested_groups_and_requests_route_by_the_deepest():
    rng = random.Random(3)
    pending, systems, system_of = make_workload(rng, jobs=2, per_job=(30, 30), preamble_blocks=10)
    units = plan_units(pending, PlannerConfig(max_requests_per_unit=64, block_size=BS))
    keys = {u.prefix_key for u in units}
    assert keys <= {prefix_key(s) for s in systems}
    assert prefix_key(systems[0][:10 * BS]) not in keys  # the shared preamble is not the routing key
    est = estimate_plan(pending, PlannerConfig(block_size=BS))
    assert est.prefix_groups == 1 + len(systems)  # the preamble, then each system prompt under it


def test_requests_without_a_shared_prefix_route_to_no_group():
    rng = random.Random(4)
    pending = [PendingRequest("j", i, tokens(rng, rng.randint(20, 200)), 8) for i in range(50)]
    units = plan_units(pending, PlannerConfig(block_size=BS))
    assert [u.prefix_key for u in units] == [""]
    assert units[0].expected_cached_tokens == 0


def test_short_common_template_prefix_is_not_a_group():
    rng = random.Random(5)
    header = tokens(rng, 2 * BS)  # the chat template's default system line, shorter than min_group_prefix_tokens
    pending = [PendingRequest("j", i, header + tokens(rng, 50), 8) for i in range(10)]
    units = plan_units(pending, PlannerConfig(block_size=BS, min_group_prefix_tokens=64))
    assert units[0].prefix_key == ""
    assert units[0].expected_cached_tokens == 9 * 2 * BS


def test_a_small_job_submitted_after_a_big_one_is_not_starved():
    rng = random.Random(8)
    big_sys, small_sys = tokens(rng, 20 * BS), tokens(rng, 20 * BS)
    pending = [PendingRequest("big", i, big_sys + tokens(rng, 20), 32, 0, 0.0) for i in range(2000)]
    pending += [PendingRequest("small", i, small_sys + tokens(rng, 20), 32, 0, 60.0) for i in range(40)]
    units = plan_units(pending, PlannerConfig(max_requests_per_unit=16, block_size=BS))
    small_units = [u for u, unit in enumerate(units) if any(r.job_id == "small" for r in unit.requests)]
    assert len(units) > 120 and small_units
    assert max(small_units) <= 2 * len(small_units) + 1  # served alternately with the big job, not after it


def test_fair_share_interleaves_jobs_of_one_class_by_work_received():
    rng = random.Random(9)
    pending, _, _ = make_workload(rng, jobs=3, per_job=(200, 200), prompts=3)
    pending = [PendingRequest(r.job_id, r.index, r.prompt_token_ids[:], 16, 0, r.submitted_at) for r in pending]
    units = plan_units(pending, PlannerConfig(max_requests_per_unit=10, block_size=BS))
    served, total = defaultdict(int), defaultdict(int)
    for r in pending:
        total[r.job_id] += r.cost
    for unit in units[: len(units) // 2]:
        for r in unit.requests:
            served[r.job_id] += r.cost
    shares = [served[j] / total[j] for j in total]
    assert min(shares) > 0.25  # half the units in, every job has had a good part of its work


def test_higher_priority_runs_first_even_when_submitted_later():
    rng = random.Random(10)
    shared = tokens(rng, 20 * BS)
    low = [PendingRequest("low", i, shared + tokens(rng, 10), 8, 0, 0.0) for i in range(100)]
    high = [PendingRequest("high", i, shared + tokens(rng, 10), 8, 5, 100.0) for i in range(30)]
    units = plan_units(low + high, PlannerConfig(max_requests_per_unit=16, block_size=BS))
    priorities = [{r.priority for r in u.requests} for u in units]
    assert all(len(p) == 1 for p in priorities)  # classes never share a unit
    order = [p.pop() for p in priorities]
    assert order == sorted(order, reverse=True)
    assert units[0].prefix_key == units[-1].prefix_key  # same prefix: routed to the same worker


def test_aging_lifts_a_long_waiting_low_priority_job():
    rng = random.Random(11)
    old = [PendingRequest("old", i, tokens(rng, 40), 8, 0, 0.0) for i in range(10)]
    new = [PendingRequest("new", i, tokens(rng, 40), 8, 2, 990.0) for i in range(10)]
    config = PlannerConfig(block_size=BS, priority_aging_s=300, now=1000.0)
    units = plan_units(new + old, config)
    assert units[0].requests[0].job_id == "old"  # 0 + floor(1000/300) = 3 > 2 + 0
    units = plan_units(new + old, PlannerConfig(block_size=BS))
    assert units[0].requests[0].job_id == "new"


def test_without_grouping_units_follow_submission_order():
    rng = random.Random(12)
    pending, _, _ = make_workload(rng, jobs=3, per_job=(20, 40))
    rng.shuffle(pending)
    units = plan_units(pending, PlannerConfig(grouping=False, max_requests_per_unit=16, block_size=BS))
    order = [(r.submitted_at, r.job_id, r.index) for u in units for r in u.requests]
    assert order == sorted(order)
    assert {u.prefix_key for u in units} == {""}


@pytest.mark.parametrize("seed", range(3))
def test_expected_cached_tokens_count_every_distinct_block_once(seed):
    rng = random.Random(300 + seed)
    pending, systems, system_of = make_workload(rng)
    users = defaultdict(int)
    for r in pending:
        users[system_of[key(r)]] += 1
    # user parts are random: only the system prompts (whole blocks) are shared
    optimum = sum((users[s] - 1) * len(systems[s]) for s in users)
    units = plan_units(pending, PlannerConfig(block_size=BS))
    assert sum(u.expected_cached_tokens for u in units) == optimum
    est = estimate_plan(pending, PlannerConfig(block_size=BS), prefill_tokens_per_s=1000.0,
                        decode_tokens_per_s=100.0, workers=2)
    prompt = sum(len(r.prompt_token_ids) for r in pending)
    assert (est.requests, est.prompt_tokens, est.expected_cached_tokens) == (len(pending), prompt, optimum)
    assert est.prefix_groups == len(users)
    expected_s = ((prompt - optimum) / 1000.0 + sum(r.max_tokens for r in pending) / 100.0) / 2
    assert est.estimated_run_s == pytest.approx(expected_s)


def test_estimate_without_throughput_has_no_run_time():
    est = estimate_plan([PendingRequest("j", 0, (1, 2, 3), 4)])
    assert est.estimated_run_s is None and est.expected_cached_tokens == 0 and est.prefix_groups == 0


def test_plans_100k_requests_in_seconds():
    rng = random.Random(13)
    systems = [tokens(rng, rng.randint(10, 30) * BS) for _ in range(8)]
    tails = [tokens(rng, 40) for _ in range(1000)]
    pending = [PendingRequest(f"job{i % 10}", i, systems[i % 8] + tails[i % 1000][: 10 + i % 30], 16, 0, float(i % 10))
               for i in range(100_000)]
    start = time.perf_counter()
    units = plan_units(pending, PlannerConfig(block_size=BS))
    elapsed = time.perf_counter() - start
    assert sum(len(u.requests) for u in units) == 100_000
    assert elapsed < 30, f"planning 100k requests took {elapsed:.1f}s"


def test_estimate_with_one_tokens_per_second_figure():
    rng = random.Random(14)
    shared = tokens(rng, 10 * BS)
    pending = [PendingRequest("j", i, shared + tokens(rng, 8), 10) for i in range(5)]
    est = estimate_plan(pending, PlannerConfig(block_size=BS, min_group_prefix_tokens=BS), tokens_per_s=100.0,
                        workers=2)
    assert est.expected_cached_tokens == 4 * 10 * BS and est.prefix_groups == 1
    assert est.estimated_run_s == pytest.approx((5 * (10 * BS + 8) - 4 * 10 * BS + 50) / 100.0 / 2)


def test_groups_of_a_quarter_unit_or_more_get_units_of_their_own_evenly_sized():
    rng = random.Random(15)
    systems = [tokens(rng, 20 * BS) for _ in range(4)]
    pending = [PendingRequest(f"job{j}", i, systems[(i + j) % 4] + tokens(rng, 12), 4, 0, float(j))
               for j in range(4) for i in range(24)]  # 24 requests per system prompt
    units = plan_units(pending, PlannerConfig(max_requests_per_unit=64, block_size=BS))
    assert len(units) == 4 and {len(u.requests) for u in units} == {24}
    assert len({u.prefix_key for u in units}) == 4
    units = plan_units(pending, PlannerConfig(max_requests_per_unit=16, block_size=BS))
    assert sorted(len(u.requests) for u in units) == [12] * 8  # 24 = 12 + 12, not 16 + 8


def test_a_job_submitted_later_overtakes_the_queued_units_of_a_big_job():
    from batchinfer.planner.fairness import service_levels

    rng = random.Random(16)
    big = [PendingRequest("big", i, tokens(rng, 40), 8, 0, 0.0) for i in range(200)]
    first_round = plan_units(big, PlannerConfig(max_requests_per_unit=10, block_size=BS))
    big_priorities = service_levels(first_round, {})
    assert big_priorities[0] == 0 and big_priorities[-1] == 3
    assert big_priorities == sorted(big_priorities)  # its own units keep their order
    small = [PendingRequest("small", i, tokens(rng, 40), 8, 0, 60.0) for i in range(30)]
    second_round = plan_units(small, PlannerConfig(max_requests_per_unit=10, block_size=BS))
    small_priorities = service_levels(second_round, {"big": len(first_round)})
    assert small_priorities == [0, 1, 1]  # ahead of the big job's 3s still queued
    urgent = service_levels(first_round[5:6], {"big": 20}, {"big": 2})
    assert urgent == [1]  # two priority levels up from 3


def test_a_unit_shared_by_jobs_runs_as_early_as_its_least_served_job():
    from batchinfer.planner.fairness import service_levels

    shared = tuple(range(100, 100 + 8 * BS))
    mixed = [PendingRequest("old", 0, shared + (1,), 4), PendingRequest("new", 0, shared + (2,), 4)]
    units = plan_units(mixed, PlannerConfig(block_size=BS))
    assert len(units) == 1 and service_levels(units, {"old": 50, "new": 0}) == [0]


def in_scopes(pending: list[PendingRequest], scope_of_job) -> list[PendingRequest]:
    return [replace(r, scope=scope_of_job(r.job_id)) for r in pending]


@pytest.mark.parametrize("grouping", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_jobs_of_different_scopes_never_share_a_unit_or_a_group(seed, grouping):
    rng = random.Random(500 + seed)
    pending, systems, _ = make_workload(rng, jobs=4, per_job=(5, 40))  # every job mixes the same system prompts
    pending = in_scopes(pending, lambda job: "tenant-a" if job in ("job0", "job2") else "tenant-b")
    config = PlannerConfig(max_requests_per_unit=rng.choice([4, 16, 64]), block_size=BS, grouping=grouping)
    units = plan_units(pending, config)
    assert sorted(key(r) for u in units for r in u.requests) == sorted(key(r) for r in pending)
    keys_of: dict[str, set[str]] = defaultdict(set)
    for unit in units:
        scopes = {r.scope for r in unit.requests}
        assert len(scopes) == 1, f"a unit mixes scopes {scopes}"
        keys_of[scopes.pop()].add(unit.prefix_key)
    assert not (keys_of["tenant-a"] - {""}) & (keys_of["tenant-b"] - {""})
    per_scope = sum(estimate_plan([r for r in pending if r.scope == s], config).expected_cached_tokens
                    for s in ("tenant-a", "tenant-b"))
    assert sum(u.expected_cached_tokens for u in units) <= per_scope
    assert estimate_plan(pending, config).expected_cached_tokens == per_scope


def test_a_system_prompt_in_two_scopes_is_computed_once_in_each():
    rng = random.Random(7)
    system = tokens(rng, 10 * BS)
    pending = [PendingRequest(job, i, system + tokens(rng, 20), 8, 0, float(j), scope=job)
               for j, job in enumerate(("a", "b")) for i in range(5)]
    units = plan_units(pending, PlannerConfig(block_size=BS))
    assert [sorted({r.scope for r in u.requests}) for u in units] == [["a"], ["b"]]
    assert [u.expected_cached_tokens for u in units] == [4 * 10 * BS, 4 * 10 * BS]  # not 9 x: b re-computes it
    assert units[0].prefix_key != units[1].prefix_key and units[0].shared_prefix_len == 10 * BS


@pytest.mark.parametrize("seed", range(3))
def test_one_named_scope_plans_exactly_as_no_scope(seed):
    rng = random.Random(600 + seed)
    pending, _, _ = make_workload(rng)
    config = PlannerConfig(max_requests_per_unit=16, block_size=BS)
    plain = plan_units(pending, config)
    scoped = plan_units(in_scopes(pending, lambda job: "org:acme"), config)
    assert [[key(r) for r in u.requests] for u in scoped] == [[key(r) for r in u.requests] for u in plain]
    assert [(u.shared_prefix_len, u.expected_cached_tokens) for u in scoped] == \
        [(u.shared_prefix_len, u.expected_cached_tokens) for u in plain]


def test_a_deep_backlog_gets_bigger_units_and_a_short_one_keeps_the_base_size():
    from batchinfer.planner import sized_for
    from batchinfer.planner.unit_size import UNITS_PER_WORKER

    config = PlannerConfig(max_requests_per_unit=8, unit_growth=4, block_size=BS)
    per_worker_base = UNITS_PER_WORKER * 8
    assert sized_for(config, 2 * per_worker_base - 1, workers=1) is config  # not two base units each: the base
    assert sized_for(config, 2 * per_worker_base, workers=1).max_requests_per_unit == 16
    assert sized_for(config, 3 * per_worker_base, workers=2) is config  # 1.5 per worker
    assert sized_for(config, 100 * per_worker_base, workers=2).max_requests_per_unit == 32  # at most 4x
    never = replace(config, unit_growth=1)
    assert sized_for(never, 100 * per_worker_base, workers=1) is never
    # the planner keeps the grown bound, and the token budget still closes a unit early
    rng = random.Random(7)
    pending, _, _ = make_workload(rng, jobs=3, per_job=(400, 400), max_tokens=(1, 4))
    grown = sized_for(config, len(pending), workers=1)
    sizes = [len(u.requests) for u in plan_units(pending, grown)]
    assert max(sizes) == 32 and sum(sizes) == len(pending)
    capped = replace(grown, max_tokens_per_unit=min(r.cost for r in pending) * 12)
    assert max(len(u.requests) for u in plan_units(pending, capped)) <= 12


def test_lines_of_different_adapters_never_share_a_prefix_group_and_one_adapter_shares_one():
    from batchinfer.planner.grouping import Grouping
    from batchinfer.planner.prefix_tree import PrefixTree

    rng = random.Random(11)
    system = tokens(rng, 8 * BS)  # the same system prompt on every line
    adapters = ["", "invoice", "support", "invoice", "", "support"] * 3  # base and two adapters, interleaved
    pending = [PendingRequest("job0", i, system + tokens(rng, 20), 8, adapter=a) for i, a in enumerate(adapters)]
    config = PlannerConfig(block_size=BS)
    grouping = Grouping(PrefixTree(pending, BS), config)
    group_of = {r.index: grouping.group_of[p] for p, r in enumerate(pending)}
    for adapter in ("", "invoice", "support"):
        mine = {id(group_of[r.index]) for r in pending if r.adapter == adapter}
        assert len(mine) == 1 and group_of[adapters.index(adapter)] is not None, f"{adapter!r}: one group"
        assert group_of[adapters.index(adapter)].adapter == adapter
    assert len({g.key for g in grouping.groups}) == len(grouping.groups) == 3
    # the prompt is computed once per adapter: 5 of each adapter's 6 lines find it cached, not 17 of 18
    assert estimate_plan(pending, config).expected_cached_tokens == 3 * 5 * 8 * BS
    units = plan_units(pending, config)
    assert len(units) == 1 and units[0].shared_prefix_len == 8 * BS  # one unit: its adapters run in the same steps
    base_only = plan_units([r for r in pending if not r.adapter], config)[0]
    assert base_only.adapter == "" and base_only.prefix_key == prefix_key(system, "")
    invoice = plan_units([r for r in pending if r.adapter == "invoice"], config)[0]
    assert invoice.adapter == "invoice" and invoice.prefix_key == prefix_key(system, "", "invoice") != base_only.prefix_key


def test_a_prepared_line_names_an_adapter_when_its_model_is_not_its_batch_s():
    from batchinfer.engine.types import SamplingParams
    from batchinfer.jobs.records import PreparedRequest

    line = PreparedRequest(0, "/v1/chat/completions", "invoice", [1, 2, 3], SamplingParams(max_tokens=4))
    assert line.to_pending("j", base="llama-1b").adapter == "invoice"
    assert replace(line, model="llama-1b").to_pending("j", base="llama-1b").adapter == ""
    assert line.to_pending("j").adapter == ""  # no base known: planned as the base's (as before adapters)
