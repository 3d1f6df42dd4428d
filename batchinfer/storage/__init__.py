"""File storage for job inputs, outputs and unit results: a local directory or S3."""
from __future__ import annotations

from urllib.parse import urlparse

from batchinfer.storage.base import Storage
from batchinfer.storage.local import LocalStorage
from batchinfer.storage.s3 import S3Storage

__all__ = ["LocalStorage", "S3Storage", "Storage", "open_storage"]


def open_storage(url: str) -> Storage:
    """file:///some/dir or s3://bucket/prefix."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return LocalStorage(parsed.netloc + parsed.path)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"storage URL names no bucket: {url!r}")
        return S3Storage(parsed.netloc, parsed.path)
    raise ValueError(f"unsupported storage URL {url!r} (use file:// or s3://)")
