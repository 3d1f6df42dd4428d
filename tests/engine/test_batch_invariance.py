"""Issue 20: a request's output is bitwise the same whatever shares its steps and whatever the cache holds.

24 requests (24 prompts of mixed lengths, two groups sharing a long prefix, greedy and seeded in turn) are run
each alone, in a batch of 64 mixed requests, in reverse order, with the prefix cache cold and warm, with
preemption forced by a small KV budget, and in a second process: tokens and
logprobs must be bitwise equal to the run alone. There is one attention path (chunked.py), so cascade and
non-cascade are the same arithmetic by construction; the shared-prefix groups above exercise it. bf16 runs
where the CPU has native bf16 (AMX or AVX512-BF16) and is skipped elsewhere with the reason; the GGUF's own
blocks (weight_format gguf, int8 activations, the default where the CPU has AVX2, FMA and F16C) run where the
integer kernel does (its fastest path here: AMX, AVX-512 VNNI or AVX2), and are skipped elsewhere with the reason.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from batchinfer.engine.machine.dtype import cpu_has_native_bf16
from batchinfer.engine.quant.kernel import supported as cpu_supported
from tests.engine import invariance_cases

# (dtype, weight format)
CASES = [("float32", "dense"), pytest.param(("bfloat16", "dense"), marks=pytest.mark.skipif(
    not cpu_has_native_bf16(), reason="bf16 invariance is checked where the CPU has AMX or AVX512-BF16; this one has neither")),
    pytest.param(("float32", "gguf"), marks=pytest.mark.skipif(
        not cpu_supported(), reason="the integer kernel needs AVX2, FMA and F16C; this CPU lacks one"))]


@pytest.fixture(scope="module", params=CASES, ids=lambda case: "-".join(case))
def found(request, loaded_model):
    dtype, weight_format = request.param
    loaded = loaded_model if weight_format == "dense" else invariance_cases.load(weight_format)
    assert loaded.weight_format == weight_format
    return request.param, invariance_cases.arrangements(loaded, dtype)


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
    (dtype, weight_format), runs = found
    path = tmp_path / "out.json"
    env = dict(os.environ)
    subprocess.run([sys.executable, "-m", "tests.engine.invariance_cases", dtype, str(path), weight_format], check=True,
                   env=env,
                   cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    other = {k: (v[0], v[1]) for k, v in json.loads(path.read_text()).items()}
    ref = {k: (list(v[0]), list(v[1])) for k, v in runs["alone"].items()}
    differ = sorted(k for k in ref if other.get(k) != ref[k])
    assert not differ, f"{len(differ)}/{len(ref)} requests differ in a second process: {differ[:6]}"
