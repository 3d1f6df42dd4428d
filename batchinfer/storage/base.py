"""The storage contract: named byte streams, read and written without holding a whole file in memory."""
from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from typing import BinaryIO, Protocol


class Readable(Protocol):
    """What upload reads from: a binary file, or a wrapper that counts or limits what passes."""

    def read(self, n: int = -1, /) -> bytes: ...


class Storage(ABC):
    """Keys are '/'-separated relative paths such as 'jobs/<id>/output.jsonl'.

    A writer's content becomes visible under its key only when its context exits without an error,
    so a reader never sees half a file.
    """

    @abstractmethod
    def open_read(self, key: str) -> AbstractContextManager[BinaryIO]:
        """A binary stream of the object; raises FileNotFoundError when there is none."""

    @abstractmethod
    def open_write(self, key: str) -> AbstractContextManager[BinaryIO]:
        """A binary stream that replaces the object atomically on a clean exit."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def delete(self, key: str) -> None: ...

    @abstractmethod
    def size(self, key: str) -> int:
        """The object's length in bytes; raises FileNotFoundError when there is none."""

    @abstractmethod
    def url(self, key: str) -> str:
        """Where the object lives, for people (file://... or s3://...)."""

    def upload(self, key: str, source: Readable) -> None:
        with self.open_write(key) as out:
            shutil.copyfileobj(source, out, 1024 * 1024)

    def download(self, key: str, target: BinaryIO) -> None:
        with self.open_read(key) as src:
            shutil.copyfileobj(src, target, 1024 * 1024)
