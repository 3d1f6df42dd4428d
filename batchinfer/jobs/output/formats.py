"""Output and error lines in the OpenAI Batch output format, plus per-request metrics."""
from __future__ import annotations

import hashlib

from batchinfer.jobs.input.input_line import CHAT_URL
from batchinfer.jobs.input.embeddings_line import embeddings_body
from batchinfer.jobs.input.responses_line import RESPONSES_URL, response_body
from batchinfer.jobs.output.logprob_shapes import chat_logprobs, completion_logprobs
from batchinfer.jobs.records import output_line_bytes


def request_id(job_id: str, index: int) -> str:
    """Deterministic, so a unit that runs twice writes the same ids."""
    return hashlib.sha1(f"{job_id}:{index}".encode()).hexdigest()[:24]


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def metrics(result, worker: str) -> dict:
    return {"queue_s": round(result.queue_s, 6), "ttft_s": round(result.ttft_s, 6),
            "tpot_s": round(result.tpot_s, 6), "e2e_s": round(result.e2e_s, 6), "worker": worker}


def completion_body(url: str, rid: str, model: str, result, echo: dict | None = None) -> dict:
    if url == RESPONSES_URL:
        return response_body(rid, model, result, echo)
    created = int(result.last_token_time)
    use = usage(result.prompt_tokens, result.completion_tokens, result.cached_tokens)  # the prompt once, every sample
    samples = getattr(result, "samples", None) or [result]  # n > 1: one choice per sample
    if url == CHAT_URL:
        return {"id": f"chatcmpl-{rid}", "object": "chat.completion", "created": created, "model": model,
                "choices": [chat_choice(i, s) for i, s in enumerate(samples)], "usage": use}
    return {"id": f"cmpl-{rid}", "object": "text_completion", "created": created, "model": model,
            "choices": [completion_choice(i, s) for i, s in enumerate(samples)], "usage": use}


def chat_choice(index: int, result) -> dict:
    # stop_reason is vLLM's extra: the stop string or stop token id that ended the sample, else null
    return {"index": index, "message": {"role": "assistant", "content": result.text},
            "logprobs": chat_logprobs(getattr(result, "logprobs", None)), "finish_reason": result.finish_reason,
            "stop_reason": getattr(result, "stop_reason", None)}


def completion_choice(index: int, result) -> dict:
    return {"index": index, "text": result.text, "logprobs": completion_logprobs(getattr(result, "logprobs", None)),
            "finish_reason": result.finish_reason, "stop_reason": getattr(result, "stop_reason", None)}


def output_line(job_id: str, index: int, custom_id: str, url: str, model: str, result, worker: str,
                echo: dict | None = None) -> dict:
    rid = request_id(job_id, index)
    return {"id": f"batch_req_{rid}", "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": rid, "body": completion_body(url, rid, model, result, echo)},
            "error": None, "metrics": metrics(result, worker)}


def embeddings_output_line(job_id: str, index: int, custom_id: str, model: str, results: list, worker: str,
                           echo: dict | None = None) -> dict:
    """One embedding object for each input's result, in input order."""
    rid = request_id(job_id, index)
    body = embeddings_body(model, [r.embedding for r in results], sum(r.prompt_tokens for r in results), echo)
    return {"id": f"batch_req_{rid}", "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": rid, "body": body},
            "error": None, "metrics": metrics(results[-1], worker)}


def error_line(job_id: str, index: int | None, custom_id: str | None, code: str, message: str,
               line: int | None = None, param: str | None = None) -> dict:
    rid = request_id(job_id, index if index is not None else -(line or 0))
    return {"id": f"batch_req_{rid}", "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message, "line": line, "param": param}, "metrics": None}


dumps = output_line_bytes
