"""LoRA adapters named per line, end to end through `batchinfer run` (embedded: SQLite and local files): a batch
mixing a tiny Llama base and two peft adapters, each line's output the same as when it runs alone, metrics.adapter
and the body's model naming what answered, and the lines naming what is not served refused at validation."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import batchinfer, cli_env

BASE, FIRST, SECOND, OTHER = "tiny-base", "tiny-a1", "tiny-a2", "other-base"
PROMPTS = ["Once upon a time", "Summarise the invoice", "hello there, hi", "You are a helpful assistant."]


@pytest.fixture(scope="module")
def env(tmp_path_factory, model_cache) -> dict:
    from tests.engine.tiny_adapters import ALL_LINEAR, build_adapter
    from tests.engine.tiny_families import build_family_checkpoint

    root = tmp_path_factory.mktemp("adapters")
    base = build_family_checkpoint("llama", root / "base")
    adapters = {FIRST: str(build_adapter(base, root / FIRST, 8, ALL_LINEAR, seed=1)),
                SECOND: str(build_adapter(base, root / SECOND, 4, ["q_proj", "v_proj"], seed=2, rslora=True))}
    return cli_env(root, model_cache, BATCHINFER_MODEL=str(base), BATCHINFER_MODEL_ID=BASE, BATCHINFER_DTYPE="float32",
                   BATCHINFER_ADAPTERS=json.dumps(adapters), BATCHINFER_MODELS=json.dumps({OTHER: str(base)}),
                   BATCHINFER_MAX_LOADED_ADAPTERS="2")


def line(custom_id: str, model: str, prompt: str) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
                       "body": {"model": model, "prompt": prompt, "max_tokens": 6, "temperature": 0}})


def run(env: dict, folder: Path, lines: list[str], *flags: str) -> tuple[dict[str, dict], list[dict], str]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "batch.jsonl").write_text("\n".join(lines) + "\n")
    done = batchinfer(env, "run", str(folder / "batch.jsonl"), "-o", str(folder / "out.jsonl"), "--errors",
                      str(folder / "errors.jsonl"), *flags, timeout=600)
    out = folder / "out.jsonl"
    results = {r["custom_id"]: r for r in map(json.loads, out.read_text().splitlines())} if out.exists() else {}
    errors_file = folder / "errors.jsonl"
    errors = [json.loads(x) for x in errors_file.read_text().splitlines()] if errors_file.exists() else []
    return results, errors, done.stdout + done.stderr


def text(result: dict) -> str:
    return result["response"]["body"]["choices"][0]["text"]


def test_a_batch_mixing_base_and_adapters_answers_each_line_as_alone(env, tmp_path):
    models = [BASE, FIRST, SECOND]
    lines = [line(f"{m}-{i}", m, p) for i, p in enumerate(PROMPTS) for m in models]
    mixed, errors, log = run(env, tmp_path / "mixed", lines)
    assert not errors and len(mixed) == len(lines), log[-2000:]
    for m in models:
        for i in range(len(PROMPTS)):
            got = mixed[f"{m}-{i}"]
            assert got["response"]["body"]["model"] == m
            assert got["metrics"].get("adapter") == (None if m == BASE else m)
    answers = {m: [text(mixed[f"{m}-{i}"]) for i in range(len(PROMPTS))] for m in models}
    assert answers[BASE] != answers[FIRST] and answers[BASE] != answers[SECOND], "the adapters change the answers"
    for m, i in [(BASE, 0), (FIRST, 1), (SECOND, 2), (SECOND, 3)]:
        alone, errors, log = run(env, tmp_path / f"alone-{m}-{i}", [line(f"{m}-{i}", m, PROMPTS[i])])
        assert not errors, log[-2000:]
        assert text(alone[f"{m}-{i}"]) == text(mixed[f"{m}-{i}"]), f"{m}-{i} depends on its neighbours"


def test_a_line_naming_an_unknown_adapter_or_another_base_is_refused(env, tmp_path):
    lines = [line("fine", FIRST, PROMPTS[0]), line("unknown", "tiny-a3", PROMPTS[0]), line("other", OTHER, PROMPTS[0])]
    results, errors, log = run(env, tmp_path / "refused", lines, "--skip-invalid")
    codes = {e["custom_id"]: e["error"]["code"] for e in errors}
    assert codes == {"unknown": "model_not_found", "other": "mismatched_model"}, log[-2000:]
    assert set(results) == {"fine"} and results["fine"]["metrics"]["adapter"] == FIRST
