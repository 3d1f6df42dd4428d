from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect

from batchinfer.db.models import Base, Job
from batchinfer.db.session import session_factory, transaction, upgrade


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_migrations_make_the_schema_on_postgres(postgres_url):
    assert _tables(postgres_url) == set()
    upgrade(postgres_url)
    assert _tables(postgres_url) == {"alembic_version", *Base.metadata.tables}


def test_migrations_match_the_models(postgres_url):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    upgrade(postgres_url)
    engine = create_engine(postgres_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


@pytest.mark.fast
def test_upgrade_twice_is_harmless_and_sqlite_works(tmp_path):
    url = f"sqlite:///{tmp_path}/sub/db.sqlite"
    upgrade(url)
    upgrade(url)
    factory = session_factory(url)
    with transaction(factory) as session:
        session.add(Job(id="batch_x", status="queued", model="m", completion_window_s=1.0, created_at=1.0,
                        expires_at=2.0))
    with factory() as session:
        job = session.get(Job, "batch_x")
    assert job.metadata_ == {} and job.completed == 0 and job.errors == []


@pytest.mark.fast
def test_a_current_database_skips_alembic_and_a_behind_one_is_upgraded(tmp_path):
    from alembic import command

    from batchinfer.db.session import alembic_config, is_current
    url = f"sqlite:///{tmp_path / 'c.db'}"
    assert not is_current(url)  # no alembic_version table yet
    upgrade(url)
    assert is_current(url)
    command.downgrade(alembic_config(url), "-1")  # one revision behind
    assert not is_current(url)
    upgrade(url)
    assert is_current(url)


def test_migration_heads_read_without_alembic_equal_alembics_heads():
    from alembic.script import ScriptDirectory

    from batchinfer.db.session import MIGRATIONS_DIR, migration_heads
    assert migration_heads() == set(ScriptDirectory(str(MIGRATIONS_DIR)).get_heads()) != set()


def test_run_start_up_on_a_current_database_never_imports_alembic(tmp_path):
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'd.db'}"
    upgrade(url)
    code = ("import sys; from batchinfer.db.session import upgrade; upgrade(sys.argv[1]); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))")
    out = subprocess.run([sys.executable, "-c", code, url], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


@pytest.mark.fast
def test_jobs_made_before_cache_scopes_get_their_keys_scope_or_the_local_one(tmp_path):
    from alembic import command
    from sqlalchemy import text

    from batchinfer.db.session import alembic_config
    url = f"sqlite:///{tmp_path / 'scopes.db'}"
    command.upgrade(alembic_config(url), "0007_validation_lease")
    engine = create_engine(url)
    with engine.begin() as conn:
        for job_id, owner in (("batch_api", "key_abc"), ("batch_cli", None)):
            conn.execute(text("INSERT INTO jobs (id, status, model, input_filename, metadata, skip_invalid, priority, "
                              "completion_window_s, total, completed, failed, invalid, prompt_tokens, "
                              "completion_tokens, cached_tokens, errors, error_count, created_at, expires_at, "
                              "finalize_attempts, owner_id) VALUES (:id, 'queued', 'm', '', '{}', 0, 0, 60, 0, 0, 0, "
                              "0, 0, 0, 0, '[]', 0, 0, 60, 0, :owner)"), {"id": job_id, "owner": owner})
    upgrade(url)
    with engine.connect() as conn:
        scopes = dict(conn.execute(text("SELECT id, cache_scope FROM jobs")).all())
    engine.dispose()
    assert scopes == {"batch_api": "key:key_abc", "batch_cli": "local"}


@pytest.mark.fast
def test_migration_files_sort_in_the_order_alembic_applies_them():
    from alembic.script import ScriptDirectory

    from batchinfer.db.session import MIGRATIONS_DIR

    script = ScriptDirectory(str(MIGRATIONS_DIR))
    chain = [Path(rev.path).name for rev in reversed(list(script.walk_revisions()))]  # base first
    assert chain == sorted(chain)
    assert len(chain) == len(set(name[:4] for name in chain))  # one file per step number
