"""A batch its owner paused: when it was paused (the job's `<state>_at` of its `paused` status); the reasoning tokens
of a thinking model's outputs, counted into the batch's usage

Revision ID: 0018_pause
Revises: 0017_unit_chunks
"""
from alembic import op
import sqlalchemy as sa


revision = "0018_pause"
down_revision = "0017_unit_chunks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("paused_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("reasoning_tokens", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("reasoning_tokens")
        batch.drop_column("paused_at")
