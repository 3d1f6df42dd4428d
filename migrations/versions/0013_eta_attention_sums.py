"""attention sums: per model and machine, the decayed sums that price a step by its attention pairs (query
token, key) as well as its tokens (jobs.engine_rates); NULL on rows recorded before, which price as they did

Revision ID: 0013_eta_attention_sums
Revises: 0012_outage_health
"""
from alembic import op
import sqlalchemy as sa


revision = "0013_eta_attention_sums"
down_revision = "0012_outage_health"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("engine_rates") as batch:
        batch.add_column(sa.Column("attention_sums", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("engine_rates") as batch:
        batch.drop_column("attention_sums")
