"""The bench command end to end on a tiny workload, plus its FLOP formula and workload shapes."""
from __future__ import annotations

import json

import pytest
import typer
from transformers import AutoTokenizer
from typer.testing import CliRunner

from batchinfer.bench.command import bench
from batchinfer.bench.flops import ModelShape
from batchinfer.bench.workloads import build
from batchinfer.engine.loader import resolve_model_dir
from batchinfer.settings import get_settings

SMOLLM2 = ModelShape(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model_dir(None, get_settings().model_cache))


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
