"""Engines, sessions and schema migrations (Alembic is the only way the schema is made)."""
from __future__ import annotations

import ast
import logging
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from batchinfer.errors import BatchInferError

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
RETRY_ATTEMPTS = 8  # about 20 s of backoff: a database restart, a failover, a deadlock victim
log = logging.getLogger(__name__)
T = TypeVar("T")


_engines: dict[str, Engine] = {}


def get_engine(url: str) -> Engine:
    """One engine (connection pool) per URL per process."""
    if url not in _engines:
        _engines[url] = _create_engine(url)
    return _engines[url]


def _create_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        Path(url.split("///", 1)[1]).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True)


def dispose(url: str) -> None:
    engine = _engines.pop(url, None)
    if engine is not None:
        engine.dispose()


def dispose_all() -> None:
    """Close every engine's pooled connections (the CLI does at exit: it skips the interpreter's teardown)."""
    for url in list(_engines):
        dispose(url)


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def session_factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(get_engine(url), expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]):
    with factory() as session, session.begin():
        yield session


def is_transient_db(exc: BaseException) -> bool:
    """A lost connection, a restart, a deadlock or lock timeout: the same transaction may succeed later."""
    return isinstance(exc, (OperationalError, InterfaceError)) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated)


def retrying(factory: sessionmaker[Session], work: Callable[[Session], T], attempts: int = RETRY_ATTEMPTS,
             base_delay_s: float = 0.2) -> T:
    """Run one short transaction, again from the start after a transient fault (with backoff)."""
    for attempt in range(attempts):
        try:
            with transaction(factory) as session:
                return work(session)
        except DBAPIError as exc:
            if attempt == attempts - 1 or not is_transient_db(exc):
                raise
            delay = min(base_delay_s * 2 ** attempt, 5.0)
            log.warning("database: %s; retrying in %.1f s", str(exc.orig or exc).splitlines()[0][:200], delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def alembic_config(url: str):
    from alembic.config import Config  # lazy: alembic (a third of a second), only to migrate

    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise BatchInferError(f"no Alembic migrations at {MIGRATIONS_DIR}: install from a checkout with pip install -e .")
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    if url.startswith("sqlite"):
        get_engine(url)  # creates the data directory
    if revision == "head" and is_current(url):
        return  # the common start-up case: Alembic is not even imported
    from alembic import command  # lazy: alembic, only when the schema is behind

    command.upgrade(alembic_config(url), revision)


def is_current(url: str) -> bool:
    """The stored alembic revision is the head: read one row and the version files' ids, nothing more."""
    try:
        with get_engine(url).connect() as conn:
            stored = {row[0] for row in conn.execute(text("SELECT version_num FROM alembic_version"))}
    except SQLAlchemyError:
        return False  # no table yet: a new database
    return bool(stored) and stored == migration_heads()


def migration_heads() -> set[str]:
    """The head revisions, read from the version files' `revision` / `down_revision` assignments (what Alembic
    reads) without importing Alembic, which costs a third of a second at every start."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in (MIGRATIONS_DIR / "versions").glob("*.py"):
        fields = _assignments(path, ("revision", "down_revision"))
        if "revision" in fields:
            revisions.add(fields["revision"])
            down = fields.get("down_revision")
            parents.update(down if isinstance(down, (tuple, list)) else [down] if down else [])
    return revisions - parents


def _assignments(path: Path, names: tuple[str, ...]) -> dict:
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id in names:
            found[target.id] = ast.literal_eval(value)
    return found
