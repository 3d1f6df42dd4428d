"""API keys (tenants), uploaded files, and the owner and input file of each job

Revision ID: 0004_api_keys_files
Revises: 0003_unit_leases

File 0003_api_keys_files.py is step 3 of the chain; its revision id stays 0004_api_keys_files (deployed databases record it).
"""
from alembic import op
import sqlalchemy as sa


revision = "0004_api_keys_files"
down_revision = "0003_unit_leases"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("revoked_at", sa.Float(), nullable=True),
    )
    op.create_table(
        "files",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("owner_id", sa.String(64), nullable=False),
        sa.Column("filename", sa.String(512), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("storage_key", sa.String(512), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("deleted_at", sa.Float(), nullable=True),
    )
    op.create_index("ix_files_owner_created", "files", ["owner_id", "created_at"])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("owner_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("input_file_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("endpoint", sa.String(64), nullable=True))
        batch.add_column(sa.Column("output_expires_after_s", sa.Float(), nullable=True))
        batch.create_index("ix_jobs_owner_created", ["owner_id", "created_at"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_owner_created")
        batch.drop_column("output_expires_after_s")
        batch.drop_column("endpoint")
        batch.drop_column("input_file_id")
        batch.drop_column("owner_id")
    op.drop_index("ix_files_owner_created", "files")
    op.drop_table("files")
    op.drop_table("api_keys")
