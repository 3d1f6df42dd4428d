"""What a transient fault is, and of which service: the one definition every retry, release and resume decision uses.

An infrastructure fault (storage, the database or the broker unreachable, timing out, answering 5xx or
throttling) is never a request's failure: the work waits it out (jobs.outage). Anything else is not that.
"""
from __future__ import annotations

from batchinfer.db.session import is_transient_db

STORAGE, DATABASE, BROKER = "storage", "database", "broker"
SERVICES = (STORAGE, DATABASE, BROKER)
THROTTLING = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeTooSkewed",
                        "ServiceUnavailable", "InternalError", "TooManyRequests", "RequestLimitExceeded"})


def is_transient(exc: BaseException) -> bool:
    """The database, storage or broker unreachable for now (a dropped connection, a timeout, a restart, a 5xx,
    throttling): the same step may succeed later. A missing file, a refused permission, or any other error is not that."""
    return service_of(exc) is not None


def service_of(exc: BaseException) -> str | None:
    """Which service a transient fault is of (storage, database, broker), or None when it is not one."""
    if isinstance(exc, FileNotFoundError):
        return None
    if is_transient_db(exc):
        return DATABASE
    if _broker_fault(exc):
        return BROKER
    if _storage_fault(exc) or isinstance(exc, (ConnectionError, TimeoutError)):
        return STORAGE
    return None


def _storage_fault(exc: BaseException) -> bool:
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError  # lazy: botocore, S3's only
    from urllib3.exceptions import HTTPError

    if isinstance(exc, ClientError):
        error, meta = exc.response.get("Error", {}), exc.response.get("ResponseMetadata", {})
        return int(meta.get("HTTPStatusCode") or 0) >= 500 or error.get("Code") in THROTTLING
    return isinstance(exc, (BotoCoreError, S3UploadFailedError, HTTPError))


def _broker_fault(exc: BaseException) -> bool:
    from kombu.exceptions import OperationalError as KombuOperationalError  # lazy: kombu and redis, the broker's only
    from redis.exceptions import ConnectionError as RedisConnectionError, TimeoutError as RedisTimeoutError

    return isinstance(exc, (RedisConnectionError, RedisTimeoutError, KombuOperationalError))
