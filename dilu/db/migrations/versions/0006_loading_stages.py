"""Running estimates of each function version's loading stages.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "loading_stages",
        sa.Column("function", sa.String(63), sa.ForeignKey("functions.name", ondelete="CASCADE"), primary_key=True),
        sa.Column("version", sa.Integer, primary_key=True),
        sa.Column("stages", sa.JSON, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("loading_stages")
