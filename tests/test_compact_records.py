"""Dispatch keeps prompt token ids as array('i'), and the prefix tree copies none: the tree still matches
prefixes exactly (checked against a naive pairwise scan), the plan and routing keys are those of tuples,
and a compact record writes the same unit input line."""
from __future__ import annotations

import random
import tracemalloc
from array import array

import pytest

from batchinfer.engine.types import SamplingParams
from batchinfer.jobs.records import PreparedRequest, UnitRequest, dumps
from batchinfer.planner import PendingRequest, PlannerConfig, plan_units, prefix_key
from batchinfer.planner.prefix_tree import PrefixTree

pytestmark = pytest.mark.fast

BS = 4  # small blocks: many splits inside edges, and prompts shorter than a block


def _workload(rng: random.Random, n: int) -> list[PendingRequest]:
    """Prompts that share prefixes of random lengths (not only whole blocks), nested, in two scopes."""
    stems = [[rng.randrange(300, 50000) for _ in range(rng.randint(0, 40))] for _ in range(6)]
    out = []
    for i in range(n):
        base = list(rng.choice(stems))
        if out and rng.random() < 0.4:  # extend or cut another request's prompt: splits deep in an edge
            base = list(rng.choice(out).prompt_token_ids[:rng.randint(0, 50)])
        ids = base + [rng.randrange(300, 50000) for _ in range(rng.randint(0, 12))]
        out.append(PendingRequest("j", i, tuple(ids), rng.randint(1, 30), scope=rng.choice(["", "", "t2"])))
    return out


def _shared_blocks(a: PendingRequest, b: PendingRequest) -> int:
    """Tokens of whole blocks two requests share in the engine's cache (same scope only)."""
    if a.scope != b.scope:
        return 0
    full, k = min(len(a.prompt_token_ids), len(b.prompt_token_ids)) // BS * BS, 0
    while k < full and tuple(a.prompt_token_ids[k:k + BS]) == tuple(b.prompt_token_ids[k:k + BS]):
        k += BS
    return k


def _compact(requests: list[PendingRequest]) -> list[PendingRequest]:
    return [PendingRequest(r.job_id, r.index, array("i", r.prompt_token_ids), r.max_tokens, scope=r.scope)
            for r in requests]


@pytest.mark.parametrize("seed", range(8))
def test_the_tree_over_arrays_finds_every_shared_prefix(seed):
    rng = random.Random(seed)
    requests = _compact(_workload(rng, 120))
    order = list(range(len(requests)))
    rng.shuffle(order)
    tree = PrefixTree(requests, BS)
    cached = tree.cached_in_order(order)
    for n, p in enumerate(order):  # a request finds cached what some earlier request shares with it
        expected = max((_shared_blocks(requests[p], requests[q]) for q in order[:n]), default=0)
        assert cached[n] == expected, (n, p)
    blocks = [(r.scope, tuple(r.prompt_token_ids[:k])) for r in requests
              for k in range(BS, len(r.prompt_token_ids) + 1, BS)]
    assert tree.expected_cached_tokens() == (len(blocks) - len(set(blocks))) * BS == sum(cached)  # edge lengths


@pytest.mark.parametrize("seed", range(6))
def test_arrays_plan_the_units_tuples_plan(seed):
    rng = random.Random(50 + seed)
    as_tuples = _workload(rng, 300)
    config = PlannerConfig(max_requests_per_unit=rng.choice([4, 16]), max_tokens_per_unit=rng.choice([300, 2000]),
                           block_size=BS, min_group_prefix_tokens=8)

    def shape(units):
        return [(u.prefix_key, u.shared_prefix_len, u.expected_cached_tokens, [(r.index) for r in u.requests])
                for u in units]

    planned = shape(plan_units(as_tuples, config))
    assert any(key for key, *_ in planned), "the workload must form prefix groups"
    assert shape(plan_units(_compact(as_tuples), config)) == planned


def test_a_routing_key_does_not_depend_on_how_the_ids_are_kept():
    ids = (7, 300, 49151, 2**31 - 1)  # the same key in a process that reads tuples (eta) and in dispatch
    assert prefix_key(array("i", ids), "t") == prefix_key(ids, "t") == prefix_key(list(ids), "t")


def _record(index: int, tokens: int) -> PreparedRequest:
    rng = random.Random(index)
    return PreparedRequest(index, "/v1/chat/completions", "m",
                           [rng.randrange(300, 50000) for _ in range(tokens)],
                           SamplingParams(max_tokens=3, stop=("x",), logit_bias={5: 1.0}), {"metadata": {"a": 1}})


def test_a_compact_record_writes_the_same_unit_input_and_shares_its_ids():
    raw = _record(3, 500).to_json()
    compact = PreparedRequest.from_json(raw).compact()
    assert isinstance(compact.prompt_token_ids, array)
    assert UnitRequest("j", compact, "s").to_json() == UnitRequest("j", PreparedRequest.from_json(raw), "s").to_json()
    assert compact.to_pending("j").prompt_token_ids is compact.prompt_token_ids  # the planner copies nothing


def test_a_round_keeps_about_four_bytes_a_token():
    lines = [_record(i, 2000).to_json() for i in range(100)]
    tracemalloc.start()
    try:
        kept = [PreparedRequest.from_json(raw).compact() for raw in lines]
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(kept) == 100 and held < 100 * 2000 * 6  # a list of ints held ~36 bytes a token


@pytest.mark.parametrize("seed, echo", [(7, None), (2 ** 64 - 1, {"metadata": {"big": 2 ** 80 + 1}})])
def test_a_record_survives_its_json_line_whatever_it_holds(seed, echo):
    """Records are written with orjson, and with json where orjson refuses (an int past 64 bits): every field comes
    back, the logit bias's int keys included, and the line is one line of compact UTF-8 JSON."""
    sampling = SamplingParams(max_tokens=3, temperature=0.7, seed=seed, stop=("é\n", "\\", "ünï\t✓"),
                              logit_bias={42: -1.5}, stop_token_ids=(2,), guided=("json", '{"type": "object"}'))
    req = PreparedRequest(5, "/v1/chat/completions", "m", [1, 2, 3], sampling, echo)
    raw = UnitRequest("job", req, "salt").to_json()
    assert b"\n" not in raw and b", " not in raw
    back = UnitRequest.from_json(raw)
    assert (back.job_id, back.cache_salt, back.request) == ("job", "salt", req)
    assert PreparedRequest.from_json(req.to_json()) == req
    if echo:  # exact, not a float that compares equal
        assert back.request.echo["metadata"]["big"] - 2 ** 80 == 1 and type(back.request.echo["metadata"]["big"]) is int


def test_a_results_line_carries_the_output_line_as_the_job_file_gets_it():
    import json

    from batchinfer.jobs.endpoints import batch_line as formats
    from batchinfer.jobs.records import ResultLine, UnitResult

    record = {"logprob": float("-inf"), "text": "é\n 1 2", "n": 2 ** 70}
    raw = UnitResult("batch_j", 1, 2, True, record, 3, 4, 5).to_line()
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1
    back = ResultLine.parse(raw)
    assert (back.job_id, back.index, back.line, back.ok) == ("batch_j", 1, 2, True)
    assert back.output == formats.dumps(record) and b"-Infinity" in back.output
    failed = ResultLine.parse(UnitResult("batch_j", 7, 9, False, {"error": {"message": "ünï"}}).to_line())
    assert (failed.index, failed.line, failed.ok) == (7, 9, False) and "ünï".encode() in failed.output
    # a results file written before this format (a JSON line) still assembles to the same output line
    old = json.dumps({"job_id": "batch_j", "index": 1, "line": 2, "ok": True, "record": record, "prompt_tokens": 3,
                      "completion_tokens": 4, "cached_tokens": 5}, separators=(",", ":")).encode() + b"\n"
    assert ResultLine.parse(old) == back


def test_a_record_an_earlier_version_wrote_still_reads():
    """Prepared and unit input lines once held the request's line and custom_id (the requests table's now)."""
    req = _record(3, 5)
    assert PreparedRequest.from_json(dumps({**req.to_dict(), "line": 4, "custom_id": "r3"})) == req
