"""`/v1/embeddings`: a line's body, and its result body (OpenAI's list of embedding objects).

The engine embeds one prompt a request: a line with several inputs carries them all (`echo["inputs"]`) and
the unit runner splits and joins them (units.engine_requests)."""
from __future__ import annotations

import base64
import math
import struct
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from batchinfer.engine.types import SamplingParams
from batchinfer.jobs.endpoints.fields import NonEmptyText

EMBEDDINGS_URL = "/v1/embeddings"
MAX_INPUTS = 2048  # OpenAI's limit of inputs a request
TokenIds = Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]


class EmbeddingsBody(BaseModel):
    PROMPT_FIELD: ClassVar[str] = "input"
    model_config = ConfigDict(extra="ignore")

    input: (NonEmptyText | Annotated[list[NonEmptyText], Field(min_length=1, max_length=MAX_INPUTS)] | TokenIds
            | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_INPUTS)]) = Field(
        description=f"a non-empty string, a list of up to {MAX_INPUTS} of them, a list of token ids, "
                    "or a list of such lists")
    encoding_format: Literal["float", "base64"] = Field("float", description="float or base64")
    dimensions: Annotated[StrictInt, Field(ge=1)] | None = Field(None, description="an integer >= 1")

    def token_inputs(self, tokenizer) -> list[list[int]]:
        """Each input as token ids: text is tokenized as it is (no chat template, no special tokens added)."""
        inputs = self.input if isinstance(self.input, list) else [self.input]
        if all(isinstance(i, int) for i in inputs):
            return [list(inputs)]  # type: ignore[arg-type]
        return [list(i) if isinstance(i, list) else list(tokenizer.encode(i, add_special_tokens=False))
                for i in inputs]  # type: ignore[union-attr]

    def params(self, default_max_tokens: int, defaults: dict | None = None) -> SamplingParams:
        return SamplingParams(max_tokens=1, embed=True)

    def echo(self, inputs: list[list[int]]) -> dict[str, Any]:
        return {"encoding_format": self.encoding_format, "dimensions": self.dimensions,
                **({"inputs": inputs} if len(inputs) > 1 else {})}


def result_body(model: str, results: list, echo: dict[str, Any] | None = None) -> dict:
    """One embedding object per input's result, in input order; usage counts every input's tokens."""
    echo = echo or {}
    vectors = [r.embedding for r in results]
    prompt_tokens = sum(r.prompt_tokens for r in results)
    data = [{"object": "embedding", "index": k,
             "embedding": encoded(shortened(v, echo.get("dimensions")), echo.get("encoding_format", "float"))}
            for k, v in enumerate(vectors)]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}


def shortened(vector: list[float], dimensions: int | None) -> list[float]:
    """The first `dimensions` values, normalized again (Matryoshka truncation, as OpenAI's `dimensions`)."""
    if dimensions is None or dimensions >= len(vector):
        return vector
    head = vector[:dimensions]
    norm = math.sqrt(sum(x * x for x in head)) or 1.0
    return [x / norm for x in head]


def encoded(vector: list[float], encoding_format: str) -> list[float] | str:
    """base64: the little-endian float32 bytes, as OpenAI sends them."""
    if encoding_format != "base64":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
