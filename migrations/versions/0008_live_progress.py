"""live progress: each running unit's finished requests per job (written at most once a second), and the
prefill and decode rates measured per model and machine (for estimates)

Revision ID: 0008_live_progress
Revises: 0008_cache_scopes
"""
from alembic import op
import sqlalchemy as sa


revision = "0008_live_progress"
down_revision = "0008_cache_scopes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "unit_progress",
        sa.Column("unit_id", sa.String(64), sa.ForeignKey("work_units.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("completed", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_tokens", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_unit_progress_job", "unit_progress", ["job_id"])
    op.create_table(
        "engine_rates",
        sa.Column("model", sa.String(128), primary_key=True),
        sa.Column("machine", sa.String(256), primary_key=True),
        sa.Column("prefill_tokens", sa.Float(), nullable=False),
        sa.Column("prefill_s", sa.Float(), nullable=False),
        sa.Column("decode_tokens", sa.Float(), nullable=False),
        sa.Column("decode_s", sa.Float(), nullable=False),
        sa.Column("decode_steps", sa.Float(), nullable=False),
        sa.Column("decode_tokens_sq", sa.Float(), nullable=False),
        sa.Column("decode_token_s", sa.Float(), nullable=False),
        sa.Column("units", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("engine_rates")
    op.drop_index("ix_unit_progress_job", "unit_progress")
    op.drop_table("unit_progress")
