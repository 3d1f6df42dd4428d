"""Storage in an S3 bucket through boto3 (AWS, MinIO, SeaweedFS).

Endpoint and credentials come from the standard AWS variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...).
Writes spool to a temporary file and go up as a multipart upload, so memory stays bounded.
"""
from __future__ import annotations

import io
import os
import tempfile
from contextlib import contextmanager

from batchinfer.storage.base import Storage

PART_BYTES = 8 * 1024 * 1024
# Transient faults (connection refused, throttling, 5xx) retried with backoff by botocore itself, about
# half a minute in all; what still fails reaches the caller (a unit is then rerun by the sweep).
MAX_ATTEMPTS = 8


def retries() -> dict:
    """botocore's retry config; the standard AWS_MAX_ATTEMPTS variable still overrides the count (botocore
    itself ignores it once a Config names retries)."""
    return {"max_attempts": int(os.environ.get("AWS_MAX_ATTEMPTS") or MAX_ATTEMPTS), "mode": "standard"}


class _BodyReader(io.RawIOBase):
    """Adapts a botocore StreamingBody to io so it can be wrapped in a BufferedReader (readline with a limit)."""

    def __init__(self, body):
        self._body = body

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        chunk = self._body.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)

    def close(self) -> None:
        self._body.close()
        super().close()


def _drop_expect_header(request, **_) -> None:
    # SeaweedFS stalls 60 s on an `Expect: 100-continue` PUT that follows an empty PUT on the same
    # connection; the header only saves a round trip on rejected uploads, so we go without it.
    request.headers.pop("Expect", None)


class S3Storage(Storage):
    def __init__(self, bucket: str, prefix: str = "", client=None):
        import boto3  # lazy: boto3 and botocore (a third of a second), S3's only
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client or boto3.client("s3", config=Config(retries=retries(), connect_timeout=5, read_timeout=60))
        self.client.meta.events.register("before-send.s3", _drop_expect_header)
        self._transfer = TransferConfig(multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    @contextmanager
    def open_read(self, key: str):
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
        except self.client.exceptions.NoSuchKey as exc:
            raise FileNotFoundError(self.url(key)) from exc
        with io.BufferedReader(_BodyReader(body), PART_BYTES) as stream:
            yield stream

    @contextmanager
    def open_write(self, key: str):
        with tempfile.SpooledTemporaryFile(max_size=PART_BYTES) as spool:
            yield spool
            if spool.tell() < PART_BYTES:  # one PUT: the transfer manager's threads cost more than a small file
                spool.seek(0)
                self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=spool.read())
                return
            spool.seek(0)
            self.client.upload_fileobj(spool, self.bucket, self._key(key), Config=self._transfer)

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError  # lazy: botocore, S3's only

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def size(self, key: str) -> int:
        from botocore.exceptions import ClientError  # lazy: botocore, S3's only

        try:
            return int(self.client.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                raise FileNotFoundError(key) from exc
            raise

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"
