"""webhooks: the outbox of batch events; a webhook URL, signing secret and admin flag per API key

Revision ID: 0006_webhooks
Revises: 0004_api_keys_files

File 0004_webhooks.py is step 4 of the chain; its revision id stays 0006_webhooks (deployed databases record it).
"""
from alembic import op
import sqlalchemy as sa


revision = "0006_webhooks"
down_revision = "0004_api_keys_files"
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
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("webhook_url", sa.String(2048), nullable=True))
        batch.add_column(sa.Column("webhook_secret", sa.String(128), nullable=True))
        batch.add_column(sa.Column("is_admin", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("is_admin")
        batch.drop_column("webhook_secret")
        batch.drop_column("webhook_url")
    op.drop_index("ix_webhook_events_due", "webhook_events")
    op.drop_table("webhook_events")
