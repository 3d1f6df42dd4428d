"""unit models: the model a work unit runs on (a fleet serves several; a unit never mixes them)

Revision ID: 0009_unit_models
Revises: 0008_live_progress
"""
from alembic import op
import sqlalchemy as sa


revision = "0009_unit_models"
down_revision = "0008_live_progress"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL on units planned before: they ran on the one model the fleet had
    op.add_column("work_units", sa.Column("model", sa.String(128), nullable=True))


def downgrade() -> None:
    op.drop_column("work_units", "model")
