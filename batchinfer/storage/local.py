"""Storage in a local directory (the embedded default)."""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from batchinfer.storage.base import Storage


class LocalStorage(Storage):
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root.resolve() not in path.parents:
            raise ValueError(f"storage key escapes the root: {key!r}")
        return path

    @contextmanager
    def open_read(self, key: str):
        with open(self._path(key), "rb") as stream:
            yield stream

    @contextmanager
    def open_write(self, key: str):
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as stream:
                yield stream
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def size(self, key: str) -> int:
        return self._path(key).stat().st_size

    def url(self, key: str) -> str:
        return f"file://{self._path(key)}"
