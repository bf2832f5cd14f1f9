"""Profiles of function versions, and the role of an instance (serving or profiling).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "profiles",
        sa.Column("function", sa.String(63), sa.ForeignKey("functions.name", ondelete="CASCADE"), primary_key=True),
        sa.Column("version", sa.Integer, primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("sm_request", sa.Float, nullable=True),
        sa.Column("sm_limit", sa.Float, nullable=True),
        sa.Column("batch", sa.Integer, nullable=True),
        sa.Column("throughput_per_s", sa.Float, nullable=True),
        sa.Column("latency_s", sa.Float, nullable=True),
        sa.Column("meets_slo", sa.Boolean, nullable=True),
        sa.Column("trials", sa.Integer, nullable=False, server_default="0"),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    with op.batch_alter_table("instances") as batch:
        batch.add_column(sa.Column("role", sa.String(16), nullable=False, server_default="serve"))


def downgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("role")
    op.drop_table("profiles")
