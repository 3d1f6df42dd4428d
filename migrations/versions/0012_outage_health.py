"""outage health: a unit released while a service was down (which one, and how often: not failures), and one
row per service saying whether it is down (what status, the API and /metrics show)

Revision ID: 0012_outage_health
Revises: 0011_decode_sizes
"""
from alembic import op
import sqlalchemy as sa


revision = "0012_outage_health"
down_revision = "0011_decode_sizes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("work_units") as batch:
        batch.add_column(sa.Column("waiting_for", sa.String(16), nullable=True))
        batch.add_column(sa.Column("outage_releases", sa.Integer(), nullable=False, server_default="0"))
    op.create_table(
        "service_outages",
        sa.Column("service", sa.String(16), primary_key=True),
        sa.Column("down_since", sa.Float(), nullable=True),
        sa.Column("seen_at", sa.Float(), nullable=False),
        sa.Column("detail", sa.String(512), nullable=True),
        sa.Column("outages", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("released_units", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("down_s", sa.Float(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_table("service_outages")
    with op.batch_alter_table("work_units") as batch:
        batch.drop_column("outage_releases")
        batch.drop_column("waiting_for")
