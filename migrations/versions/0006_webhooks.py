"""webhooks: the outbox of batch events

Revision ID: 0006_webhooks
Revises: 0003_unit_leases
"""
from alembic import op
import sqlalchemy as sa


revision = "0006_webhooks"
down_revision = "0003_unit_leases"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "webhook_events",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("job_id", sa.String(64), nullable=False, unique=True),
        sa.Column("owner_id", sa.String(64), nullable=True),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("next_attempt_at", sa.Float(), nullable=False),
        sa.Column("delivered_at", sa.Float(), nullable=True),
        sa.Column("last_error", sa.String(512), nullable=True),
    )
    op.create_index("ix_webhook_events_due", "webhook_events", ["status", "next_attempt_at"])


def downgrade() -> None:
    op.drop_index("ix_webhook_events_due", "webhook_events")
    op.drop_table("webhook_events")
