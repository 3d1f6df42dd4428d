"""requests: the (job_id, status) index becomes (job_id, status, index), so a move of one request (job_id, index,
status in its current states) is a one-row lookup whichever index the planner picks. With (job_id, status) alone
and stale statistics (a job's rows just bulk-inserted, autovacuum not yet or never run), PostgreSQL picked that
index and filtered every pending row of the job for each move: 18 ms a request at 50,000, quadratic overall.

Revision ID: 0009_request_status_index
Revises: 0008_live_progress
"""
from alembic import op


revision = "0009_request_status_index"
down_revision = "0008_live_progress"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_requests_job_status", table_name="requests")
    op.create_index("ix_requests_job_status_index", "requests", ["job_id", "status", "index"])


def downgrade() -> None:
    op.drop_index("ix_requests_job_status_index", table_name="requests")
    op.create_index("ix_requests_job_status", "requests", ["job_id", "status"])
