"""The field types and limits every endpoint kind shares, each rule in one place.

Each field's description is the rule a message states when the field is wrong ("temperature must be ...").
Strings are strict (a number is not a string) and must be valid Unicode: a lone surrogate from a JSON
escape could neither be tokenized nor stored.
"""
from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import AfterValidator, Field, StrictInt, StrictStr
from pydantic_core import PydanticCustomError

Role = Literal["system", "user", "assistant", "developer"]
ROLES = get_args(Role)
MAX_STOP = 4  # stop sequences a request may name
MAX_TOP_LOGPROBS = 20
# chat's and completions' `logprobs` differ; a problem's message takes a field's rule by its name (line_problems)
LOGPROBS_RULE = f"true or false (chat), an integer in [0, {MAX_TOP_LOGPROBS}] (completions)"
MAX_LOGIT_BIAS = 300  # entries, as OpenAI
MAX_N = 16  # samples a line may ask for: the prompt is computed once, each sample decodes on its own
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512  # a batch's metadata, and a Response's


def valid_unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise PydanticCustomError("invalid_field", "must be valid Unicode (it holds a lone surrogate)") from None
    return text


Text = Annotated[StrictStr, AfterValidator(valid_unicode)]
NonEmptyText = Annotated[Text, Field(min_length=1)]
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
MaxTokens = Annotated[StrictInt, Field(ge=1)]  # every kind's completion token limit (max_tokens, max_output_tokens)


def template_message(role: str, content: str | list) -> dict[str, str]:
    """A message as the chat template takes it: developer speaks as system, text parts joined."""
    text = content if isinstance(content, str) else "".join(part.text for part in content)
    return {"role": "system" if role == "developer" else role, "content": text}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    """OpenAI's usage object of a chat or completions body: the prompt counted once, every sample's tokens."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def token_text(raw: bytes) -> str:
    """A token's text in a logprobs shape: a token that splits a character shows U+FFFD; `bytes` keeps it exact."""
    return raw.decode("utf-8", errors="replace")
