"""A work unit's LoRA adapter: the adapter of the prefix group it routes by (NULL: the base's, or no group), shown
by a batch's prefix groups

Revision ID: 0019_unit_adapter
Revises: 0018_pause
"""
from alembic import op
import sqlalchemy as sa


revision = "0019_unit_adapter"
down_revision = "0018_pause"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("work_units") as batch:
        batch.add_column(sa.Column("adapter", sa.String(128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("work_units") as batch:
        batch.drop_column("adapter")
