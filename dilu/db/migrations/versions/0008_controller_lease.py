"""The controllers' lease (one leads, by term) and the term each instance and event was decided in.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06
"""
import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("holder", sa.String(200), nullable=False),
        sa.Column("term", sa.BigInteger, nullable=False),
        sa.Column("acquired_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )
    op.add_column("instances", sa.Column("term", sa.BigInteger, nullable=True))
    op.add_column("scaling_events", sa.Column("term", sa.BigInteger, nullable=True))


def downgrade() -> None:
    op.drop_column("scaling_events", "term")
    op.drop_column("instances", "term")
    op.drop_table("leases")
