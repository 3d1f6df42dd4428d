"""unit leases: the worker incarnation that runs a unit, when it was last sent, why a run failed;
finalize retries on jobs

Revision ID: 0003_unit_leases
Revises: 0001

File 0002_unit_leases.py is step 2 of the chain; its revision id stays 0003_unit_leases (deployed databases record it).
"""
from alembic import op
import sqlalchemy as sa


revision = "0003_unit_leases"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("work_units") as batch:
        batch.add_column(sa.Column("incarnation", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("dispatched_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("last_error", sa.String(length=1024), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("finalize_attempts", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("finalize_after", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("finalize_after")
        batch.drop_column("finalize_attempts")
    with op.batch_alter_table("work_units") as batch:
        batch.drop_column("last_error")
        batch.drop_column("dispatched_at")
        batch.drop_column("incarnation")
