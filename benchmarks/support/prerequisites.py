"""What a benchmark needs that this package cannot bring: a binary, a running server, an optional package. A
missing one ends the benchmark in one line naming it and how to get it (benchmarks/cli.py prints it)."""
from __future__ import annotations

import importlib.util
import shutil


class Missing(RuntimeError):
    """A benchmark's prerequisite is not installed, or not running; the message says which and how to get it."""


def binary(name: str, how: str) -> str:
    """The path of `name` on PATH."""
    found = shutil.which(name)
    if found is None:
        raise Missing(f"the `{name}` binary is not on PATH: {how}")
    return found


def module(name: str, how: str) -> None:
    if importlib.util.find_spec(name) is None:
        raise Missing(f"the Python package `{name}` is not installed: {how}")


def postgres(url: str) -> None:
    """The server of `url` answers (a benchmark makes its own database there)."""
    import psycopg  # lazy: psycopg, the benchmarks with services only

    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.OperationalError as exc:
        where = url.rsplit("@", 1)[-1]
        raise Missing(f"PostgreSQL does not answer at {where} ({str(exc).splitlines()[0][:160]}): start it, "
                      "or name another server with --postgres") from None
