"""An OpenAI Batch input line as pydantic models: the envelope, and the body of each supported url.

Each field's description is the rule a message states when the field is wrong ("temperature must be ...").
Strings are strict (a number is not a string) and must be valid Unicode: a lone surrogate from a JSON
escape could neither be tokenized nor stored.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, StrictStr, model_validator
from pydantic_core import PydanticCustomError

from batchinfer.engine.types import MAX_SEED, MIN_SEED, SamplingParams

Url = Literal["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"]  # bodies: jobs.input.bodies
SUPPORTED_URLS: tuple[str, ...] = get_args(Url)
CHAT_URL, COMPLETIONS_URL = SUPPORTED_URLS[:2]
Role = Literal["system", "user", "assistant", "developer"]
ROLES = get_args(Role)
MAX_STOP = 4
CUSTOM_ID_MAX_CHARS = 512  # the requests.custom_id column


def _unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise PydanticCustomError("invalid_field", "must be valid Unicode (it holds a lone surrogate)") from None
    return text


def _no_nul(text: str) -> str:
    if "\x00" in text:
        raise PydanticCustomError("invalid_field", "must not contain a NUL character")
    return text


Text = Annotated[StrictStr, AfterValidator(_unicode)]
NonEmptyText = Annotated[Text, Field(min_length=1)]
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
CustomId = Annotated[StrictStr, Field(min_length=1, max_length=CUSTOM_ID_MAX_CHARS), AfterValidator(_unicode),
                     AfterValidator(_no_nul)]


class InputLine(BaseModel):
    """One line's envelope; its body is checked by the model of its url (BODIES)."""

    model_config = ConfigDict(extra="ignore")

    custom_id: CustomId = Field(description=f"a non-empty string of at most {CUSTOM_ID_MAX_CHARS} characters")
    method: Literal["POST"] = Field(description="POST")
    url: Url = Field(description=f"one of {', '.join(SUPPORTED_URLS)}")
    body: dict[str, Any] = Field(description="an object")


class TextPart(BaseModel):
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    role: Role = Field(description=f"one of {', '.join(ROLES)}")
    content: Text | list[TextPart] = Field(description="a string or a list of text parts")

    def for_template(self) -> dict[str, str]:
        role = "system" if self.role == "developer" else self.role
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": role, "content": content}


class Sampling(BaseModel):
    """The sampling fields both bodies share; None (or absent) means the default."""

    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = Field(None, description="an integer >= 1")
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = Field(None, description="an integer >= 1")
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = Field(None, description="a number in [0, 2]")
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = Field(None, description="a number in (0, 1]")
    top_k: Annotated[StrictInt, Field(ge=-1)] | None = Field(None, description="an integer >= 0 (or -1: no cut)")
    seed: Annotated[StrictInt, Field(ge=MIN_SEED, le=MAX_SEED)] | None = Field(
        None, description="an integer in [-2**63, 2**64-1]")
    stop: NonEmptyText | Annotated[list[NonEmptyText], Field(max_length=MAX_STOP)] | None = Field(
        None, description=f"a non-empty string or a list of up to {MAX_STOP} of them")
    n: Literal[1] = Field(1, description="1 (only n=1 is supported)")

    @model_validator(mode="before")
    @classmethod
    def _one_token_limit(cls, data: Any) -> Any:
        """max_completion_tokens (the newer name) wins: max_tokens beside it is not read at all."""
        if isinstance(data, dict) and "max_completion_tokens" in data:
            return {k: v for k, v in data.items() if k != "max_tokens"}
        return data

    def params(self, default_max_tokens: int) -> SamplingParams:
        limit = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        stop = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return SamplingParams(max_tokens=limit if limit is not None else default_max_tokens,
                              temperature=1.0 if self.temperature is None else float(self.temperature),
                              top_p=1.0 if self.top_p is None else float(self.top_p),
                              top_k=0 if self.top_k in (None, -1) else self.top_k, seed=self.seed, stop=tuple(stop))


class ChatBody(Sampling):
    PROMPT_FIELD: ClassVar[str] = "messages"

    messages: list[ChatMessage] = Field(min_length=1, description="a non-empty array of messages")

    def prompt_text(self, tokenizer) -> str:
        messages = [m.for_template() for m in self.messages]
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


class CompletionBody(Sampling):
    PROMPT_FIELD: ClassVar[str] = "prompt"

    prompt: NonEmptyText | Annotated[list[NonEmptyText], Field(min_length=1, max_length=1)] = Field(
        description="a non-empty string (or a list of one)")

    def prompt_text(self, tokenizer) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


BODIES: dict[str, type[ChatBody] | type[CompletionBody]] = {CHAT_URL: ChatBody, COMPLETIONS_URL: CompletionBody}
MODELS = (InputLine, ChatMessage, ChatBody, CompletionBody)
