"""A request as the engine tracks it: its tokens, its block table, how far it has been computed."""
from __future__ import annotations

from enum import Enum

from ..lora.request import LoRARequest
from ..types import SamplingParams, TokenLogprob


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams,
                 arrival_time: float = 0.0, cache_salt: str | None = None, lora_request: LoRARequest | None = None):
        if not prompt_token_ids:
            raise ValueError(f"request {request_id}: empty prompt")
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.sampling = sampling
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.cache_salt = cache_salt  # mixed into the first block's hash: no prefix is shared across salts
        self.lora_request = lora_request  # its adapter (None: the base): mixed in too, an adapter changes K and V
        self.block_hashes: list[bytes] = []  # content hash chain of the full blocks, filled lazily
        self.num_computed_tokens = 0  # tokens whose K/V is in the cache
        self.num_cached_tokens: int | None = None  # prompt tokens served by the prefix cache at first admission
        self.num_new_tokens = 0  # tokens the scheduler gave this sequence in the current step
        self.num_preemptions = 0
        self.skipped_steps = 0  # steps spent waiting while others were admitted (anti-starvation)
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None  # the stop string or stop token id that ended it (vLLM's)
        self.logprobs: list[TokenLogprob] = []  # one per output token, kept when sampling.logprobs is set
        self.text = ""  # decoded so far, kept only when stop strings are searched
        self.prefix_offset = 0  # incremental detokenization: output tokens decoded as context
        self.read_offset = 0  # ... and where the text already in self.text ends
        self.arrival_time = arrival_time
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.embedding: list[float] | None = None  # an embed request's result

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, {self.status.value}, tokens={len(self)}, "
                f"computed={self.num_computed_tokens}, blocks={self.block_table})")

    @property
    def lora_int_id(self) -> int:
        return self.lora_request.lora_int_id if self.lora_request is not None else 0

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def samples_this_step(self) -> bool:
        """True when the scheduled chunk reaches the end of the known tokens, so a new token is sampled."""
        return self.num_computed_tokens + self.num_new_tokens == len(self.token_ids)
