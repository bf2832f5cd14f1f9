"""Initial schema: functions, workers, instances, scaling events.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "functions",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("source_dir", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("updated_at", TZ, nullable=False),
        sa.Column("requests_total", sa.BigInteger, nullable=False, server_default="0"),
    )
    op.create_table(
        "workers",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("url", sa.Text, nullable=True),
        sa.Column("device_kind", sa.String(8), nullable=False),
        sa.Column("device_uuid", sa.String(128), nullable=True),
        sa.Column("device_name", sa.String(255), nullable=True),
        sa.Column("memory_bytes", sa.BigInteger, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("last_seen", TZ, nullable=False),
    )
    op.create_table(
        "instances",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("function", sa.String(63), sa.ForeignKey("functions.name", ondelete="CASCADE"),
                  nullable=False, index=True),
        sa.Column("function_version", sa.Integer, nullable=False),
        sa.Column("worker_id", sa.String(128), nullable=False, index=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("endpoint", sa.Text, nullable=True),
        sa.Column("memory_bytes", sa.BigInteger, nullable=False),
        sa.Column("sm_request", sa.Float, nullable=True),
        sa.Column("sm_limit", sa.Float, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("ready_at", TZ, nullable=True),
        sa.Column("ended_at", TZ, nullable=True),
    )
    op.create_table(
        "scaling_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("function", sa.String(63), nullable=False, index=True),
        sa.Column("at", TZ, nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("instance_id", sa.String(64), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("scaling_events")
    op.drop_table("instances")
    op.drop_table("workers")
    op.drop_table("functions")
