"""cache scopes: an organization per API key, and the cache scope each job was created in

Revision ID: 0008_cache_scopes
Revises: 0007_validation_lease

File 0007_cache_scopes.py is step 7 of the chain; its revision id stays 0008_cache_scopes (deployed databases record it).
"""
from alembic import op
import sqlalchemy as sa


revision = "0008_cache_scopes"
down_revision = "0007_validation_lease"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("org", sa.String(64), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("cache_scope", sa.String(128), nullable=False, server_default="local"))
    # a job made through the API before scopes existed gets its key's own scope, as a new one would
    op.execute("UPDATE jobs SET cache_scope = 'key:' || owner_id WHERE owner_id IS NOT NULL")


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("cache_scope")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("org")
