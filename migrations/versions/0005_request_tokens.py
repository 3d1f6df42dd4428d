"""per-request token counts (prompt, completion, cached), stored when a unit commits, so `status` sums
them in SQL instead of reading every unit's results file

Revision ID: 0002_request_tokens
Revises: 0006_webhooks

File 0005_request_tokens.py is step 5 of the chain; its revision id stays 0002_request_tokens (deployed databases record it).
"""
from alembic import op
import sqlalchemy as sa


revision = "0002_request_tokens"
down_revision = "0006_webhooks"
branch_labels = None
depends_on = None

COLUMNS = ("prompt_tokens", "completion_tokens", "cached_tokens")


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
