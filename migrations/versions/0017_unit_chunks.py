"""Chunked commits of a running unit (issue 41): each chunk of finished requests a unit's run committed behind the
unit's fence, with the results file that holds them (finalize reads these beside the unit's own results file)

Revision ID: 0017_unit_chunks
Revises: 0015_idempotency_keys
"""
from alembic import op
import sqlalchemy as sa


revision = "0017_unit_chunks"
down_revision = "0015_idempotency_keys"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "unit_chunks",
        sa.Column("unit_id", sa.String(64), sa.ForeignKey("work_units.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("attempt", sa.Integer(), primary_key=True),
        sa.Column("seq", sa.Integer(), primary_key=True),
        sa.Column("result_key", sa.String(512), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("committed_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("unit_chunks")
