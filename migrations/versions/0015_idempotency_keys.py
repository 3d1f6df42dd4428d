"""OpenAI's Batch API behaviours: idempotency keys of creates (batches and files), a batch that fails on a refused
body too (`strict`), and output and error files deleted by their owner while the batch keeps their ids

Revision ID: 0015_idempotency_keys
Revises: 0014_request_unit_check
"""
from alembic import op
import sqlalchemy as sa


revision = "0015_idempotency_keys"
down_revision = "0014_request_unit_check"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "idempotency_keys",
        sa.Column("owner_id", sa.String(64), primary_key=True),
        sa.Column("scope", sa.String(16), primary_key=True),
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("object_id", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("strict", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("output_deleted_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("error_deleted_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("error_deleted_at")
        batch.drop_column("output_deleted_at")
        batch.drop_column("strict")
    op.drop_table("idempotency_keys")
