"""LoRA adapters kept in S3 (a BATCHINFER_ADAPTERS folder `s3://bucket/prefix`): the peft folder's two files are
downloaded once into the worker's cache (model_cache/adapters), where the engine reads them as any local folder."""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from batchinfer.engine.lora.request import LoRARequest
from batchinfer.errors import one_line
from batchinfer.jobs.faults import is_transient
from batchinfer.storage import open_storage

PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")
CHUNK = 1 << 20


class AdapterFetchError(ValueError):
    """One line: why an adapter in S3 could not be had (its lines fail with it; the unit's others run)."""


def is_remote(path: str) -> bool:
    return path.startswith("s3://")


def local_adapters(adapters: Mapping[str, LoRARequest], named: Iterable[str], cache: Path,
                   max_bytes: int) -> tuple[dict[str, LoRARequest], dict[str, str]]:
    """The adapters with those `named` that live in S3 pointed at their local copy (fetched now where the cache
    has none), and the one-line reason of each named one that could not be fetched."""
    found, refused = dict(adapters), {}
    for name in dict.fromkeys(named):
        request = adapters.get(name)
        if request is None or not is_remote(request.lora_path):
            continue
        try:
            found[name] = replace(request, lora_path=str(fetch_adapter(name, request.lora_path, cache, max_bytes)))
        except AdapterFetchError as exc:
            refused[name] = str(exc)
    return found, refused


def fetch_adapter(name: str, url: str, cache: Path, max_bytes: int) -> Path:
    """The local folder of the adapter at url: the cache's copy, else downloaded whole into a temporary folder
    and renamed into place (a reader never sees half of one; two workers fetching at once keep one copy)."""
    target = cache / "adapters" / hashlib.blake2b(url.encode(), digest_size=8).hexdigest()
    if all((target / f).is_file() for f in PEFT_FILES):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=target.parent))
    try:
        storage = _storage(name, url)
        for filename in PEFT_FILES:
            _download(name, storage, filename, staging / filename, max_bytes)
        try:
            os.rename(staging, target)
        except OSError:  # another process put its copy there first
            if not all((target / f).is_file() for f in PEFT_FILES):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _storage(name: str, url: str):
    try:
        return open_storage(url.rstrip("/"))
    except ValueError as exc:
        raise AdapterFetchError(f"adapter {name!r}: {exc}") from None


def _download(name: str, storage, filename: str, path: Path, max_bytes: int) -> None:
    where = storage.url(filename)
    try:
        size = storage.size(filename)
        if size > max_bytes:
            raise AdapterFetchError(f"adapter {name!r}: {where} is {size} bytes, over BATCHINFER_MAX_ADAPTER_BYTES "
                                    f"({max_bytes})")
        with storage.open_read(filename) as source, path.open("wb") as out:
            _copy_at_most(source, out, max_bytes, lambda: f"adapter {name!r}: {where} grew past {max_bytes} bytes")
    except FileNotFoundError:
        raise AdapterFetchError(f"adapter {name!r}: no {filename} at {where}") from None
    except AdapterFetchError:
        raise
    except Exception as exc:  # S3 unreachable: the unit waits it out (jobs.units.waits); refused access: one line
        if is_transient(exc):
            raise
        raise AdapterFetchError(f"adapter {name!r}: cannot download {where}: {one_line(exc)}") from None


def _copy_at_most(source: BinaryIO, out: BinaryIO, max_bytes: int, too_big) -> None:
    copied = 0
    while chunk := source.read(CHUNK):
        copied += len(chunk)
        if copied > max_bytes:  # the size was checked; an object replaced meanwhile is bounded all the same
            raise AdapterFetchError(too_big())
        out.write(chunk)
