"""`/v1/responses` and `/v1/embeddings` batches and retries end to end: the official `openai` SDK and the CLI
as a thin client against a real `batchinfer serve` and worker (the `api` fixture of test_api)."""
from __future__ import annotations

import base64
import json
import os
import struct

import httpx
import openai
import pytest
import torch
from openai.types import CreateEmbeddingResponse
from openai.types.responses import Response

from cli_helpers import batchinfer
from jobfiles import chat_line
from test_api import api, client, jsonl, lines_of, new_key, wait_final  # noqa: F401  (api: the server fixture)


def responses_line(custom_id: str, **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/responses",
                       "body": {"model": "smollm2-135m-instruct", "temperature": 0, "max_output_tokens": 3, **body}})


def test_a_responses_batch_gives_response_objects(api):  # noqa: F811
    c = client(api, new_key(api))
    items = [{"role": "system", "content": "Be brief."},
             {"role": "user", "content": [{"type": "input_text", "text": "Hi!"}]}]
    uploaded = c.files.create(file=("in.jsonl", jsonl([
        responses_line("text", input="Hi!", instructions="Be brief.", metadata={"k": "v"}),
        responses_line("items", input=items),
        responses_line("call", input="What is 1 plus 2?", max_output_tokens=24, tools=[ADD],
                       tool_choice={"type": "function", "name": "add"}),
        responses_line("reasoning", input="Hi!", reasoning={"effort": "low"})])), purpose="batch")
    batch = c.batches.create(input_file_id=uploaded.id, endpoint="/v1/responses", completion_window="24h",
                             extra_body={"skip_invalid": True})
    batch = wait_final(c, batch.id)
    assert batch.status == "completed" and batch.endpoint == "/v1/responses"
    out = {o["custom_id"]: Response.model_validate(o["response"]["body"]) for o in lines_of(c, batch.output_file_id)}
    assert sorted(out) == ["call", "items", "text"]
    (call,) = out.pop("call").output  # held to the function's parameters by the grammar
    assert call.type == "function_call" and call.name == "add" and set(json.loads(call.arguments)) == {"a", "b"}
    for response in out.values():
        assert response.object == "response" and response.status in ("completed", "incomplete")
        assert response.output[0].type == "message" and response.output_text
        assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
        assert 1 <= response.usage.output_tokens <= 3
    assert out["text"].metadata == {"k": "v"} and out["text"].instructions == "Be brief."
    assert out["text"].usage.input_tokens == out["items"].usage.input_tokens  # instructions = a system item
    (refused,) = lines_of(c, batch.error_file_id)
    assert refused["custom_id"] == "reasoning" and refused["error"]["code"] == "unsupported_parameter"
    assert refused["response"]["status_code"] == 400 and refused["response"]["body"]["error"]["param"] == "reasoning"
    assert refused["error"]["param"] == "body.reasoning"


ADD = {"type": "function", "name": "add", "parameters": {"type": "object", "properties": {
    "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}


def embedding_line(custom_id: str, **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
                       "body": {"model": "smollm2-135m-instruct", **body}})


def _reference(model_cache: str, ids: list[int]) -> torch.Tensor:
    """transformers' own fp32 last-token pooling of the final (normed) hidden states."""
    from batchinfer.engine.loading.loader import load_model

    with torch.inference_mode():
        out = load_model(None, model_cache).hf_model(torch.tensor([ids]), output_hidden_states=True)
    return torch.nn.functional.normalize(out.hidden_states[-1][0, -1].float(), dim=0)


def test_an_embeddings_batch_gives_embedding_lists(api, tokenizer, model_cache):  # noqa: F811
    c = client(api, new_key(api))
    cat, tax = "The cat sat on the mat.", "Tax law is complicated."
    cat_ids = tokenizer.encode(cat, add_special_tokens=False)
    uploaded = c.files.create(file=("in.jsonl", jsonl([
        embedding_line("cat", input=cat), embedding_line("cat-again", input=cat), embedding_line("tax", input=tax),
        embedding_line("both", input=[cat, tax]), embedding_line("ids", input=cat_ids),
        embedding_line("b64", input=cat, encoding_format="base64"), embedding_line("short", input=cat, dimensions=16),
        chat_line("chat", "Hi")])), purpose="batch")
    batch = wait_final(c, c.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings",
                                           completion_window="24h", extra_body={"skip_invalid": True}).id)
    assert batch.status == "completed" and (batch.request_counts.completed, batch.request_counts.failed) == (7, 1)
    (refused,) = lines_of(c, batch.error_file_id)
    assert (refused["custom_id"], refused["error"]["code"]) == ("chat", "invalid_url")
    bodies = {o["custom_id"]: o["response"]["body"] for o in lines_of(c, batch.output_file_id)}
    b64 = bodies.pop("b64")["data"][0]["embedding"]
    out = {k: CreateEmbeddingResponse.model_validate(v) for k, v in bodies.items()}
    vec = {k: torch.tensor([d.embedding for d in v.data]) for k, v in out.items()}
    cat_vec = vec["cat"][0]
    assert out["cat"].usage.prompt_tokens == len(cat_ids) and abs(cat_vec.norm().item() - 1) < 1e-4
    assert torch.allclose(cat_vec, vec["cat-again"][0], atol=1e-3) and torch.allclose(cat_vec, vec["ids"][0], atol=1e-3)
    assert (cat_vec - vec["tax"][0]).abs().max() > 1e-2
    assert vec["both"].shape[0] == 2 and torch.allclose(vec["both"], torch.stack([cat_vec, vec["tax"][0]]), atol=1e-3)
    assert out["both"].usage.prompt_tokens == out["cat"].usage.prompt_tokens + out["tax"].usage.prompt_tokens
    decoded = torch.tensor(struct.unpack(f"<{len(cat_vec)}f", base64.b64decode(b64)))
    assert torch.allclose(decoded, cat_vec, atol=1e-3)
    assert vec["short"].shape == (1, 16)
    assert torch.allclose(vec["short"][0], torch.nn.functional.normalize(cat_vec[:16], dim=0), atol=1e-3)
    # the worker may run in bf16: the fp32 match within 1e-4 is tests/engine/test_embeddings.py's
    assert torch.nn.functional.cosine_similarity(cat_vec, _reference(model_cache, cat_ids), dim=0) > 0.99


def test_retry_runs_only_what_expired_and_merged_holds_each_custom_id_once(api, tmp_path):  # noqa: F811
    key = new_key(api)
    c = client(api, key)
    ids = [f"r{i}" for i in range(24)]
    uploaded = c.files.create(file=("in.jsonl", jsonl([chat_line(i, f"Count to {n + 40}.", max_tokens=48)
                                                       for n, i in enumerate(ids)])), purpose="batch")
    # a 1 s window: the sweep expires what has not started, long before 12 units of two requests of 48 tokens are
    # done (counting to 40 takes more than 48 tokens; 10 requests of 16 once finished within the second)
    first = wait_final(c, c.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                           completion_window="1s").id)
    assert first.status == "expired"
    done = {o["custom_id"] for o in lines_of(c, first.output_file_id)}
    expired = {e["custom_id"] for e in lines_of(c, first.error_file_id) if e["error"]["code"] == "batch_expired"}
    assert expired and done | expired == set(ids) and not done & expired
    headers = {"Authorization": f"Bearer {key}"}
    nothing = httpx.post(f"{api[0]}/v1/batches/{first.id}/retry", json={"error_codes": ["server_error"]},
                         headers=headers)
    assert nothing.status_code == 400 and nothing.json()["error"]["code"] == "nothing_to_retry"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BATCHINFER_", "AWS_"))}
    env.update({"BATCHINFER_API_URL": api[0], "BATCHINFER_API_KEY": key, "BATCHINFER_DATA_DIR": str(tmp_path / "d")})
    made = batchinfer(env, "retry", first.id, "--code", "batch_expired", "--json")
    assert made.returncode == 0, made.stderr
    retry = wait_final(c, json.loads(made.stdout)["id"], timeout=600)
    assert retry.status == "completed" and retry.metadata["retry_of"] == first.id
    assert sorted(o["custom_id"] for o in lines_of(c, retry.output_file_id)) == sorted(expired)  # nothing reran
    merged = [json.loads(line) for line in
              httpx.get(f"{api[0]}/v1/files/{first.output_file_id}/content", params={"merged": "true"},
                        headers=headers).text.splitlines()]
    assert sorted(m["custom_id"] for m in merged) == sorted(ids) and all(m["response"] for m in merged)
    out = tmp_path / "merged.jsonl"
    assert batchinfer(env, "download", retry.id, "--merged", "-o", str(out)).returncode == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == merged  # from either end of the chain


def test_retry_refuses_a_batch_still_running_and_another_tenants(api):  # noqa: F811
    mine, theirs = new_key(api, "mine"), new_key(api, "theirs")
    c = client(api, mine)
    uploaded = c.files.create(file=("in.jsonl", jsonl([chat_line("a", "Hi", max_tokens=2)])), purpose="batch")
    batch = c.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    running = httpx.post(f"{api[0]}/v1/batches/{batch.id}/retry", headers={"Authorization": f"Bearer {mine}"})
    # 409 while it runs; if it ended before the call landed, every request succeeded: nothing to retry
    assert (running.status_code, running.json()["error"]["code"]) in ((409, "conflict"), (400, "nothing_to_retry"))
    final = wait_final(c, batch.id)
    for key in (theirs, mine):
        answer = httpx.post(f"{api[0]}/v1/batches/{batch.id}/retry", headers={"Authorization": f"Bearer {key}"})
        assert answer.status_code == (404 if key == theirs else 400)  # mine: every request succeeded
    with pytest.raises(openai.NotFoundError):
        client(api, theirs).files.content(final.output_file_id, extra_query={"merged": "true"})
