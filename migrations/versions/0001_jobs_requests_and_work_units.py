"""jobs, requests and work units

Revision ID: 0001
Revises: 
Create Date: 2026-12-02 12:08:57.061721
"""
from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('jobs',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('model', sa.String(length=128), nullable=False),
    sa.Column('input_filename', sa.String(length=512), nullable=False),
    sa.Column('metadata', sa.JSON(), nullable=False),
    sa.Column('skip_invalid', sa.Boolean(), nullable=False),
    sa.Column('priority', sa.Integer(), nullable=False),
    sa.Column('completion_window_s', sa.Float(), nullable=False),
    sa.Column('total', sa.Integer(), nullable=False),
    sa.Column('completed', sa.Integer(), nullable=False),
    sa.Column('failed', sa.Integer(), nullable=False),
    sa.Column('invalid', sa.Integer(), nullable=False),
    sa.Column('prompt_tokens', sa.BigInteger(), nullable=False),
    sa.Column('completion_tokens', sa.BigInteger(), nullable=False),
    sa.Column('cached_tokens', sa.BigInteger(), nullable=False),
    sa.Column('errors', sa.JSON(), nullable=False),
    sa.Column('error_count', sa.Integer(), nullable=False),
    sa.Column('input_key', sa.String(length=512), nullable=True),
    sa.Column('output_key', sa.String(length=512), nullable=True),
    sa.Column('error_key', sa.String(length=512), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('expires_at', sa.Float(), nullable=False),
    sa.Column('queued_at', sa.Float(), nullable=True),
    sa.Column('in_progress_at', sa.Float(), nullable=True),
    sa.Column('finalizing_at', sa.Float(), nullable=True),
    sa.Column('completed_at', sa.Float(), nullable=True),
    sa.Column('failed_at', sa.Float(), nullable=True),
    sa.Column('expired_at', sa.Float(), nullable=True),
    sa.Column('cancelling_at', sa.Float(), nullable=True),
    sa.Column('cancelled_at', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_jobs_status'), ['status'], unique=False)

    op.create_table('work_units',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('queue', sa.String(length=256), nullable=False),
    sa.Column('prefix_key', sa.String(length=128), nullable=False),
    sa.Column('shared_prefix_len', sa.Integer(), nullable=False),
    sa.Column('num_requests', sa.Integer(), nullable=False),
    sa.Column('input_key', sa.String(length=512), nullable=False),
    sa.Column('result_key', sa.String(length=512), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('worker', sa.String(length=256), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('started_at', sa.Float(), nullable=True),
    sa.Column('finished_at', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('work_units', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_work_units_status'), ['status'], unique=False)

    op.create_table('requests',
    sa.Column('job_id', sa.String(length=64), nullable=False),
    sa.Column('index', sa.Integer(), nullable=False),
    sa.Column('line', sa.Integer(), nullable=False),
    sa.Column('custom_id', sa.String(length=512), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('unit_id', sa.String(length=64), nullable=True),
    sa.Column('unit_pos', sa.Integer(), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['unit_id'], ['work_units.id'], ),
    sa.PrimaryKeyConstraint('job_id', 'index')
    )
    with op.batch_alter_table('requests', schema=None) as batch_op:
        batch_op.create_index('ix_requests_job_status', ['job_id', 'status'], unique=False)
        batch_op.create_index('ix_requests_unit', ['unit_id', 'unit_pos'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('requests', schema=None) as batch_op:
        batch_op.drop_index('ix_requests_unit')
        batch_op.drop_index('ix_requests_job_status')

    op.drop_table('requests')
    with op.batch_alter_table('work_units', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_work_units_status'))

    op.drop_table('work_units')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_status'))

    op.drop_table('jobs')
