"""`/v1/chat/completions`: a line's body (messages and sampling), and its result body (`chat.completion`)."""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, Field, StrictBool, StrictInt, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from batchinfer.jobs.endpoints.fields import (LOGPROBS_RULE, MAX_TOP_LOGPROBS, ROLES, Role, Text, template_message,
                                              token_text, usage)
from batchinfer.jobs.endpoints.sampling import Sampling

CHAT_URL = "/v1/chat/completions"


class TextPart(BaseModel):
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    role: Role = Field(description=f"one of {', '.join(ROLES)}")
    content: Text | list[TextPart] = Field(description="a string or a list of text parts")


class ChatBody(Sampling):
    PROMPT_FIELD: ClassVar[str] = "messages"

    messages: list[ChatMessage] = Field(min_length=1, description="a non-empty array of messages")
    logprobs: StrictBool | None = Field(None, description=LOGPROBS_RULE)
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = Field(
        None, description=f"an integer in [0, {MAX_TOP_LOGPROBS}], with logprobs: true")

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, value, info: ValidationInfo):
        if value is not None and info.data.get("logprobs") is not True:
            raise PydanticCustomError("invalid_field", "needs logprobs: true")
        return value

    def top_logprob_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def prompt_text(self, tokenizer) -> str:
        messages = [template_message(m.role, m.content) for m in self.messages]
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def result_body(rid: str, model: str, result, echo: dict | None = None) -> dict:
    """A `chat.completion`: one choice per sample, usage counting the prompt once."""
    samples = getattr(result, "samples", None) or [result]
    return {"id": f"chatcmpl-{rid}", "object": "chat.completion", "created": int(result.last_token_time),
            "model": model, "choices": [choice(i, s) for i, s in enumerate(samples)],
            "usage": usage(result.prompt_tokens, result.completion_tokens, result.cached_tokens)}


def choice(index: int, result) -> dict:
    # stop_reason is vLLM's extra: the stop string or stop token id that ended the sample, else null
    return {"index": index, "message": {"role": "assistant", "content": result.text},
            "logprobs": logprobs(getattr(result, "logprobs", None)), "finish_reason": result.finish_reason,
            "stop_reason": getattr(result, "stop_reason", None)}


def logprobs(entries) -> dict | None:
    """Chat's `logprobs.content[]`."""
    if entries is None:
        return None
    content = [{"token": token_text(e.token_bytes), "logprob": e.logprob, "bytes": list(e.token_bytes),
                "top_logprobs": [{"token": token_text(b), "logprob": lp, "bytes": list(b)}
                                 for b, (_, lp) in zip(e.top_bytes, e.top)]}
               for e in entries]
    return {"content": content, "refusal": None}
