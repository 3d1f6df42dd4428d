"""The sampling fields chat and completions lines share, and the engine's SamplingParams they make."""
from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field, StrictBool, StrictInt, model_validator
from pydantic_core import PydanticCustomError

from batchinfer.engine.types import MAX_SEED, MIN_SEED, SamplingParams
from batchinfer.jobs.endpoints.fields import MAX_LOGIT_BIAS, MAX_N, MAX_STOP, MaxTokens, NonEmptyText, Number

UNSUPPORTED = "absent (this server runs no tools, functions, audio or images)"


def _response_format(value: dict) -> dict:
    kind = value.get("type")
    if kind not in ("text", "json_object", "json_schema"):
        raise PydanticCustomError("invalid_field", 'needs "type": one of text, json_object, json_schema')
    spec = value.get("json_schema")
    if kind == "json_schema" and not (isinstance(spec, dict) and isinstance(spec.get("schema"), dict)):
        raise PydanticCustomError("invalid_field", 'of type json_schema needs "json_schema": {"name", "schema": {...}}')
    return value


class Sampling(BaseModel):
    """The sampling fields both bodies share; None (or absent) means the default."""

    max_tokens: MaxTokens | None = Field(None, description="an integer >= 1")
    max_completion_tokens: MaxTokens | None = Field(None, description="an integer >= 1")
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = Field(None, description="a number in [0, 2]")
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = Field(None, description="a number in (0, 1]")
    top_k: Annotated[StrictInt, Field(ge=-1)] | None = Field(None, description="an integer >= 0 (or -1: no cut)")
    seed: Annotated[StrictInt, Field(ge=MIN_SEED, le=MAX_SEED)] | None = Field(
        None, description="an integer in [-2**63, 2**64-1]")
    stop: NonEmptyText | Annotated[list[NonEmptyText], Field(max_length=MAX_STOP)] | None = Field(
        None, description=f"a non-empty string or a list of up to {MAX_STOP} of them")
    n: Annotated[StrictInt, Field(ge=1, le=MAX_N)] = Field(1, description=f"an integer in [1, {MAX_N}]")
    presence_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = Field(None, description="a number in [-2, 2]")
    frequency_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = Field(None, description="a number in [-2, 2]")
    repetition_penalty: Annotated[Number, Field(gt=0, le=10)] | None = Field(None, description="a number in (0, 10]")
    logit_bias: Annotated[dict[Annotated[str, Field(pattern=r"^\d{1,9}$")], Annotated[Number, Field(ge=-100, le=100)]],
                          Field(max_length=MAX_LOGIT_BIAS)] | None = Field(
        None, description=f"an object of at most {MAX_LOGIT_BIAS} token ids (as strings) to numbers in [-100, 100]")
    min_tokens: Annotated[StrictInt, Field(ge=0)] | None = Field(None, description="an integer >= 0")
    stop_token_ids: Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(max_length=MAX_LOGIT_BIAS)] | None = Field(
        None, description=f"a list of at most {MAX_LOGIT_BIAS} token ids")
    ignore_eos: StrictBool | None = Field(None, description="true or false")
    response_format: Annotated[dict, AfterValidator(_response_format)] | None = Field(
        None, description='an object {"type": "text" | "json_object" | "json_schema", "json_schema": {...}}')
    guided_regex: NonEmptyText | None = Field(None, description="a non-empty regular expression")
    guided_choice: Annotated[list[NonEmptyText], Field(min_length=1, max_length=MAX_LOGIT_BIAS)] | None = Field(
        None, description=f"a list of 1 to {MAX_LOGIT_BIAS} non-empty strings")
    tools: None = Field(None, description=UNSUPPORTED)
    tool_choice: None = Field(None, description=UNSUPPORTED)
    parallel_tool_calls: None = Field(None, description=UNSUPPORTED)
    functions: None = Field(None, description=UNSUPPORTED)
    function_call: None = Field(None, description=UNSUPPORTED)
    audio: None = Field(None, description=UNSUPPORTED)
    modalities: None = Field(None, description=UNSUPPORTED)

    @model_validator(mode="before")
    @classmethod
    def _one_token_limit(cls, data: Any) -> Any:
        """max_completion_tokens (the newer name) wins: max_tokens beside it is not read at all."""
        if isinstance(data, dict) and "max_completion_tokens" in data:
            return {k: v for k, v in data.items() if k != "max_tokens"}
        return data

    def params(self, default_max_tokens: int, defaults: dict | None = None) -> SamplingParams:
        """defaults: the checkpoint's generation_config.json sampling (temperature, top_p, top_k,
        repetition_penalty) for what the line leaves unset, as vLLM does; else OpenAI's defaults."""
        limit = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        stop = [self.stop] if isinstance(self.stop, str) else self.stop or []
        d = defaults or {}
        top_k = d.get("top_k", 0) if self.top_k is None else self.top_k
        return SamplingParams(max_tokens=limit if limit is not None else default_max_tokens,
                              temperature=float(d.get("temperature", 1.0) if self.temperature is None else self.temperature),
                              top_p=float(d.get("top_p", 1.0) if self.top_p is None else self.top_p),
                              top_k=0 if top_k == -1 else top_k, seed=self.seed, stop=tuple(stop),
                              logprobs=self.top_logprob_count(),
                              presence_penalty=float(self.presence_penalty or 0.0),
                              frequency_penalty=float(self.frequency_penalty or 0.0),
                              repetition_penalty=float(d.get("repetition_penalty", 1.0) if self.repetition_penalty is None
                                                       else self.repetition_penalty),
                              logit_bias={int(k): float(v) for k, v in (self.logit_bias or {}).items()},
                              min_tokens=self.min_tokens or 0, stop_token_ids=tuple(self.stop_token_ids or ()),
                              ignore_eos=bool(self.ignore_eos), guided=self.constraint(), n=self.n)

    def constraint(self) -> tuple[str, str] | None:
        """The grammar the output is held to (engine/sampling/grammar.py's (kind, spec)), or None."""
        fmt = self.response_format or {}
        if fmt.get("type") == "json_schema":
            return "json_schema", json.dumps(fmt["json_schema"]["schema"], sort_keys=True)  # one cache entry per schema
        if fmt.get("type") == "json_object":
            return "json_object", ""
        if self.guided_regex is not None:
            return "regex", self.guided_regex
        if self.guided_choice is not None:
            return "choice", json.dumps(self.guided_choice)
        return None

    def constraints_given(self) -> list[str]:
        fmt = self.response_format or {}
        given = ["response_format"] if fmt.get("type") in ("json_object", "json_schema") else []
        return given + [f for f in ("guided_regex", "guided_choice") if getattr(self, f) is not None]

    def top_logprob_count(self) -> int | None:
        """None: no logprobs; k: the sampled token's logprob and the k most likely (each body reads its own fields)."""
        raise NotImplementedError
