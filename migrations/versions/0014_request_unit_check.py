"""a planned or running request names its unit (a CHECK constraint): a request once ended `planned` with no unit,
its job in_progress with nothing left to run; rows already in that state go back to pending first (the sweep
dispatches them again)

Revision ID: 0014_request_unit_check
Revises: 0013_eta_attention_sums
"""
from alembic import op


revision = "0014_request_unit_check"
down_revision = "0013_eta_attention_sums"
branch_labels = None
depends_on = None

CHECK = "status NOT IN ('planned', 'running') OR unit_id IS NOT NULL"  # models.OPEN_NEEDS_UNIT


def upgrade() -> None:
    op.execute("UPDATE requests SET status = 'pending', unit_pos = NULL "
               "WHERE status IN ('planned', 'running') AND unit_id IS NULL")
    with op.batch_alter_table("requests") as batch:  # SQLite adds a constraint by copying the table
        batch.create_check_constraint("ck_requests_open_has_unit", CHECK)


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_constraint("ck_requests_open_has_unit", type_="check")
