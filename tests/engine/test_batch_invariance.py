"""Issue 20: a request's output is bitwise the same whatever shares its steps and whatever the cache holds.

24 requests (24 prompts of mixed lengths, two groups sharing a long prefix, greedy and seeded in turn) are run
each alone, in a batch of 64 mixed requests, in reverse order, with the prefix cache cold and warm, with
preemption forced by a small KV budget, and in a second process: tokens and
logprobs must be bitwise equal to the run alone. There is one attention path (chunked.py), so cascade and
non-cascade are the same arithmetic by construction; the shared-prefix groups above exercise it. bf16 runs
where the CPU has native bf16 (AMX or AVX512-BF16) and is skipped elsewhere with the reason.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from batchinfer.engine.dtype import cpu_has_native_bf16
from tests.engine import invariance_cases

DTYPES = ["float32", pytest.param("bfloat16", marks=pytest.mark.skipif(
    not cpu_has_native_bf16(), reason="bf16 invariance is checked where the CPU has AMX or AVX512-BF16; this one has neither"))]


@pytest.fixture(scope="module", params=DTYPES)
def found(request, loaded_model):
    return request.param, invariance_cases.arrangements(loaded_model, request.param)


ARRANGEMENTS = ["batch of 64", "reverse order", "prefix cache cold", "prefix cache warm", "preempted (small KV budget)"]


@pytest.mark.parametrize("arrangement", ARRANGEMENTS)
def test_outputs_are_bitwise_those_of_the_request_alone(found, arrangement):
    _, runs = found
    ref, got = runs["alone"], runs[arrangement]
    differ = sorted(k for k in ref if got.get(k) != ref[k])
    assert not differ, f"{len(differ)}/{len(ref)} requests differ from their run alone: {differ[:6]}"


def test_the_small_kv_budget_did_preempt(found):
    assert found[1]["preemptions"]["count"] > 0


def test_a_second_process_gives_the_same_outputs(found, tmp_path):
    dtype, runs = found
    path = tmp_path / "out.json"
    env = dict(os.environ)
    subprocess.run([sys.executable, "-m", "tests.engine.invariance_cases", dtype, str(path)], check=True, env=env,
                   cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    other = {k: (v[0], v[1]) for k, v in json.loads(path.read_text()).items()}
    ref = {k: (list(v[0]), list(v[1])) for k, v in runs["alone"].items()}
    differ = sorted(k for k in ref if other.get(k) != ref[k])
    assert not differ, f"{len(differ)}/{len(ref)} requests differ in a second process: {differ[:6]}"
