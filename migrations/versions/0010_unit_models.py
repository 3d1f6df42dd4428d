"""unit models: the model a work unit runs on (a fleet serves several; a unit never mixes them)

Revision ID: 0010_unit_models
Revises: 0009_request_status_index
"""
from alembic import op
import sqlalchemy as sa


revision = "0010_unit_models"
down_revision = "0009_request_status_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL on units planned before: they ran on the one model the fleet had
    op.add_column("work_units", sa.Column("model", sa.String(128), nullable=True))


def downgrade() -> None:
    op.drop_column("work_units", "model")
