"""`/v1/completions`: a line's body (a prompt and sampling), and its result body (`text_completion`)."""
from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, StrictInt

from batchinfer.jobs.endpoints.fields import LOGPROBS_RULE, MAX_TOP_LOGPROBS, NonEmptyText, token_text, usage
from batchinfer.jobs.endpoints.sampling import Sampling

COMPLETIONS_URL = "/v1/completions"


class CompletionBody(Sampling):
    PROMPT_FIELD: ClassVar[str] = "prompt"

    prompt: NonEmptyText | Annotated[list[NonEmptyText], Field(min_length=1, max_length=1)] = Field(
        description="a non-empty string (or a list of one)")
    logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = Field(None, description=LOGPROBS_RULE)

    def top_logprob_count(self) -> int | None:
        return self.logprobs

    def prompt_text(self, tokenizer) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


def result_body(rid: str, model: str, result, echo: dict | None = None) -> dict:
    """A `text_completion`: one choice per sample, usage counting the prompt once."""
    samples = getattr(result, "samples", None) or [result]
    return {"id": f"cmpl-{rid}", "object": "text_completion", "created": int(result.last_token_time), "model": model,
            "choices": [choice(i, s) for i, s in enumerate(samples)],
            "usage": usage(result.prompt_tokens, result.completion_tokens, result.cached_tokens)}


def choice(index: int, result) -> dict:
    return {"index": index, "text": result.text, "logprobs": logprobs(getattr(result, "logprobs", None)),
            "finish_reason": result.finish_reason, "stop_reason": getattr(result, "stop_reason", None)}


def logprobs(entries) -> dict | None:
    """The legacy completions object; text_offset counts characters from the completion's start (vLLM without echo)."""
    if entries is None:
        return None
    tokens = [token_text(e.token_bytes) for e in entries]
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    top = [{token_text(b): lp for b, (_, lp) in zip(e.top_bytes, e.top)} for e in entries]
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries], "top_logprobs": top,
            "text_offset": offsets}
