"""The job system's tables: jobs, their requests, and the work units that run them."""
from __future__ import annotations

from enum import StrEnum, nonmember

from sqlalchemy import JSON, BigInteger, CheckConstraint, Float, ForeignKey, Index, Integer, String, Text, false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class JobStatus(StrEnum):
    VALIDATING = "validating"
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    PAUSED = "paused"  # its owner paused it: no new unit starts, running ones finish, the window keeps running
    TERMINAL = nonmember((COMPLETED, FAILED, EXPIRED, CANCELLED))
    RUNNABLE = nonmember((QUEUED, IN_PROGRESS))


class RequestStatus(StrEnum):
    PENDING = "pending"  # valid, waiting for a unit
    PLANNED = "planned"  # in a unit that has not started
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    OPEN = nonmember((PENDING, PLANNED, RUNNING))
    UNSTARTED = nonmember((PENDING, PLANNED))


class UnitStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_owner_created", "owner_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    model: Mapped[str] = mapped_column(String(128))
    input_filename: Mapped[str] = mapped_column(String(512), default="")
    metadata_: Mapped[dict] = mapped_column("metadata", JSON, default=dict)
    skip_invalid: Mapped[bool] = mapped_column(default=False)
    strict: Mapped[bool] = mapped_column(default=False, server_default=false())  # a refused body fails the batch too
    priority: Mapped[int] = mapped_column(Integer, default=0)
    completion_window_s: Mapped[float] = mapped_column(Float)
    total: Mapped[int] = mapped_column(Integer, default=0)
    completed: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    invalid: Mapped[int] = mapped_column(Integer, default=0)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    reasoning_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")  # of thinking outputs
    errors: Mapped[list] = mapped_column(JSON, default=list)  # [{line, code, param, message}]
    error_count: Mapped[int] = mapped_column(Integer, default=0)
    input_key: Mapped[str | None] = mapped_column(String(512))
    output_key: Mapped[str | None] = mapped_column(String(512))
    error_key: Mapped[str | None] = mapped_column(String(512))
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
    queued_at: Mapped[float | None] = mapped_column(Float)
    in_progress_at: Mapped[float | None] = mapped_column(Float)
    finalizing_at: Mapped[float | None] = mapped_column(Float)
    completed_at: Mapped[float | None] = mapped_column(Float)
    failed_at: Mapped[float | None] = mapped_column(Float)
    expired_at: Mapped[float | None] = mapped_column(Float)
    cancelling_at: Mapped[float | None] = mapped_column(Float)
    cancelled_at: Mapped[float | None] = mapped_column(Float)
    paused_at: Mapped[float | None] = mapped_column(Float)  # its latest pause
    finalize_attempts: Mapped[int] = mapped_column(Integer, default=0)
    finalize_after: Mapped[float | None] = mapped_column(Float)  # a FINALIZING job may be retried from then on
    owner_id: Mapped[str | None] = mapped_column(String(64))  # the API key that made it; None from the local CLI
    input_file_id: Mapped[str | None] = mapped_column(String(64))
    endpoint: Mapped[str | None] = mapped_column(String(64))
    output_expires_after_s: Mapped[float | None] = mapped_column(Float)  # result files readable this long after the end
    validation_token: Mapped[str | None] = mapped_column(String(32))  # the validation run that owns a `validating` job
    validation_heartbeat_at: Mapped[float | None] = mapped_column(Float)  # its last committed batch of requests
    # who may share its prefix cache, groups and units (jobs.tenancy.scopes): its key's org or key, or "local"
    cache_scope: Mapped[str] = mapped_column(String(128), default="local", server_default="local")
    # its output or error file deleted by its owner (the batch keeps the file's id; reading it says it is gone)
    output_deleted_at: Mapped[float | None] = mapped_column(Float)
    error_deleted_at: Mapped[float | None] = mapped_column(Float)

    def kept_key(self, errors: bool = False) -> str | None:
        """The output (or error) file's storage key while the file is there: None when none was made, or once its
        owner deleted it."""
        key, deleted = (self.error_key, self.error_deleted_at) if errors else (self.output_key, self.output_deleted_at)
        return key if deleted is None else None


OPEN_NEEDS_UNIT = "status NOT IN ('planned', 'running') OR unit_id IS NOT NULL"


class Request(Base):
    """One valid input line of a job; `index` is its position among the job's valid lines."""

    __tablename__ = "requests"
    # (job_id, status, index): a move of one request is a one-row lookup on either index (migration 0009)
    # a planned or running request names its unit: the state a lost claim once left (migration 0013) is refused
    __table_args__ = (Index("ix_requests_unit", "unit_id", "unit_pos"),
                      Index("ix_requests_job_status_index", "job_id", "status", "index"),
                      CheckConstraint(OPEN_NEEDS_UNIT, name="ck_requests_open_has_unit"))

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    line: Mapped[int] = mapped_column(Integer)  # 1-based line number in the input file
    custom_id: Mapped[str] = mapped_column(String(512))
    status: Mapped[str] = mapped_column(String(16))
    unit_id: Mapped[str | None] = mapped_column(ForeignKey("work_units.id"))
    unit_pos: Mapped[int | None] = mapped_column(Integer)
    # set when its unit commits (0 for a failed request), summed in SQL for `status`
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class WorkUnit(Base):
    """A batch of requests, possibly from several jobs, that one worker runs in one engine call."""

    __tablename__ = "work_units"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    queue: Mapped[str] = mapped_column(String(256))
    prefix_key: Mapped[str] = mapped_column(String(128))
    shared_prefix_len: Mapped[int] = mapped_column(Integer, default=0)
    model: Mapped[str | None] = mapped_column(String(128))  # its jobs' model; None: planned before fleets had several
    adapter: Mapped[str | None] = mapped_column(String(128))  # its prefix group's LoRA adapter; None: the base's
    num_requests: Mapped[int] = mapped_column(Integer)
    input_key: Mapped[str] = mapped_column(String(512))
    result_key: Mapped[str | None] = mapped_column(String(512))  # set by the run that won the commit fence
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(256))
    incarnation: Mapped[str | None] = mapped_column(String(64))  # the worker process that runs it now
    dispatched_at: Mapped[float | None] = mapped_column(Float)  # last time a message for it was sent
    last_error: Mapped[str | None] = mapped_column(String(1024))  # why its last run did not commit
    waiting_for: Mapped[str | None] = mapped_column(String(16))  # released while this service was down (jobs.outage)
    outage_releases: Mapped[int] = mapped_column(Integer, default=0)  # runs released for an outage: not failures
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)


class UnitChunk(Base):
    """Finished requests a running unit committed before its end (every chunk_s), behind the unit's fence: their
    results file joins the unit's own at finalize, and a rerun of the unit runs none of them."""

    __tablename__ = "unit_chunks"

    unit_id: Mapped[str] = mapped_column(ForeignKey("work_units.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    result_key: Mapped[str] = mapped_column(String(512))
    requests: Mapped[int] = mapped_column(Integer)  # how many it counted
    committed_at: Mapped[float] = mapped_column(Float)


class UnitProgress(Base):
    """Live counts of a running unit's finished requests, per job: the unit's run rewrites its rows at most
    once a second. Only the current attempt of a running unit counts (jobs.units.live); its commit is the truth."""

    __tablename__ = "unit_progress"
    __table_args__ = (Index("ix_unit_progress_job", "job_id"),)

    unit_id: Mapped[str] = mapped_column(ForeignKey("work_units.id", ondelete="CASCADE"), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer)
    completed: Mapped[int] = mapped_column(Integer)
    failed: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    completion_tokens: Mapped[int] = mapped_column(BigInteger)
    cached_tokens: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[float] = mapped_column(Float)


class EngineRate(Base):
    """Step time measured per model and machine, by phase; sums decay so recent units weigh most."""

    __tablename__ = "engine_rates"

    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    machine: Mapped[str] = mapped_column(String(256), primary_key=True)
    prefill_tokens: Mapped[float] = mapped_column(Float)
    prefill_s: Mapped[float] = mapped_column(Float)
    decode_tokens: Mapped[float] = mapped_column(Float)
    decode_s: Mapped[float] = mapped_column(Float)
    decode_steps: Mapped[float] = mapped_column(Float)
    decode_tokens_sq: Mapped[float] = mapped_column(Float)  # sums for fitting a decode step's cost a + c*batch
    decode_token_s: Mapped[float] = mapped_column(Float)
    # per class of decode batch size ("1", "2", "4", "8", ...): [steps, sum of b, sum of t], decayed as the rest
    decode_sizes: Mapped[dict] = mapped_column(JSON, default=dict)
    # the same sums priced by attention pairs too (engine_rates.fold_attention); None on rows recorded before
    attention_sums: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    units: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[float] = mapped_column(Float)


class ServiceOutage(Base):
    """One row per service (storage, database, broker): whether it is down now, as the processes that need it
    saw it, and how often it went down and units were released for it (jobs.outage; /metrics reads it)."""

    __tablename__ = "service_outages"

    service: Mapped[str] = mapped_column(String(16), primary_key=True)
    down_since: Mapped[float | None] = mapped_column(Float)  # None: it answers
    seen_at: Mapped[float] = mapped_column(Float)  # the last failure (down) or answer (up) someone reported
    detail: Mapped[str | None] = mapped_column(String(512))  # the last error, one line
    outages: Mapped[int] = mapped_column(Integer, default=0)  # times it went down
    released_units: Mapped[int] = mapped_column(Integer, default=0)  # unit runs released while it was down
    down_s: Mapped[float] = mapped_column(Float, default=0.0)  # seconds down, over the ended outages


class WebhookStatus(StrEnum):
    PENDING = "pending"  # due at next_attempt_at (a claimed row's next_attempt_at is its lease end)
    DELIVERED = "delivered"
    FAILED = "failed"  # gave up: the receiver never answered 2xx within webhook_max_age_s


class WebhookEvent(Base):
    """The webhook outbox: one event per batch that ended, written in the transaction that ended it."""

    __tablename__ = "webhook_events"
    __table_args__ = (Index("ix_webhook_events_due", "status", "next_attempt_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # the webhook-id header
    job_id: Mapped[str] = mapped_column(String(64), unique=True)  # a batch ends once: one event each
    owner_id: Mapped[str | None] = mapped_column(String(64))  # whose secret signs it; None: the server's
    type: Mapped[str] = mapped_column(String(32))
    url: Mapped[str] = mapped_column(String(2048))
    body: Mapped[str] = mapped_column(Text)  # the exact bytes that are signed and sent
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)
    next_attempt_at: Mapped[float] = mapped_column(Float)
    delivered_at: Mapped[float | None] = mapped_column(Float)
    last_error: Mapped[str | None] = mapped_column(String(512))


class ApiKey(Base):
    """A tenant's key: only the SHA-256 of the secret is stored."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(256))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float)
    webhook_url: Mapped[str | None] = mapped_column(String(2048))  # receives this key's batch events
    webhook_secret: Mapped[str | None] = mapped_column(String(128))  # signs them (whsec_...), shown once
    is_admin: Mapped[bool] = mapped_column(default=False)  # sees the workers on the dashboard
    org: Mapped[str | None] = mapped_column(String(64))  # keys of one org share a cache scope; None: its own


class IdempotencyKey(Base):
    """What a create with an Idempotency-Key made (a batch or a file), and a digest of the request that made it: the
    same key with the same request answers with that object, with another request 409. Committed with the object."""

    __tablename__ = "idempotency_keys"

    owner_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    scope: Mapped[str] = mapped_column(String(16), primary_key=True)  # batches, files or retries (of a batch: its id)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    object_id: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)


class File(Base):
    """An uploaded file (purpose `batch`); its bytes live in storage under storage_key."""

    __tablename__ = "files"
    __table_args__ = (Index("ix_files_owner_created", "owner_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner_id: Mapped[str] = mapped_column(String(64))
    filename: Mapped[str] = mapped_column(String(512))
    purpose: Mapped[str] = mapped_column(String(32))
    bytes: Mapped[int] = mapped_column(BigInteger)
    storage_key: Mapped[str] = mapped_column(String(512))
    created_at: Mapped[float] = mapped_column(Float)
    deleted_at: Mapped[float | None] = mapped_column(Float)
