"""decode step costs per class of batch size, beside the least-squares sums (estimates that follow where
a step's cost is not linear in its batch)

Revision ID: 0011_decode_sizes
Revises: 0010_unit_models
"""
from alembic import op
import sqlalchemy as sa


revision = "0011_decode_sizes"
down_revision = "0010_unit_models"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("engine_rates", sa.Column("decode_sizes", sa.JSON(), nullable=False, server_default="{}"))


def downgrade() -> None:
    op.drop_column("engine_rates", "decode_sizes")
