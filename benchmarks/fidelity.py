"""`batchinfer bench fidelity`: how often greedy texts agree, on the same GGUF and the bench prompts, between
this engine (weight_format gguf: the file's blocks, int8 activations) and llama.cpp, against how often llama.cpp
agrees with itself across its own batch settings (one request at a time vs multi-sequence batches).

A prompt agrees when the two token lists are equal (each stopped at EOS or max_tokens); the report also gives the
mean share of tokens before the first difference. Raw token lists are kept in the JSON.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from .process import SUITES
from .process_command import _lscpu_model, _uptime
from .workloads import build


def _prompts(tokenizer, suite: str) -> list[tuple[list[int], int]]:
    out = []
    for name, requests, max_tokens in SUITES[suite].values():
        if name != "single":
            out += [(p, max_tokens) for p in build(name, tokenizer, requests, max_tokens).prompts]
    return out


def _ours(gguf: str, cache: str, prompts) -> list[list[int]]:
    from batchinfer.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams

    engine = LLMEngine.from_pretrained(gguf, cache, EngineConfig(weight_format="gguf"))
    results = engine.generate([GenerationRequest(f"p{i}", ids, SamplingParams(max_tokens=n, temperature=0))
                               for i, (ids, n) in enumerate(prompts)])
    eos = engine.stop_checker.eos_token_ids
    return [[t for t in r.output_token_ids if t not in eos] for r in results]


def _llamacpp_one_at_a_time(gguf: str, threads: int, prompts) -> list[list[int]]:
    from llama_cpp import Llama

    import llama_cpp

    llm = Llama(model_path=gguf, n_ctx=4096, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    out = []
    for ids, n in prompts:
        tokens: list[int] = []
        for token in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
            if llama_cpp.llama_vocab_is_eog(vocab, token):
                break
            tokens.append(token)
            if len(tokens) == n:
                break
        out.append(tokens)
    return out


def _llamacpp_batched(gguf: str, threads: int, prompts) -> list[list[int]]:
    from .runners.llamacpp_batched import MultiSequenceLlama

    llm = MultiSequenceLlama(gguf, threads)
    try:
        out: list[list[int]] = [[] for _ in prompts]
        by_length: dict[int, list[int]] = {}
        for i, (_, n) in enumerate(prompts):
            by_length.setdefault(n, []).append(i)
        for n, index in by_length.items():
            for i, seq in zip(index, llm.generate([prompts[i][0] for i in index], n, stop_at_eos=True)):
                out[i] = [t for t in seq.tokens if not llm.lib.llama_vocab_is_eog(llm.vocab, t)]
        return out
    finally:
        llm.close()


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    same = sum(x == y for x, y in zip(a, b))
    shares = []
    for x, y in zip(a, b):
        first = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        shares.append(first / max(len(x), len(y), 1))
    return {"equal": same, "prompts": len(a), "rate": round(same / len(a), 4),
            "mean_agreeing_prefix": round(sum(shares) / len(shares), 4)}


def bench_fidelity_command(
    model: Annotated[str | None, typer.Option("--model", help="a GGUF file (default: SmolLM2's Q4_1)")] = None,
    suite: Annotated[str, typer.Option(help=f"the prompts: {' | '.join(SUITES)}")] = "smollm2",
    threads: Annotated[int, typer.Option(help="llama.cpp threads")] = 2,
    out: Annotated[str, typer.Option("--out", help="JSON report")] = "bench-fidelity.json",
) -> None:
    """Greedy agreement with llama.cpp on the same file, against llama.cpp's agreement with itself."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise typer.BadParameter("llama.cpp is not installed: make llamacpp") from None
    from batchinfer.engine.loading.light_loader import LightTokenizer
    from batchinfer.engine.loading.loader import default_model_path, model_files_dir
    from batchinfer.settings import get_settings

    if suite not in SUITES:
        raise typer.BadParameter(f"unknown suite {suite!r}; choose from {', '.join(SUITES)}")
    settings = get_settings()
    gguf = str(Path(model).resolve()) if model else default_model_path()
    prompts = _prompts(LightTokenizer(model_files_dir(gguf, settings.model_cache)), suite)
    started = time.time()
    runs = {"llamacpp_one_at_a_time": _llamacpp_one_at_a_time(gguf, threads, prompts),
            "llamacpp_batched": _llamacpp_batched(gguf, threads, prompts),
            "batchinfer_gguf": _ours(gguf, str(settings.model_cache), prompts)}
    report: dict[str, Any] = {"model": gguf, "prompts": len(prompts), "cpu": _lscpu_model(), "load": _uptime(),
              "seconds": round(time.time() - started, 1),
              "llamacpp_with_itself": agreement(runs["llamacpp_one_at_a_time"], runs["llamacpp_batched"]),
              "batchinfer_vs_llamacpp_one_at_a_time": agreement(runs["batchinfer_gguf"], runs["llamacpp_one_at_a_time"]),
              "batchinfer_vs_llamacpp_batched": agreement(runs["batchinfer_gguf"], runs["llamacpp_batched"]),
              "tokens": runs}
    Path(out).write_text(json.dumps(report, indent=1))
    for key in ("llamacpp_with_itself", "batchinfer_vs_llamacpp_one_at_a_time", "batchinfer_vs_llamacpp_batched"):
        r = report[key]
        typer.echo(f"{key}: {r['equal']}/{r['prompts']} equal ({r['rate']:.0%}), "
                   f"mean agreeing prefix {r['mean_agreeing_prefix']:.0%}")
    typer.echo(f"raw: {out}")
