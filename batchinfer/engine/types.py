"""The engine's public interface: requests in, results out (no torch, no services)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .lora.request import LoRARequest
from .options import DEFAULT_MAX_TOKENS

# torch.Generator.manual_seed takes any value that fits in 64 bits, signed or unsigned: the one seed range.
MIN_SEED, MAX_SEED = -(1 << 63), (1 << 64) - 1


@dataclass
class SamplingParams:
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k cut
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    embed: bool = False  # prefill only: the result is the prompt's pooled hidden state, no token is sampled
    logprobs: int | None = None  # None: none; k >= 0: the sampled token's logprob and the k most likely
    presence_penalty: float = 0.0  # OpenAI: minus this for every token already in the output
    frequency_penalty: float = 0.0  # OpenAI: minus this times the token's count in the output
    repetition_penalty: float = 1.0  # vLLM: a token in prompt or output has its logit divided (> 0) or multiplied
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    min_tokens: int = 0  # EOS and stop_token_ids masked until this many tokens are out
    stop_token_ids: tuple[int, ...] = ()
    guided: tuple[str, str] | None = None  # (kind, spec) a grammar holds the output to: see engine/sampling/grammar.py
    n: int = 1  # samples of one prompt: prefilled once, then forked (engine/scheduler/parallel_sampling.py)

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        self.stop = tuple(self.stop)
        self.stop_token_ids = tuple(self.stop_token_ids)
        if self.guided is not None:
            self.guided = (str(self.guided[0]), str(self.guided[1]))  # JSON gives a list back
        self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}  # JSON keys arrive as strings

    @property
    def penalized(self) -> bool:
        """True when the logits need this row's penalties, biases or masks before sampling."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.min_tokens)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


@dataclass(frozen=True)
class EngineDescription:
    """What a generator runs: its dtype and weight format, each with why. Recorded with every output as fields
    (metrics()); the notes are for people (start-up prints them)."""

    dtype: str
    dtype_reason: str = "asked"
    weight_format: str | None = None  # None: a generator without weight formats (the transformers reference)
    weight_format_reason: str = "asked"

    @property
    def dtype_note(self) -> str:
        """`float32 (auto: no avx512_bf16 or amx_bf16)`."""
        return f"{self.dtype} ({self.dtype_reason})"

    @property
    def weights_note(self) -> str | None:
        """`gguf (auto: the GGUF's own blocks, ...)`."""
        return None if self.weight_format is None else f"{self.weight_format} ({self.weight_format_reason})"

    def metrics(self) -> dict[str, str]:
        """The fields each output line records (outputs compare only within one dtype and weight format)."""
        found = {"dtype": self.dtype}
        if self.weight_format is not None:
            found["weight_format"] = self.weight_format
        return found


@dataclass
class GenerationRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    arrival_time: float | None = None  # wall clock (time.time()); set by add_request when None
    cache_salt: str | None = None  # prefix-cache blocks are shared only between requests with the same salt
    lora_request: LoRARequest | None = None  # the adapter it runs with; None: the base model


@dataclass(frozen=True)
class TokenLogprob:
    """One output token's logprob and the most likely alternatives at its position (ids, logprobs); the bytes
    of each (what the OpenAI shapes report) are filled when the result is built."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    token_bytes: bytes = b""
    top_bytes: tuple[bytes, ...] = ()


@dataclass
class GenerationResult:
    request_id: str
    output_token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length" | "error" | "abort" (LLMEngine.abort)
    prompt_tokens: int
    cached_tokens: int
    arrival_time: float
    first_scheduled_time: float
    first_token_time: float
    last_token_time: float
    error: str | None = None  # set (finish_reason "error") when the engine could not run this request
    embedding: list[float] | None = None  # an embed request's pooled, L2-normalized hidden state
    logprobs: list[TokenLogprob] | None = None  # one per output token when the request asked for logprobs
    stop_reason: str | int | None = None  # vLLM's: the stop string or stop token id that ended it, else None
    samples: list[GenerationResult] | None = None  # n > 1: every sample, index 0..n-1 (the fields above are sample 0's)
    # text is "" until decoded from output_token_ids by whoever holds the tokenizer (EngineConfig.detokenize off:
    # the engine process's results, decoded in its parent before anything reads them)
    text_pending: bool = False

    @classmethod
    def failed(cls, req: "GenerationRequest", message: str) -> "GenerationResult":
        """The result of a request the engine refused: no tokens, the reason in error."""
        t = req.arrival_time if req.arrival_time is not None else now()
        return cls(req.request_id, [], "", "error", len(req.prompt_token_ids), 0, t, t, t, t, error=message)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def aborted(self) -> bool:
        return self.finish_reason == "abort"

    @property
    def completion_tokens(self) -> int:
        """Output tokens of every sample (what usage counts)."""
        if self.samples:
            return sum(len(s.output_token_ids) for s in self.samples)
        return len(self.output_token_ids)

    @property
    def decode_tokens(self) -> int:
        """Output tokens one after the other: samples decode side by side, so the longest one's."""
        if self.samples:
            return max(len(s.output_token_ids) for s in self.samples)
        return len(self.output_token_ids)

    @property
    def queue_s(self) -> float:
        return self.first_scheduled_time - self.arrival_time

    @property
    def ttft_s(self) -> float:
        return self.first_token_time - self.arrival_time

    @property
    def tpot_s(self) -> float:
        return time_per_output_token(self.first_token_time, self.last_token_time, self.decode_tokens)

    @property
    def e2e_s(self) -> float:
        return self.last_token_time - self.arrival_time


DEFAULT_CONTEXT = 8192  # a model config that names no max_position_embeddings


def context_length(model_config, max_model_len: int | None = None) -> int:
    """The longest sequence (prompt + completion) served: the model's max_position_embeddings (from its config
    object or its config.json dict), capped at max_model_len when set. Validation, the engine and the
    transformers path all take it from here."""
    if isinstance(model_config, dict):
        limit = model_config.get("max_position_embeddings")
    else:
        limit = getattr(model_config, "max_position_embeddings", None)
    limit = int(limit or DEFAULT_CONTEXT)
    return min(max_model_len or limit, limit)


def refusal(req: GenerationRequest, max_model_len: int) -> str | None:
    """Why no generator can ever run `req` within a context of max_model_len tokens, or None."""
    seed = req.sampling.seed
    if seed is not None and not MIN_SEED <= seed <= MAX_SEED:
        return f"request {req.request_id}: seed {str(seed)[:40]} is outside the range torch takes [{MIN_SEED}, {MAX_SEED}]"
    if not req.prompt_token_ids:
        return f"request {req.request_id}: empty prompt"
    if len(req.prompt_token_ids) >= max_model_len:
        return f"request {req.request_id}: prompt of {len(req.prompt_token_ids)} tokens does not fit max_model_len {max_model_len}"
    return None


def time_per_output_token(first_token_time: float, last_token_time: float, output_tokens: int) -> float:
    """TPOT as the seed defines it: (last - first token time) / (n - 1); 0 for a single token."""
    return (last_token_time - first_token_time) / (output_tokens - 1) if output_tokens > 1 else 0.0


def now() -> float:
    return time.time()
