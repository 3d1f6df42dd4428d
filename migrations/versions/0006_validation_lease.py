"""validation lease: which validation run owns a `validating` job, and when it last made progress

Revision ID: 0007_validation_lease
Revises: 0002_request_tokens

File 0006_validation_lease.py is step 6 of the chain; its revision id stays 0007_validation_lease (deployed databases record it).
"""
from alembic import op
import sqlalchemy as sa


revision = "0007_validation_lease"
down_revision = "0002_request_tokens"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("validation_token", sa.String(32), nullable=True))
    op.add_column("jobs", sa.Column("validation_heartbeat_at", sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "validation_heartbeat_at")
    op.drop_column("jobs", "validation_token")
