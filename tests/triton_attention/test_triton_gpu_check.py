"""The parts of benchmarks/gpu_check.py that need no GPU: arguments, the workload, the no-CUDA exit."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_triton_gpu_check_workload_shares_each_prefix_within_its_group(gpu_check):
    prompts = gpu_check.shared_prefix_workload(groups=3, per_group=4, prefix_len=10, suffix_len=2, seed=1)
    assert len(prompts) == 12 and all(len(p) == 12 for p in prompts)
    prefixes = [tuple(p[:10]) for p in prompts]
    assert len(set(prefixes)) == 3 and all(prefixes.count(x) == 4 for x in set(prefixes))
    assert len({tuple(p) for p in prompts}) == 12
    assert min(min(p) for p in prompts) >= 3  # never a special token
    assert prompts == gpu_check.shared_prefix_workload(3, 4, 10, 2, seed=1)


def test_triton_gpu_check_parses_its_options(gpu_check):
    args = gpu_check.parse_args(["--out", "r.json", "--skip-e2e", "--max-tokens", "16"])
    assert (args.out, args.skip_e2e, args.max_tokens, args.skip_bench_cli) == ("r.json", True, 16, False)
    assert gpu_check.main([]) == 2  # --out is required


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given on a machine without CUDA")
def test_triton_gpu_check_exits_with_a_clear_message_without_cuda(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "CUDA is not available" in proc.stderr
    assert not out.exists()


def test_triton_gpu_check_passes_bench_only_options_it_has(gpu_check):
    args = gpu_check.parse_args(["--out", "r.json", "--model", "m.gguf"])
    help_text = subprocess.run(gpu_check.bench_command() + ["--help"], capture_output=True, text=True, timeout=120,
                               env={**os.environ, "COLUMNS": "200"}).stdout
    options = [a for a in gpu_check.bench_cli_args(args, "out") if a.startswith("--")]
    assert "--device" in options and all(option in help_text for option in options), help_text


def test_triton_gpu_check_packs_config_and_tokenizer_without_weights(gpu_check, tmp_path):
    cache = os.environ.get("BATCHINFER_MODEL_CACHE") or str(Path.home() / ".cache" / "batchinfer" / "models")
    names = gpu_check.pack_model(str(tmp_path / "pack"), None, cache)
    assert {"config.json", "tokenizer.json"} <= set(names)
    assert not any(name.endswith((".safetensors", ".gguf", ".bin")) for name in names)
    assert sum(p.stat().st_size for p in (tmp_path / "pack").iterdir()) < 16 << 20
